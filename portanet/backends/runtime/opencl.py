"""The OpenCL runtime (pyopencl): `Runtime`'s verbs on one context and in-order queue, for
every OpenCL device portanet runs on (AMD, Intel, NVIDIA GPUs, PoCL and Intel's CPU
runtimes, the Oclgrind simulator). Launches are enqueued with their arguments bound once per
call site; a recorded step is its launches enqueued again (`_HostReplay`)."""
import collections
import contextlib
import ctypes
import functools
import gc
import logging
import os
import threading
import warnings
from pathlib import Path

import numpy as np

from ...errors import DeviceError, KernelBuildError, OutOfMemoryError
from ... import config
from .. import sources
from ..arrays import DeviceArray
from ..staging import BEHIND, CopyLane
from . import Recorded, Runtime, default_local
from .builds import in_threads as _in_threads

log = logging.getLogger("portanet")

try:
    import pyopencl as cl
except ImportError:
    cl = None


class _CopyLane(CopyLane):
    """The copy lane (staging.py) on a second queue, its pinned buffers allocated by the
    driver and mapped once."""

    def __init__(self, ctx):
        super().__init__()
        self.ctx, self.queue = ctx, cl.CommandQueue(ctx)

    def _pin(self, part, dtype):
        buf = cl.Buffer(self.ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR,
                        part.nbytes)
        host, _ = cl.enqueue_map_buffer(self.queue, buf, cl.map_flags.WRITE, 0,
                                        (part.size,), dtype)
        return buf, host

    def _wait(self, event):
        event.wait()

    def _copy_up(self, host, slot, after):
        copied = cl.enqueue_copy(
            self.queue, slot.buf, host, dst_offset=slot.offset * slot.dtype.itemsize,
            is_blocking=False, wait_for=None if after is None else [after])
        self.queue.flush()          # submitted now: the other queue's barrier waits for it
        return copied


BOUND_KERNELS = 4096        # kernel objects with bound arguments kept (see OpenCLRuntime.launch)
PENDING_COPIES = 8          # background copies in flight before the oldest is waited for


class _NotRecordable(Exception):
    """Raised inside capture() by an operation that a replayed list cannot repeat."""


class _HostReplay(Recorded):
    """A recorded step: its launches enqueued again, in order, on the backend's queue.
    Where the OpenCL library pyopencl loaded can be called directly (`_enqueue_api`), each
    launch is one clEnqueueNDRangeKernel with its arguments converted to C once and no
    event: pyopencl's enqueue makes an Event object (and the driver a cl_event) per launch,
    which nothing here waits on."""

    def __init__(self, backend, runtime, ops):
        super().__init__(backend)
        self.runtime, self.ops = runtime, ops
        self.enqueue = _enqueue_api(typed=False)
        if self.enqueue is not None:
            self.ops = [_Launch(*op) if isinstance(op, tuple) else op for op in ops]

    def __call__(self):
        rt = self.runtime
        with rt.lock:
            queue = rt.queue
            if self.enqueue is None:
                for op in self.ops:
                    if isinstance(op, tuple):
                        cl.enqueue_nd_range_kernel(queue, *op)
                    else:
                        op(queue)
                return
            enqueue, handle = self.enqueue, ctypes.c_void_p(queue.int_ptr)
            for op in self.ops:
                if isinstance(op, _Launch):
                    status = enqueue(handle, *op.args)
                    if status:
                        raise DeviceError(
                            f"replaying a recorded step on {rt.name}: clEnqueueNDRangeKernel "
                            f"of {op.kernel.function_name} failed with "
                            f"{_status_name(status)}; PORTANET_GRAPHS=off runs steps eagerly")
                else:
                    op(queue)


class _Launch:
    """A recorded launch as clEnqueueNDRangeKernel takes it after the queue, each argument
    already its C type: the kernel's handle (the kernel object kept alive with it), the
    dimensions, no offset, the sizes as size_t arrays, no wait list and no event. (Made
    once, they spare each replayed launch ctypes's conversion of nine arguments: 0.85 us a
    call against 0.41 on a 2-core host.)"""

    def __init__(self, kernel, global_size, local_size):
        dims = len(global_size)
        self.kernel = kernel
        self.args = (ctypes.c_void_p(kernel.int_ptr), ctypes.c_uint32(dims), None,
                     (ctypes.c_size_t * dims)(*global_size),
                     (ctypes.c_size_t * dims)(*local_size), ctypes.c_uint32(0), None, None)


