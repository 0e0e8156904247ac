"""The OpenCL backend (pyopencl): one set of kernels, kernels_cl/, for AMD, Intel, NVIDIA
GPUs and CPUs (PoCL). GEMM goes, shape by shape, to CLBlast (pyclblast) or our own tiled
kernel, whichever was measured faster (PORTANET_GEMM=auto); own or vendor force a path."""
import contextlib
import gc

import numpy as np

from .. import config
from ..errors import DeviceError, KernelBuildError, OutOfMemoryError
from . import sources
from .gpu import DeviceArray, KernelBackend, Recorded, gemm_params

try:
    import pyopencl as cl
except ImportError:          # the extra is not installed: say which one
    cl = None

try:
    import pyclblast
except (ImportError, OSError):
    pyclblast = None

def _platforms():
    if cl is None:
        raise DeviceError("the OpenCL backend needs pyopencl: pip install 'portanet[opencl]' "
                          "(or 'portanet[pocl]' for a CPU OpenCL driver as well)")
    try:
        return cl.get_platforms()
    except cl.Error:          # PLATFORM_NOT_FOUND_KHR from the ICD loader
        return []


def _devices():
    """[(p, d, platform, device)] in `portanet devices` order."""
    platforms = _platforms()
    if not platforms:
        raise DeviceError("pyopencl found no OpenCL platform: install a driver (pip install "
                          "pocl-binary-distribution for the CPU, or your GPU vendor's), and "
                          "if it lives outside the default places point OCL_ICD_VENDORS at "
                          "its .icd folder")
    found = []
    for p, platform in enumerate(platforms):
        try:
            devices = platform.get_devices()
        except cl.Error:
            devices = []
        found += [(p, d, platform, dev) for d, dev in enumerate(devices)]
    return found


def enumerate_devices():
    return [(f"opencl:{p}:{d}", f"{dev.name.strip()} ({platform.name.strip()}, "
             f"{dev.max_compute_units} compute units, {dev.global_mem_size / 2**30:.1f} GiB)")
            for p, d, platform, dev in _devices()]


def default_device(platform=None):
    """(platform, device) of the first GPU, else of the first device; of all platforms,
    or of `platform` alone (the device string opencl:P)."""
    found = _devices()
    if platform is not None:
        found = [f for f in found if f[0] == platform]
        if not found:
            raise DeviceError(f"there is no OpenCL platform {platform} with a device here")
    for p, d, _, dev in found:
        if dev.type & cl.device_type.GPU:
            return p, d
    return found[0][0], found[0][1]


BOUND_KERNELS = 4096        # kernel objects with bound arguments kept (see _launch)


class _NotRecordable(Exception):
    """Raised inside capture() by an operation that a replayed list cannot repeat."""


class _HostReplay(Recorded):
    """A recorded step: its launches enqueued again, in order, on the backend's queue."""

    def __init__(self, backend, ops):
        super().__init__(backend)
        self.ops = ops

    def __call__(self):
        bk = self.backend
        with bk._lock:
            queue = bk.queue
            for op in self.ops:
                if isinstance(op, tuple):
                    cl.enqueue_nd_range_kernel(queue, *op)
                else:
                    op(queue)


