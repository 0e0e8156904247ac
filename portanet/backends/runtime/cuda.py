"""The CUDA runtime (pycuda): `Runtime`'s verbs on a device's primary context and one
stream. Kernels are built once per process for the GPU's own architecture (cubins.py: by
NVRTC or nvcc, the binaries kept on disk by source, options, architecture and compiler)
and launched as prepared calls; a recorded step is a CUDA graph (`_Replay`), made through
the driver's own calls (pycuda has no graph API). `_ContextLock` makes the context current
in the thread that holds the backend's lock."""
import atexit
import contextlib
import ctypes
import functools
import threading

import numpy as np

from ... import config
from ...errors import DeviceError, OutOfMemoryError
from .. import sources
from ..arrays import DeviceArray
from ..staging import BEHIND, CopyLane
from . import Recorded, Runtime, cubins, default_local
from .builds import in_threads

try:
    import pycuda.driver as drv
except ImportError:
    drv = None

_ARG_CODES = {np.uintp: "P", np.int32: "i", np.float32: "f", np.float64: "d"}


class _CopyLane(CopyLane):
    """The copy lane (staging.py) on a stream for copies beside the backend's own."""

    def __init__(self):
        super().__init__()
        self.stream = drv.Stream()

    def _pin(self, part, dtype):
        host = drv.pagelocked_empty(part.size, dtype)
        return host, host

    def _wait(self, event):
        event.synchronize()

    def _copy_up(self, host, address, after):
        if after is not None:
            self.stream.wait_for_event(after)
        drv.memcpy_htod_async(address, host, self.stream)
        copied = drv.Event()
        copied.record(self.stream)
        return copied