@functools.lru_cache(maxsize=None)
def _enqueue_api(typed=True):
    """clEnqueueNDRangeKernel of the OpenCL library pyopencl loaded (Linux: found in the
    process's memory map); None where it cannot be found (other systems; replays then
    enqueue through pyopencl). Typed, it converts Python ints (handles, sizes) itself; else
    each argument must already be its C type (a ctypes object, an array or None)."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as f:
            paths = [line.split()[-1] for line in f if "libOpenCL" in line]
        # a fresh CDLL, so a function object of its own: the typed and untyped variants'
        # argtypes stay apart
        function = ctypes.CDLL(paths[0]).clEnqueueNDRangeKernel
    except (OSError, IndexError, AttributeError):
        return None
    function.restype = ctypes.c_int32
    if typed:
        function.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint32,
                             ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                             ctypes.c_uint32, ctypes.c_void_p, ctypes.c_void_p]
    return function


def _status_name(status):
    """'CL_OUT_OF_RESOURCES (-5)': an OpenCL error code's name, from pyopencl's table."""
    names = {v: k for k, v in vars(cl.status_code).items() if isinstance(v, int)}
    return f"CL_{names[status]} ({status})" if status in names else f"error {status}"



@contextlib.contextmanager
def _compiler_chatter(name, what="kernels"):
    """Compiler warnings raised inside (pyopencl's CompilerWarning: a driver's remarks on a
    build that succeeded) go to the debug log; any other warning is shown as usual."""
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always", cl.CompilerWarning)
        yield
    for w in said:
        if issubclass(w.category, cl.CompilerWarning):
            log.debug("%s, building %s: %s", name, what, w.message)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


class OpenCLRuntime(Runtime):
    """`Runtime` on an OpenCL device: its context (`ctx`), its in-order queue (`queue`, a
    profiling one while `profiling`), the programs built there, the kernels bound to their
    arguments, a copy lane (made by the first `send`) and the state of a capture."""

    def __init__(self, backend, platform, device, limits, simulator):
        """A context and queue on `device` (a pyopencl Device of `platform`) for `backend`,
        its launches held to `limits` (opencl_devices.Limits); simulator: Oclgrind, whose
        partial writes and freed buffers are handled apart (`_write_part`, `free_buffer`)."""
        self.backend, self.name, self.lock = backend, backend.name, backend._lock
        self.dtype = backend.dtype               # empty's default
        self.platform, self.device = platform, device
        self.limits, self.simulator = limits, simulator
        self.ctx = cl.Context([self.device])
        self.queue = cl.CommandQueue(self.ctx)
        self.options = []                       # the backend's build options
        self._programs = {}
        self._building, self._building_lock = {}, threading.Lock()  # per-key build locks
        self._batch = False                     # build_many's threads are building
        self._bound, self._wrappers = {}, {}    # see launch and OpenCLBackend._wrapper
        self._checked = set()                   # (kernel, group) held to the limits
        self._recording = None                  # a list while capture() records
        self._pending = collections.deque()     # background copies' events (_pending_copy)
        self._lane = None                       # made by the first write_samples
        self._retired = []                      # freed buffers the simulator keeps
        self._scratch = None                    # the simulator's partial writes (_write_part)

    @property
    def cache_dir(self):
        """Where this device's compiled programs are kept: the driver's own cache where it
        keeps one, which pyopencl then leaves the caching to (NVIDIA's: $CUDA_CACHE_PATH,
        else ~/.nv/ComputeCache; PoCL's: $POCL_CACHE_DIR, else its folder in the user's
        cache), else the folder pyopencl writes the binaries to under portanet's cache."""
        from pyopencl.characterize import nv_compute_capability
        if nv_compute_capability(self.device) is not None:
            return Path(os.environ.get("CUDA_CACHE_PATH") or Path.home() / ".nv" / "ComputeCache")
        if self.device.platform.name == "Portable Computing Language":
            return Path(os.environ.get("POCL_CACHE_DIR")
                        or config.cache_dir().parent / "pocl" / "kcache")
        return self._binaries

    @property
    def _binaries(self):
        """The folder pyopencl keeps binaries in (where the driver keeps none itself)."""
        return config.cache_dir() / f"kernels-{self.backend.kind}"

    # -- programs ------------------------------------------------------------------------

    def check_compiler(self):
        """Refuse, as an unusable device, one whose compiler builds nothing here: a CPU
        runtime whose LLVM predates the host processor (PoCL 3.0 on AMD's Zen 5 says
        "unknown target CPU 'generic'") fails every kernel, so it is not a device to offer.
        One empty kernel, built once per device and options (the driver caches it)."""
        try:
            with warnings.catch_warnings():     # drivers chatter on success (see program)
                warnings.simplefilter("ignore", cl.CompilerWarning)
                cl.Program(self.ctx, "__kernel void portanet_probe(void) {}").build(
                    options=self.options, cache_dir=str(self._binaries))
        except cl.Error as e:
            lines = [l.strip() for l in str(e).splitlines() if "error" in l.lower()]
            said = (lines[-1] if lines else " ".join(str(e).split()))[:300]
            raise DeviceError(
                f"{self.name} ({self.device.name.strip()}, {self.platform.name.strip()}) "
                f"cannot build any kernel here: its compiler says {said!r}. Its runtime "
                f"does not support this machine (a CPU runtime older than the processor, a "
                f"broken install); use another device (portanet devices lists them) or "
                f"install a newer build of this runtime") from e

    def kernel(self, family, name, options=()):
        return cl.Kernel(self.program(family, options), name)

    def program(self, family, extra=()):
        """Build once per context and options; pyopencl caches binaries on disk keyed by
        source, options, device and driver (PoCL keeps what it compiles per work-group size
        in its own cache). Safe from several threads: one build per key, the others wait
        for it."""
        key = (family, tuple(extra))
        program = self._programs.get(key)
        if program is None:
            with self._building_lock:
                building = self._building.setdefault(key, threading.Lock())
            with building:
                program = self._programs.get(key)
                if program is None:
                    # drivers chatter on success (Intel's: "Compilation started",
                    # vectorisation remarks), which pyopencl turns into warnings: kept for
                    # the debug log (warnings' filters are the process's: a batch of
                    # threaded builds catches them once, in `build_many`'s thread)
                    if self._batch:
                        program = self._build_program(family, extra)
                    else:
                        with _compiler_chatter(self.name, f"{family}.cl"):
                            program = self._build_program(family, extra)
                    self._programs[key] = program
        return program

    def _build_program(self, family, extra):
        path, text = sources.load(family, "cl")
        try:
            return cl.Program(self.ctx, text).build(
                options=self.options + list(extra), cache_dir=str(self._binaries))
        except cl.RuntimeError as e:
            raise KernelBuildError(f"{path} failed to build for {self.device.name} with "
                                   f"options {self.options + list(extra)}:\n{e}") from e

    def built(self, family, options, arch=None):
        return (family, tuple(options)) in self._programs

    def build_many(self, builds, done=None, threads=None):
        """Build the programs `builds` ((family, options, arch) each; arch unused here),
        each once; done(build) is called in this thread as each is ready. On a GPU several
        at once in `threads` threads (pyopencl lets the GIL go while the driver compiles);
        one after another on a CPU runtime, where threads gained nothing (Intel's compiles
        one program at a time in a process), and on the simulator, which is not safe from
        several threads (Oclgrind crashed building two programs at once). A failed build
        raises its KernelBuildError here once the others have finished."""
        if not self.backend.is_gpu or self.simulator:
            threads = 1
        builds = list(builds)
        made = [b for b in builds if self.built(*b)]
        for build in made if done is not None else ():
            done(build)
        with _compiler_chatter(self.name):
            self._batch = True
            try:
                _in_threads([b for b in builds if b not in made],
                            lambda b: self.program(b[0], b[1]), done, threads)
            finally:
                self._batch = False

    def launch(self, kernel, global_size, local_size, args):
        """Enqueue with arguments bound once per call site: setting them is what costs
        (52 us per launch through Kernel.__call__ on PoCL, 2 us to enqueue a kernel whose
        arguments are set), and a training step repeats the same launches with the same
        buffers, offsets and scalars at every step. So each distinct argument list gets
        its own kernel object with the arguments set; buffers are keyed by handle, and the
        cache is emptied when a buffer is freed (a new one may reuse the handle)."""
        if local_size is None:
            local_size = default_local(global_size, self.limits.work_group)
        global_size = tuple(-(-g // w) * w for g, w in zip(global_size, local_size))
        key = (kernel, *(a.int_ptr if isinstance(a, cl.Buffer) else a for a in args))
        bound = self._bound.get(key)
        try:
            if bound is None:
                if len(self._bound) >= BOUND_KERNELS:      # dropout's key changes every step
                    self._bound.clear()
                if (kernel, local_size) not in self._checked:
                    self._check_launch(kernel, local_size)
                    self._checked.add((kernel, local_size))
                bound = cl.Kernel(kernel.program, kernel.function_name)
                bound.set_args(*args)
                self._bound[key] = bound
            if self._recording is not None:
                self._recording.append((bound, global_size, local_size))
            else:
                cl.enqueue_nd_range_kernel(self.queue, bound, global_size, local_size)
        except (cl.MemoryError, cl.RuntimeError) as e:
            # drivers allocate lazily: CL_MEM_OBJECT_ALLOCATION_FAILURE / CL_OUT_OF_RESOURCES
            # can surface at the first launch that touches a buffer
            if e.code not in (cl.status_code.MEM_OBJECT_ALLOCATION_FAILURE,
                              cl.status_code.OUT_OF_RESOURCES):
                raise
            dev = self.device
            raise OutOfMemoryError(
                f"{kernel.function_name} on {dev.name}: the device ran out of memory or "
                f"resources ({e}); {self.backend.allocated_bytes / 2**20:.0f} MiB of "
                f"{dev.global_mem_size / 2**20:.0f} MiB are allocated by portanet: use a "
                f"smaller batch or network") from e

    def _check_launch(self, kernel, local_size):
        """Hold a launch to the limits (capped or not): a work-group or local-memory
        footprint that PoCL or NVIDIA accept but an AMD, Intel or mobile GPU refuses fails
        here, on every device, with what to change. The kernel's own group limit (its
        registers) is the driver's, and holds under any cap."""
        lim, name = self.limits, kernel.function_name
        threads = int(np.prod(local_size))
        info = cl.kernel_work_group_info
        own = kernel.get_work_group_info(info.WORK_GROUP_SIZE, self.device)
        local = kernel.get_work_group_info(info.LOCAL_MEM_SIZE, self.device)
        problems = []
        if threads > min(lim.work_group, own):
            problems.append(f"{threads} work-items per group, over the "
                            f"{min(lim.work_group, own)} allowed")
        if any(w > m for w, m in zip(local_size, lim.work_items)):
            problems.append(f"a group of {tuple(local_size)}, over {lim.work_items} per "
                            f"dimension")
        if local > lim.local_bytes:
            problems.append(f"{local} bytes of local memory, over the {lim.local_bytes}")
        if problems:
            raise KernelBuildError(
                f"{name} on {self.device.name.strip()} (limits: {lim.profile}) would use "
                + " and ".join(problems) + ": its parameters must derive from the limits "
                "(a bug in portanet: please report it with this message)")

    def device_id(self):
        dev, pl = self.device, self.platform
        return (pl.name, pl.version, dev.name, dev.version, dev.driver_version, self.options)

    @staticmethod
    def pointer(x):
        return x.buf

    # -- memory --------------------------------------------------------------------------

    def empty(self, shape, dtype=None, label="buffer"):
        dtype = np.dtype(dtype or self.dtype)
        shape = (shape,) if np.isscalar(shape) else tuple(shape)
        nbytes = int(np.prod(shape)) * dtype.itemsize
        dev = self.device
        if self.backend.allocated_bytes + nbytes > dev.global_mem_size:
            gc.collect()    # arrays dropped in reference cycles: as pyopencl does on failure
        if (nbytes > self.limits.max_alloc
                or self.backend.allocated_bytes + nbytes > dev.global_mem_size):
            raise OutOfMemoryError(self._oom_text(label, shape, nbytes))
        try:
            buf = cl.Buffer(self.ctx, cl.mem_flags.READ_WRITE, max(nbytes, dtype.itemsize))
        except (cl.MemoryError, cl.RuntimeError) as e:
            raise OutOfMemoryError(self._oom_text(label, shape, nbytes) + f" ({e})") from e
        return self.backend._track(DeviceArray(buf, 0, shape, dtype), nbytes, buf)

    def _oom_text(self, label, shape, nbytes):
        dev = self.device
        return (self.backend._oom_text(label, shape, nbytes,
                                       dev.global_mem_size - self.backend.allocated_bytes,
                                       dev.global_mem_size)
                + f" (one buffer may be at most {self.limits.max_alloc / 2**20:.0f} MiB)")

    def write(self, dst, host, wait=True):
        self._not_recording("a copy to the device")
        host = self.backend._check_write(dst, host)
        if self.simulator and (dst.offset or host.nbytes != dst.buf.size):
            self._write_part(dst, host)
            return
        self._pending_copy(cl.enqueue_copy(self.queue, dst.buf, host, is_blocking=wait,
                                           dst_offset=dst.offset * dst.dtype.itemsize), wait)

    def _write_part(self, dst, host):
        """dst <- host on the simulator, where dst is not its whole buffer: host written whole
        into a scratch buffer, then copied into place by a kernel (copy_bytes). Oclgrind's
        uninitialised-value check (its Uninitialized plugin, 19.10 to 26.03) keeps one
        record per buffer of which bytes are set, and a host write of n bytes at offset o
        remakes that record n bytes long and marks [o, o + n) in it: past its end where
        o > 0, so the bytes just written read as uninitialised, and so do all the bytes
        past n that the buffer held (a batch written into the second half of staging, then
        laid out by features_first, was 'Uninitialized value written to global memory',
        though every byte read had been written). A kernel's stores are recorded byte for
        byte, so this way the buffer's record keeps what was set before, gains exactly
        the bytes written, and a read of bytes nothing wrote is still reported."""
        if not host.nbytes:
            return
        if self._scratch is None or self._scratch.size < host.nbytes:
            if self._scratch is not None:
                self._retired.append(self._scratch)     # see free_buffer
            self._scratch = cl.Buffer(self.ctx, cl.mem_flags.READ_WRITE, host.nbytes)
        scratch = DeviceArray(self._scratch, 0, (host.nbytes,), np.dtype(np.uint8))
        self._pending_copy(cl.enqueue_copy(self.queue, scratch.buf, host, is_blocking=True),
                           True)
        place = DeviceArray(dst.buf, dst.offset * dst.dtype.itemsize, (host.nbytes,),
                            np.dtype(np.uint8))
        self.backend._run("copy_bytes", (host.nbytes,), place, scratch, host.nbytes)

    def send(self, slot, part, turn):
        """part into the device array slot through the copy lane's queue, from pinned
        memory, once the device has read what the last send of this turn put there; the
        backend's queue waits for it (a barrier on the copy's event). On the simulator, which
        runs its queues in turn, a plain write: Oclgrind records a copy between buffers
        as it records a host write (see _write_part)."""
        if self.simulator:
            self.write(slot, part)
            return
        self._not_recording("a copy to the device")
        lane = self._lane
        if lane is None:
            lane = self._lane = _CopyLane(self.ctx)
        after = lane.read[turn]
        if after is BEHIND:                 # a plain write used the half last: all before now
            after = self.marker()
            self.queue.flush()
        cl.enqueue_barrier(self.queue, wait_for=[lane.send(part, slot, slot.dtype, after)])

    def laid_out(self, turn, laned):
        """After the launches that read a half of staging: what the lane waits for before
        it writes there again (a marker; BEHIND after a plain write, to be made then)."""
        if self._lane is not None:
            self._lane.read[turn] = self.marker() if laned else BEHIND
            if laned:
                self.queue.flush()          # the lane's queue may wait for the marker

    def download(self, x):
        self._not_recording("a copy from the device")
        host = np.empty(x.shape, x.dtype)
        cl.enqueue_copy(self.queue, host, x.buf, src_offset=x.offset * x.dtype.itemsize)
        self._pending.clear()               # done: the queue runs in order
        return host

    def download_into(self, x, out):
        self._not_recording("a copy from the device")
        out = self.backend._check_download(x, out)
        self._pending_copy(cl.enqueue_copy(self.queue, out, x.buf, is_blocking=False,
                                           src_offset=x.offset * x.dtype.itemsize), False)

    def fetch(self, x, out):
        self.download_into(x, out)
        done = self.marker()        # the queue runs in order: done when the copy is
        self.queue.flush()          # sent, so that a thread waiting for it does not wait for ever
        return done

    def landed(self, ticket):
        ticket.wait()

    def host_pin(self, array):
        """array itself: OpenCL has no call that pins memory it did not allocate (the
        driver stages a copy from pageable memory itself)."""
        return array

    def host_unpin(self, array):
        """Nothing: host_pin pinned nothing."""

    def _pending_copy(self, event, done):
        """Keep a background copy's event (pyopencl's, which holds the host array and
        waits for the copy when dropped) until the copy is surely done: at the next
        synchronize or blocking copy, or when PENDING_COPIES newer ones are queued."""
        if done:
            self._pending.clear()
            return
        self._pending.append(event)
        if len(self._pending) > PENDING_COPIES:
            self._pending.popleft().wait()

    def free_buffer(self, buf):
        self._bound.clear()         # kernels bound to it, or to a handle it may reuse
        self._wrappers.clear()
        if self.simulator:
            # Oclgrind takes what kernels write into a buffer for uninitialised when they
            # read it back, where the buffer took a released one's slot and is larger (its
            # record of the slot keeps the old size; the split-K workspace, grown, written
            # and summed at once). Any freed buffer may leave that slot, so on the simulator
            # all stay held until the backend goes
            self._retired.append(buf)
        else:
            buf.release()

    def synchronize(self):
        self._not_recording("waiting for the device")
        self.queue.finish()
        self._pending.clear()

    # -- recorded steps --------------------------------------------------------------------

    def capture(self, work):
        """work()'s launches recorded as a list and replayed by enqueueing them again: on
        the plain queue, but each launch is one enqueue of a kernel whose arguments are
        bound, with no Python of the layers in between. (No command buffers: NVIDIA's
        OpenCL has no cl_khr_command_buffer and pyopencl no API for it.) A step that does
        more than launch (a copy, a wait: a GEMM shape not routed yet) is not recorded:
        None, and it runs eagerly."""
        self._recording = ops = []
        try:
            work()
        except _NotRecordable:
            return None
        finally:
            self._recording = None
        return _HostReplay(self.backend, self, ops)

    def enqueue(self, call):
        """call(queue): a vendor library's launches on the backend's queue (CLBlast's
        GEMM), now, or kept to be called again by the replay while capture() records."""
        if self._recording is not None:
            self._recording.append(call)
        else:
            call(self.queue)

    def _not_recording(self, what):
        if self._recording is not None:
            raise _NotRecordable(what)

    # -- profiles (portanet/profiler.py) ---------------------------------------------------

    @contextlib.contextmanager
    def profiling(self):
        """A queue with profiling enabled while a profile records; the usual one after
        (profiling can cost the driver time, so the normal queue does without)."""
        self.queue.finish()
        usual = self.queue
        self.queue = cl.CommandQueue(self.ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
        try:
            yield
        finally:
            self.queue.finish()
            self.queue = usual

    def marker(self):
        return cl.enqueue_marker(self.queue)

    @staticmethod
    def elapsed(start, end):
        """Device seconds between two markers: each ends when the work before it is done."""
        end.wait()
        return (end.profile.end - start.profile.end) * 1e-9

    def memory_info(self):
        """OpenCL cannot say how much memory is free: the device's size less what this
        backend has allocated (other programs and backends are not seen)."""
        total = self.device.global_mem_size
        return total - self.backend.allocated_bytes, total