class OpenCLBackend(KernelBackend):
    kind = "opencl"

    def __init__(self, platform, device, dtype=np.float32):
        found = {(p, d): (pl, dev) for p, d, pl, dev in _devices()}
        if (platform, device) not in found:
            raise DeviceError(f"there is no OpenCL platform {platform} with a device {device}")
        super().__init__(f"opencl:{platform}:{device}", dtype)
        self.platform, self.device = found[(platform, device)]
        if self.dtype == np.float64 and not self.device.double_fp_config:
            raise DeviceError(f"{self.device.name} has no double precision: use float32")
        self.ctx = cl.Context([self.device])
        self.queue = cl.CommandQueue(self.ctx)
        real = "double" if self.dtype == np.float64 else "float"
        self.options = [f"-DREAL={real}", f"-DREAL_IS_DOUBLE={int(real == 'double')}"]
        if self.device.single_fp_config & cl.device_fp_config.CORRECTLY_ROUNDED_DIVIDE_SQRT:
            self.options.append("-cl-fp32-correctly-rounded-divide-sqrt")
        dev = self.device
        self.is_gpu = bool(dev.type & cl.device_type.GPU)
        self.compute_units = dev.max_compute_units
        self.gemm_params = gemm_params(self.is_gpu,
                                       dev.max_work_group_size, dev.local_mem_size)
        self._programs = {}
        self._bound, self._wrappers = {}, {}    # see _launch and _wrapper
        self._recording = None                  # a list while capture() records
        self._load_kernels()
        self.gemm_path = config.gemm_path() if pyclblast else "own"

    # -- programs ------------------------------------------------------------------------

    def _kernel(self, family, name, options=()):
        return cl.Kernel(self._program(family, options), name)

    def _program(self, family, extra=()):
        """Build once per context and options; pyopencl caches binaries on disk keyed by
        source, options and device."""
        key = (family, tuple(extra))
        if key not in self._programs:
            path, text = sources.load(family, "cl")
            try:
                self._programs[key] = cl.Program(self.ctx, text).build(
                    options=self.options + list(extra))
            except cl.RuntimeError as e:
                raise KernelBuildError(f"{path} failed to build for {self.device.name} with "
                                       f"options {self.options + list(extra)}:\n{e}") from e
        return self._programs[key]

    def _launch(self, kernel, global_size, local_size, args):
        """Enqueue with arguments bound once per call site: setting them is what costs
        (52 us per launch through Kernel.__call__ on PoCL, 2 us to enqueue a kernel whose
        arguments are set), and a training step repeats the same launches with the same
        buffers, offsets and scalars at every step. So each distinct argument list gets
        its own kernel object with the arguments set; buffers are keyed by handle, and the
        cache is emptied when a buffer is freed (a new one may reuse the handle)."""
        key = (kernel, *(a.int_ptr if isinstance(a, cl.Buffer) else a for a in args))
        bound = self._bound.get(key)
        try:
            if bound is None:
                if len(self._bound) >= BOUND_KERNELS:      # dropout's key changes every step
                    self._bound.clear()
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
                f"resources ({e}); {self.allocated_bytes / 2**20:.0f} MiB of "
                f"{dev.global_mem_size / 2**20:.0f} MiB are allocated by portanet: use a "
                f"smaller batch or network") from e

    @staticmethod
    def _pointer(x):
        return x.buf

    # -- memory --------------------------------------------------------------------------

    def empty(self, shape, dtype=None, label="buffer"):
        dtype = np.dtype(dtype or self.dtype)
        shape = (shape,) if np.isscalar(shape) else tuple(shape)
        nbytes = int(np.prod(shape)) * dtype.itemsize
        dev = self.device
        if self.allocated_bytes + nbytes > dev.global_mem_size:
            gc.collect()    # arrays dropped in reference cycles: as pyopencl does on failure
        if (nbytes > dev.max_mem_alloc_size
                or self.allocated_bytes + nbytes > dev.global_mem_size):
            raise OutOfMemoryError(self._oom_text(label, shape, nbytes))
        try:
            buf = cl.Buffer(self.ctx, cl.mem_flags.READ_WRITE, max(nbytes, dtype.itemsize))
        except (cl.MemoryError, cl.RuntimeError) as e:
            raise OutOfMemoryError(self._oom_text(label, shape, nbytes) + f" ({e})") from e
        return self._track(DeviceArray(buf, 0, shape, dtype), nbytes, buf)

    def _oom_text(self, label, shape, nbytes):
        dev = self.device
        return (super()._oom_text(label, shape, nbytes,
                                  dev.global_mem_size - self.allocated_bytes, dev.global_mem_size)
                + f" (one buffer may be at most {dev.max_mem_alloc_size / 2**20:.0f} MiB)")

    def write(self, dst, host):
        self._not_recording("a copy to the device")
        host = self._check_write(dst, host)
        cl.enqueue_copy(self.queue, dst.buf, host, dst_offset=dst.offset * dst.dtype.itemsize)

    def download(self, x):
        self._not_recording("a copy from the device")
        host = np.empty(x.shape, x.dtype)
        cl.enqueue_copy(self.queue, host, x.buf, src_offset=x.offset * x.dtype.itemsize)
        return host

    def _free_buffer(self, buf):
        self._bound.clear()         # kernels bound to it, or to a handle it may reuse
        self._wrappers.clear()
        buf.release()

    def synchronize(self):
        self._not_recording("waiting for the device")
        self.queue.finish()

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
        return _HostReplay(self, ops)

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

    def _marker(self):
        return cl.enqueue_marker(self.queue)

    @staticmethod
    def _elapsed(start, end):
        """Device seconds between two markers: each ends when the work before it is done."""
        end.wait()
        return (end.profile.end - start.profile.end) * 1e-9

    def memory_info(self):
        """OpenCL cannot say how much memory is free: the device's size less what this
        backend has allocated (other programs and backends are not seen)."""
        total = self.device.global_mem_size
        return total - self.allocated_bytes, total

    @property
    def max_alloc_bytes(self):
        return self.device.max_mem_alloc_size

    # -- GEMM ----------------------------------------------------------------------------

    def _gemm_vendor(self, alpha, a, b, beta, c, trans_a, trans_b, m, n, k):
        """CLBlast, row-major, on the same queue."""
        arr = [self._wrapper(x) for x in (a, b, c)]

        def call(queue):
            pyclblast.gemm(queue, m, n, k, arr[0], arr[1], arr[2], a_ld=a.shape[1],
                           b_ld=b.shape[1], c_ld=n, alpha=alpha, beta=beta, a_transp=trans_a,
                           b_transp=trans_b, a_offset=a.offset, b_offset=b.offset,
                           c_offset=c.offset)
        if self._recording is not None:
            self._recording.append(call)
        else:
            call(self.queue)

    def _wrapper(self, x):
        """The pyopencl Array pyclblast wants for x, made once (60 us for three of them
        per call on PoCL); offsets are passed to CLBlast separately."""
        key = (x.buf.int_ptr, x.shape, x.dtype)
        wrapper = self._wrappers.get(key)
        if wrapper is None:
            import pyopencl.array as cla
            wrapper = self._wrappers[key] = cla.Array(self.queue, x.shape, x.dtype, data=x.buf)
        return wrapper

    def info(self):
        dev = self.device
        return {"name": dev.name.strip(), "vendor": dev.vendor.strip(),
                "platform": self.platform.name.strip(), "driver": dev.driver_version,
                "compute_units": dev.max_compute_units, "memory_bytes": dev.global_mem_size,
                "gemm": self.gemm_path, "gemm_params": self.gemm_params}