class CudaRuntime(Runtime):
    """`Runtime` on a CUDA device: its primary context (`context`, current in the thread
    that holds `lock`), one stream (`stream`), the modules built there, the prepared
    functions and a copy lane (made by the first `send`)."""

    def __init__(self, backend, device):
        """The device's primary context (one context per process, shared with other
        libraries such as PyTorch) for `backend`, made current in each thread by `lock`,
        which becomes the backend's; `start` (with the lock held) makes the rest."""
        self.backend, self.name, self.dtype = backend, backend.name, backend.dtype
        self.device = device
        self.context = self.device.retain_primary_context()
        self.lock = _ContextLock(self.context)

    def start(self):
        """What needs the context current: the stream, the device's figures, the caches."""
        self.stream = drv.Stream()
        self._lane = None               # made by the first write_samples
        self.cc = cc = self.device.compute_capability()
        self.arch = f"sm_{cc[0]}{cc[1]}"
        self.attributes = attrs = self.device.get_attributes()
        self.max_threads = attrs[drv.device_attribute.MAX_THREADS_PER_BLOCK]
        self.options = []               # the backend's build options
        self.driver = drv.get_driver_version()      # NVRTC's CUDA must not be newer
        self._modules, self._functions = {}, {}
        self._prepared = {}

    @property
    def cache_dir(self):
        """Where the binaries go (cubins.py: keyed by source, options, architecture and
        compiler)."""
        return config.cache_dir() / "kernels-cuda"

    def device_id(self):
        return (self.device.name(), self.arch, drv.get_driver_version(), self.options)

    def kernel(self, family, name, options=(), arch=None):
        """One function object per kernel and build: pycuda's get_function makes a new one
        each call, which `launch` would prepare again and keep (mma.cu's and kmajor16's
        callers ask for theirs at every product)."""
        key = (family, name, tuple(options), arch)
        if key not in self._functions:
            self._functions[key] = self._module(family, options, arch).get_function(name)
        return self._functions[key]

    def _module(self, family, extra=(), arch=None, binary=None):
        """A family built for the GPU's architecture, or for `arch` (wgmma.cu: sm_90a,
        Hopper's own instructions); from `binary` where build_many made it."""
        arch = arch or self.arch
        key = (family, tuple(extra), arch)
        if key not in self._modules:
            self._modules[key] = drv.module_from_buffer(
                binary if binary is not None else self._cubin(family, extra, arch))
        return self._modules[key]

    def _cubin(self, family, extra, arch):
        path, text = sources.load(family, "cu")
        return cubins.cubin(text, self.options + list(extra), arch, self.cache_dir, str(path),
                            driver=self.driver)

    def build_many(self, builds, done=None, threads=None):
        """Build the families `builds` ((family, options, arch) each, arch None for the
        GPU's own) several at once: NVRTC (or nvcc's processes) in `threads` threads, the
        GIL let go, each binary also kept on disk (cubins.py); `_module` then loads each in
        this thread (the context current: run it holding the backend's lock); done(build)
        once each is loaded. A failed build raises its KernelBuildError here once the
        others have finished."""
        builds = list(builds)
        made = [b for b in builds if self.built(*b)]
        for build in made if done is not None else ():
            done(build)
        binaries = {}

        def compile_one(build):
            family, extra, arch = build
            binaries[id(build)] = self._cubin(family, extra, arch or self.arch)

        def load(build):
            self._module(*build, binary=binaries.pop(id(build)))
            if done is not None:
                done(build)
        in_threads([b for b in builds if b not in made], compile_one, load, threads)

    def built(self, family, options, arch=None):
        return (family, tuple(options), arch or self.arch) in self._modules

    # -- launches ------------------------------------------------------------------------

    def launch(self, kernel, global_size, local_size, args):
        """OpenCL's global/local sizes in work-items -> CUDA's grid/block, launched as a
        prepared call (argument types fixed on first use: much less Python per launch)."""
        if local_size is None:
            local_size = default_local(global_size, self.max_threads)
        block = tuple(local_size) + (1,) * (3 - len(local_size))
        grid = tuple(-(-g // b) for g, b in zip(global_size, block)) + (1,) * (2 - len(global_size))
        if id(kernel) not in self._prepared:     # kept alive there, so ids are not reused
            kernel.prepare("".join(_ARG_CODES[type(a)] for a in args))
            self._prepared[id(kernel)] = kernel
        kernel.prepared_async_call(grid, block, self.stream, *args)

    @staticmethod
    def pointer(x):
        return np.uintp(int(x.buf))

    # -- memory --------------------------------------------------------------------------

    def empty(self, shape, dtype=None, label="buffer"):
        dtype = np.dtype(dtype or self.dtype)
        shape = (shape,) if np.isscalar(shape) else tuple(shape)
        nbytes = int(np.prod(shape)) * dtype.itemsize
        try:
            buf = drv.mem_alloc(max(nbytes, dtype.itemsize))
        except drv.MemoryError as e:
            free, total = drv.mem_get_info()
            raise OutOfMemoryError(self.backend._oom_text(label, shape, nbytes, free,
                                                          total)) from e
        return self.backend._track(DeviceArray(buf, 0, shape, dtype), nbytes, buf)

    def write(self, dst, host, wait=True):
        """In stream order; from pageable memory the driver copies host into its own staging
        before returning (so host may change at once), and the device does not wait."""
        host = self.backend._check_write(dst, host)
        drv.memcpy_htod_async(self.address(dst), host, self.stream)

    def send(self, slot, part, turn):
        """part into the device array slot on the copy stream, from a pinned buffer (the
        host memcpy, then a copy the device runs beside its kernels), once the device has
        read what the last send of this turn put there; the backend's stream waits for it."""
        lane = self._lane
        if lane is None:
            lane = self._lane = _CopyLane()
        after = lane.read[turn]
        if after is BEHIND:                 # a plain write used the half last: all before now
            after = self.marker()
        self.stream.wait_for_event(lane.send(part, self.address(slot), slot.dtype, after))

    def laid_out(self, turn, laned):
        """After the launches that read a half of staging: what the lane waits for before
        it writes there again (an event; BEHIND after a plain write, to be made then)."""
        if self._lane is not None:
            self._lane.read[turn] = self.marker() if laned else BEHIND

    def download(self, x):
        host = np.empty(x.shape, x.dtype)
        drv.memcpy_dtoh_async(host, self.address(x), self.stream)
        self.stream.synchronize()
        return host

    def download_into(self, x, out):
        """In the background where out is pinned (host_empty); into pageable memory the
        driver returns only once the copy is done."""
        drv.memcpy_dtoh_async(self.backend._check_download(x, out), self.address(x), self.stream)

    def fetch(self, x, out):
        self.download_into(x, out)
        return self.marker()

    def landed(self, ticket):
        """From any thread, without the lock: the context made current here for the wait
        alone (a context may be current in several threads; pycuda's stack is per thread,
        and a thread must not end with it pushed)."""
        self.context.push()
        try:
            ticket.synchronize()
        finally:
            drv.Context.pop()

    def host_empty(self, shape, dtype=None):
        """A host array in pinned memory, which the device copies into fastest."""
        return drv.pagelocked_empty(shape, dtype or self.dtype)

    def host_pin(self, array):
        """array's pages registered with the driver (page-locked, for every context) until
        host_unpin(array)."""
        _check(_driver().cuMemHostRegister_v2(array.ctypes.data, array.nbytes, 1),
               f"pin {array.nbytes} bytes of host memory")      # 1: CU_MEMHOSTREGISTER_PORTABLE
        return array

    def host_unpin(self, array):
        _check(_driver().cuMemHostUnregister(array.ctypes.data), "unpin host memory")

    @staticmethod
    def free_buffer(buf):
        buf.free()

    def synchronize(self):
        self.stream.synchronize()

    # -- whole-step graphs ---------------------------------------------------------------

    def capture(self, work):
        """work() recorded once as a CUDA graph on the backend's stream, returned as a
        callable that replays it (one launch instead of one per kernel). The launches of
        work must not synchronise or allocate: the network captures a step only after the
        same step ran once eagerly (kernels built, GEMM routed, workspaces grown). Held
        under the backend's lock, so no other thread's launch joins the graph. pycuda has
        no graph API: these are the driver's own calls, through ctypes."""
        lib, stream = _driver(), ctypes.c_void_p(self.stream.handle)
        _check(lib.cuStreamBeginCapture_v2(stream, CAPTURE_MODE_RELAXED), "begin capture")
        graph = ctypes.c_void_p()
        try:
            work()
        finally:
            ended = lib.cuStreamEndCapture(stream, ctypes.byref(graph))
        _check(ended, "end capture")
        runnable = ctypes.c_void_p()
        try:
            _check(lib.cuGraphInstantiateWithFlags(ctypes.byref(runnable), graph, 0),
                   "instantiate the graph")
        finally:
            lib.cuGraphDestroy(graph)
        return _Replay(self.backend, self, runnable)

    # -- a lane beside the stream (the NCCL engine's all-reduces) ---------------------------

    @staticmethod
    def lane():
        """(a second stream of the context, an event for `hand_over`): work beside the
        backend's own stream, ordered with it by hand_over."""
        return drv.Stream(), drv.Event(drv.event_flags.DISABLE_TIMING)

    @staticmethod
    def hand_over(source, target, event):
        """target's later work waits for what source holds now (event recorded on source;
        in a capture, an edge of the graph that brings target into it). Reusing one event
        is safe: a wait takes the event as it is when it is enqueued."""
        event.record(source)
        target.wait_for_event(event)

    # -- profiles (portanet/profiler.py) ---------------------------------------------------

    def profiling(self):
        return contextlib.nullcontext()     # CUDA events time any stream

    def marker(self):
        event = drv.Event()
        event.record(self.stream)
        return event

    @staticmethod
    def elapsed(start, end):
        end.synchronize()
        return end.time_since(start) * 1e-3

    def memory_info(self):
        return drv.mem_get_info()           # the driver's numbers: other processes count

    @staticmethod
    def address(x):
        """x's first element's device address (cuBLAS, copies, DLPack)."""
        return int(x.buf) + x.offset * x.dtype.itemsize


CAPTURE_MODE_RELAXED = 2    # CU_STREAM_CAPTURE_MODE_RELAXED: other threads' calls unaffected


@functools.lru_cache(maxsize=None)
def _driver():
    """The driver's calls that pycuda does not give (or, for cuMemHostRegister, gives only
    through a NumPy path that fails on NumPy 2), through ctypes."""
    lib = ctypes.CDLL("libcuda.so.1")
    p = ctypes.c_void_p
    for name, args in (("cuMemHostRegister_v2", [p, ctypes.c_size_t, ctypes.c_uint]),
                       ("cuMemHostUnregister", [p]),
                       ("cuStreamBeginCapture_v2", [p, ctypes.c_int]),
                       ("cuStreamEndCapture", [p, ctypes.POINTER(p)]),
                       ("cuGraphInstantiateWithFlags", [ctypes.POINTER(p), p, ctypes.c_ulonglong]),
                       ("cuGraphLaunch", [p, p]), ("cuGraphDestroy", [p]),
                       ("cuGraphExecDestroy", [p])):
        getattr(lib, name).argtypes, getattr(lib, name).restype = args, ctypes.c_int
    return lib


def _check(result, what):
    if result != 0:
        raise DeviceError(f"CUDA could not {what} (CUresult {result})")


class _Replay(Recorded):
    """A captured graph: calling it launches the whole of it on the backend's stream."""

    def __init__(self, backend, runtime, runnable):
        super().__init__(backend)
        self.runtime, self.runnable = runtime, runnable

    def __call__(self):
        rt = self.runtime
        with rt.lock:
            _check(_driver().cuGraphLaunch(self.runnable, ctypes.c_void_p(rt.stream.handle)),
                   "launch a graph")

    def __del__(self):
        try:
            with self.runtime.lock:
                _driver().cuGraphExecDestroy(self.runnable)
        except Exception:       # the process is ending; the driver frees it
            pass


class _ContextLock:
    """A CudaBackend's lock (Backend.serialised), which also makes the context current in
    the thread that holds it: pycuda's current context is per thread. The main thread
    pushes it once and keeps it until exit, as the creating thread always did. Any other
    thread pushes it when it takes the lock and pops it when it lets go, because a thread
    that ends with a context on pycuda's stack aborts the process ("PyCUDA ERROR: The
    context stack was not empty upon module cleanup"), and the lock cannot know when a
    thread of the user's ends."""

    def __init__(self, context):
        self._lock = threading.RLock()
        self._context = context
        self._main = threading.main_thread().ident
        self._main_has_it = False
        self._depth = 0             # nesting in the holding thread (only it changes these)
        self._pushed = False        # whether the holding thread pushed at depth 0

    def __enter__(self):
        self._lock.acquire()
        if self._depth == 0 and (threading.get_ident() != self._main or not self._main_has_it):
            try:
                self._context.push()
            except BaseException:
                self._lock.release()
                raise
            if threading.get_ident() == self._main:
                atexit.register(_pop, self._context)
                self._main_has_it = True
            else:
                self._pushed = True
        self._depth += 1
        return self

    def __exit__(self, *exc):
        self._depth -= 1
        try:
            if self._depth == 0 and self._pushed:
                self._pushed = False
                drv.Context.pop()
        finally:
            self._lock.release()


def _pop(context):
    try:
        context.pop()
    except Exception:       # the process is ending; the driver cleans up
        pass

