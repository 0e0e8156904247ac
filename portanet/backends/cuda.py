"""The CUDA backend (pycuda): kernels_cl/'s bodies under kernels_cu/'s prelude, and the
tensor-core families, built once per process for the GPU's own architecture (pycuda caches
the binaries on disk, keyed by source, options and architecture), launched on one stream. GEMM goes, shape by shape, to cuBLAS (through
nvmath-python) or our own tiled kernel, whichever was measured faster (PORTANET_GEMM=auto);
own or vendor force a path."""
import ctypes
import ctypes.util
import functools
import os

import numpy as np

from ..errors import DeviceError
from . import lending
from .gemm import tuned
from .gemm.tiling import gemm_params
from .gpu import KernelBackend, operand_options
from .runtime import serialised_verb
from .runtime.cuda import CudaRuntime, _check
from .shadows import _whole16

try:
    import pycuda.driver as drv
except ImportError:
    drv = None

try:
    from nvmath.bindings import cublas
except (ImportError, OSError, RuntimeError):
    cublas = None

_initialised = False
MMA_TILE, MMA_THREADS = 128, 256     # mma.cu's tile of c (BM = BN) and its block
MMA_BLOCKS = 2                       # mma.cu's MIN_BLOCKS (1 and 2 alike on an H100)
WGMMA_TILE, WGMMA_THREADS = (128, 256), 384    # wgmma.cu's BM x BN tile of c and its block
# its dynamic shared memory: 4 stages of both 16-bit tiles 64 deep, 1024 to align them,
# a full and an empty barrier (8 bytes) per stage
WGMMA_SHARED = 4 * (WGMMA_TILE[0] + WGMMA_TILE[1]) * 64 * 2 + 1024 + 4 * 2 * 8


def _init():
    global _initialised
    if drv is None:
        if not _nvidia_driver_present():
            raise DeviceError("no NVIDIA GPU/driver found on this machine (CUDA needs one; "
                              "the OpenCL and cpu devices work without)")
        raise DeviceError("the CUDA backend needs pycuda: pip install 'portanet[cuda]'")
    if not _initialised:
        try:
            drv.init()
        except drv.Error as e:
            raise DeviceError(f"CUDA driver could not start ({e}); is an NVIDIA driver "
                              f"installed and a GPU visible?") from e
        _initialised = True
    return drv.Device.count()


@functools.cache
def _nvidia_driver_present():
    """Whether this machine has NVIDIA's driver: its kernel module or its CUDA library
    (asked once: find_library runs ldconfig)."""
    if os.path.exists("/proc/driver/nvidia"):
        return True
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return ctypes.util.find_library("cuda") is not None


def enumerate_devices():
    out = []
    for i in range(_init()):
        d = drv.Device(i)
        cc = d.compute_capability()
        out.append((f"cuda:{i}", f"{d.name()} (CUDA, compute capability {cc[0]}.{cc[1]}, "
                                 f"{d.total_memory() / 2**30:.1f} GiB; precisions "
                                 f"{', '.join(device_precisions(d))})"))
    return out


def device_precisions(device, dtype=np.float32):
    """What a CUDA device computes in (portanet/precision.py): fp32; tf32 and bf16 on tensor
    cores from compute capability 8.0 (Ampere) on, fp16 from 7.0 (Volta); fp64 for float64
    networks."""
    if np.dtype(dtype) == np.float64:
        return ("fp64",)
    cc = device.compute_capability()
    return ("fp32",) + (("tf32", "bf16") if cc >= (8, 0) else ()) + (
        ("fp16",) if cc >= (7, 0) else ())


# the 16-bit GEMM inputs of a precision: their type here (prelude.h's half_bits writes
# bf16's bits as unsigned 16-bit integers) and cuBLAS's (cudaDataType)
CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF = 0, 2, 14
HALF_TYPES = {"bf16": (np.uint16, CUDA_R_16BF), "fp16": (np.float16, CUDA_R_16F)}
GEMM_DEFAULT_ALGO = -1          # CUBLAS_GEMM_DEFAULT


class CudaBackend(KernelBackend):
    kind, lang = "cuda", "cu"
    is_gpu = True
    host_empty = serialised_verb("host_empty")      # pinned memory (the runtime's)

    def __init__(self, index=0, dtype=np.float32, precision=None):
        count = _init()
        if not 0 <= index < count:
            raise DeviceError(f"this machine has {count} CUDA device(s)")
        super().__init__(f"cuda:{index}", dtype, precision)
        self.ordinal = index
        self.device = drv.Device(index)
        self.check_precision()
        # the device's primary context, made current in each thread by the backend's lock:
        # the runtime's (CudaRuntime)
        self.runtime = CudaRuntime(self, self.device)
        self._lock = self.runtime.lock
        with self._lock:
            self._setup()

    def _setup(self):
        """What needs the context current: stream, kernels, cuBLAS handle."""
        rt = self.runtime
        rt.start()
        self._attach(rt)
        self._address = rt.address
        self.stream, self.cc, self.arch = rt.stream, rt.cc, rt.arch
        self._maps = {}                 # TMA descriptors by operand (_tensor_map)
        # bf16, fp16: the 16-bit copies of a product's inputs that cuBLAS and wgmma.cu read
        self.half_operands = HALF_TYPES.get(self.precision, (None,))[0]
        real = "double" if self.dtype == np.float64 else "float"
        self.options = [f"-DREAL={real}", f"-DREAL_IS_DOUBLE={int(real == 'double')}"]
        # every product's inputs rounded (prelude.h's OPERAND)
        self.options += operand_options(self.precision)
        rt.options = self.options
        attrs = rt.attributes
        self.compute_units = self.device.get_attribute(drv.device_attribute.MULTIPROCESSOR_COUNT)
        self.finish_options = []            # __threadfence orders split K's parts (gemm.cl)
        self.max_threads = rt.max_threads
        self.gemm_limits = (self.max_threads,
                            attrs[drv.device_attribute.MAX_SHARED_MEMORY_PER_BLOCK],
                            self.dtype.itemsize)
        self.gemm_params = gemm_params(True, *self.gemm_limits)
        self._load_kernels()
        self.vendor_gemm = cublas is not None
        self.gemm_path = self.gemm_path_asked()
        if cublas is not None:
            self._cublas = cublas.create()
            cublas.set_stream(self._cublas, self.stream.handle)
            if self.precision == "tf32":    # sgemm on tensor cores, inputs rounded to TF32
                cublas.set_math_mode(self._cublas, cublas.Math.TF32_TENSOR_OP_MATH)
            # bf16, fp16: gemm_ex on 16-bit copies of the inputs, float32 sums and output
            # (cuBLAS's FAST_16BF on float32 inputs neither rounds them nor runs faster
            # than TF32: docs/precision.md)
            self._scalars = np.zeros(2, self.dtype)        # alpha, beta (host pointer mode)
        tuned.apply(self)               # `portanet tune`'s parameters for this device

    @property
    def precisions(self):
        return device_precisions(self.device, self.dtype)

    def device_text(self):
        cc = self.device.compute_capability()
        return f"{self.device.name()}, compute capability {cc[0]}.{cc[1]}"

    def precision_hint(self):
        if self.precision in ("tf32", "bf16"):
            return f"; {self.precision} needs compute capability 8.0 (Ampere) or newer"
        if self.precision == "fp16":
            return "; fp16 needs compute capability 7.0 (Volta) or newer"
        return super().precision_hint()

    def dlpack_source(self):
        """CUDA memory on this GPU, read in place; producers order their work before this
        stream's (portanet/dlpack.py takes it in)."""
        return (lending.CUDA, self.ordinal), int(self.stream.handle)

    def clear(self, x):
        if self.dry:
            return
        drv.memset_d8_async(self._address(x), 0, x.size * np.dtype(x.dtype).itemsize,
                            self.stream)

    def dlpack_view(self, x):
        return lending.DeviceView(self, x, self._address(x), (lending.CUDA, self.ordinal))

    # -- GEMM ----------------------------------------------------------------------------

    def _gemm_vendor(self, alpha, a, b, beta, c, trans_a, trans_b, m, n, k, ldc):
        """cuBLAS is column-major: row-major c = op(a) op(b) is column-major
        c^T = op(b)^T op(a)^T, so the operands swap and keep their own transposes."""
        if self.dry:
            return
        self._scalars[:] = alpha, beta
        ptr = self._scalars.ctypes.data
        size = self._scalars.itemsize
        if a.dtype != c.dtype:          # 16-bit inputs (half_operands): float32 sums and c
            kind = HALF_TYPES[self.precision][1]
            cublas.gemm_ex(self._cublas, int(trans_b), int(trans_a), n, m, k, ptr,
                           self._address(b), kind, b.shape[1], self._address(a), kind,
                           a.shape[1], ptr + size, self._address(c), CUDA_R_32F, ldc,
                           cublas.ComputeType.COMPUTE_32F, GEMM_DEFAULT_ALGO)
            return
        gemm = cublas.dgemm if self.dtype == np.float64 else cublas.sgemm
        gemm(self._cublas, int(trans_b), int(trans_a), n, m, k, ptr,
             self._address(b), b.shape[1], self._address(a), a.shape[1], ptr + size,
             self._address(c), ldc)

    @property
    def tensor_gemm(self):
        """A tensor-core GEMM of ours computes this backend's products (routing times it):
        mma.cu's gemm_tf32 in tf32; wgmma.cu's gemm_wgmma in bf16 and fp16 on Hopper
        (compute capability 9.0, whose warpgroup MMA later architectures do not have)."""
        return self.precision == "tf32" or (self.precision in HALF_TYPES
                                            and self.cc == (9, 0))

    def _own_builds(self):
        """The tensor-core builds this precision launches (`builds`, for build_all and
        warmup): mma.cu's in each transpose and vector width in tf32, wgmma.cu's (its GEMM
        and its operand copies, from float32 or 16-bit storage) in bf16 and fp16 on Hopper;
        the options as `_gemm_tensor` and `_kmajor16` give them."""
        if not self.tensor_gemm:
            return ()
        if self.precision == "tf32":
            return [("mma", [f"-DTRANS_A={a}", f"-DTRANS_B={b}", f"-DVEC={v}",
                             f"-DMIN_BLOCKS={MMA_BLOCKS}"], None)
                    for a in (0, 1) for b in (0, 1) for v in (0, 1)]
        return [("wgmma", [], "sm_90a"), ("wgmma", ["-DSOURCE_HALF=1"], "sm_90a")]

    def _tensor_takes(self, k):
        """gemm_wgmma reads its 16-bit copies through the tensor memory accelerator, whose
        rows lie at whole 16 bytes: K a multiple of 8."""
        return self.precision == "tf32" or k % 8 == 0

    def _gemm_tensor(self, alpha, a, b, beta, c, trans_a, trans_b, m, n, k, label):
        """c <- alpha op(a) op(b) + beta c on tensor cores: in TF32 by mma.cu (a block of 256
        threads per 128 x 128 tile of c), in bf16 and fp16 by wgmma.cu (_gemm_wgmma)."""
        if self.precision != "tf32":
            self._gemm_wgmma(alpha, a, b, beta, c, trans_a, trans_b, m, n, k, label)
            return
        vec = all(x.shape[1] % 4 == 0 and x.offset % 4 == 0 for x in (a, b))
        kernel = self._kernel("mma", "gemm_tf32", [
            f"-DTRANS_A={int(trans_a)}", f"-DTRANS_B={int(trans_b)}", f"-DVEC={int(vec)}",
            f"-DMIN_BLOCKS={MMA_BLOCKS}"])
        self._run(kernel, (-(-n // MMA_TILE) * MMA_THREADS, -(-m // MMA_TILE)), c, c.shape[1],
                  a, a.shape[1], b, b.shape[1], m, n, k, float(alpha), float(beta),
                  local=(MMA_THREADS, 1), label=label)

    def _gemm_wgmma(self, alpha, a, b, beta, c, trans_a, trans_b, m, n, k, label):
        """c <- alpha op(a) op(b) + beta c on Hopper's tensor cores from 16-bit inputs
        (wgmma.cu): op(a) and op(b)^T first copied K-major into the operand workspace
        (_kmajor16), then `_wgmma`."""
        a16, b16 = self._kmajor16(a, b, trans_a, trans_b, m, n, k)
        self._wgmma(alpha, a16, b16, beta, c, label)

    def _kmajor16(self, a, b, trans_a, trans_b, m, n, k):
        """op(a) (m x k) and op(b)^T (n x k) rounded to 16 bits in the operand workspace,
        rows of K (kmajor16: rounded as the vendor path's copies). An operand in 16-bit
        storage whose rows are K already, at whole 16 bytes (a weight gradient's delta and
        input), is read where it is; one laid out otherwise is copied as it is."""
        out = []
        for x, rows, start, kmajor in ((a, m, 0, not trans_a), (b, n, _whole16(m * k), trans_b)):
            stored = self._stored(x)
            if stored and kmajor and x.shape == (rows, k) and x.offset % 8 == 0:
                out.append(x)
                continue
            ws = self._half_workspace(_whole16(m * k) + _whole16(n * k))
            y = self.view(ws, (rows, k), start)
            s_row, s_col = (x.shape[1], 1) if kmajor else (1, x.shape[1])
            copy = self._kernel("wgmma", "kmajor16", ["-DSOURCE_HALF=1"] if stored else [],
                                arch="sm_90a")
            self._run(copy, (-(-k // 64) * 32, -(-rows // 32) * 8), y, x, rows, k, s_row,
                      s_col, local=(32, 8), label=f"{self.precision} operands")
            out.append(y)
        return out

    def _wgmma(self, alpha, a16, b16, beta, c, label="gemm_wgmma"):
        """c (m x n) <- alpha a16 b16^T + beta c, a16 (m x k) and b16 (n x k) 16-bit and
        K-major at whole 16 bytes (K a multiple of 8): one block of 384 threads per 128 x 256
        tile of c, whose operands the TMA reads through a tensor map each."""
        (m, k), n = a16.shape, b16.shape[0]
        kernel = self._wgmma_kernel()
        args = (np.uintp(int(self._tensor_map(a16, WGMMA_TILE[0]))),
                np.uintp(int(self._tensor_map(b16, WGMMA_TILE[1]))), self._pointer(c),
                np.int32(c.offset), np.int32(c.shape[1]), np.int32(m), np.int32(n),
                np.int32(k), np.float32(alpha), np.float32(beta))
        grid = (-(-n // WGMMA_TILE[1]) * -(-m // WGMMA_TILE[0]), 1, 1)   # groups of tiles

        def launch():
            kernel.prepared_async_call(grid, (WGMMA_THREADS, 1, 1), self.stream, *args,
                                       shared_size=WGMMA_SHARED)
        if self.dry:
            return
        if self.trace is None:
            launch()
        else:
            self.trace.record(self, label, launch)

    def _wgmma_kernel(self):
        kernel = self._kernels.get("gemm_wgmma")
        if kernel is None:
            kernel = self._kernel("wgmma", "gemm_wgmma", arch="sm_90a")
            kernel.set_attribute(drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                 WGMMA_SHARED)
            kernel.prepare("PPPiiiiiff")
            self._kernels["gemm_wgmma"] = kernel
        return kernel

    def _tensor_map(self, x, box_rows):
        """The TMA's description of a K-major 16-bit matrix x (rows x k, at a whole 16
        bytes): boxes of box_rows x 64 in the 128-byte swizzle, zeros beyond its edges.
        Made by the driver (cuTensorMapEncodeTiled, through ctypes: pycuda has no call for
        it), copied to device memory once and kept there per address and shape, so that a
        recorded step finds it made."""
        key = (self._address(x), x.shape, box_rows)
        made = self._maps.get(key)
        if made is None:
            if len(self._maps) >= 256:                  # a workspace that moved leaves some
                self._maps.clear()
                self.generation += 1                    # recorded steps may point at them
            rows, k = x.shape
            raw = np.zeros(192, np.uint8)               # a CUtensorMap is 64-byte aligned
            at = raw.ctypes.data + (-raw.ctypes.data) % 64
            _check(_tma_api().cuTensorMapEncodeTiled(
                ctypes.c_void_p(at), TMA_UINT16, 2, ctypes.c_void_p(self._address(x)),
                (ctypes.c_uint64 * 2)(k, rows), (ctypes.c_uint64 * 1)(2 * k),
                (ctypes.c_uint32 * 2)(64, box_rows), (ctypes.c_uint32 * 2)(1, 1), 0,
                TMA_SWIZZLE_128B, TMA_L2_256B, 0), "describe an operand for the TMA")
            made = self._maps[key] = drv.mem_alloc(128)
            drv.memcpy_htod(made, raw[at - raw.ctypes.data:][:128])
        return made

    def info(self):
        d = self.device
        free, total = drv.mem_get_info()
        cc = d.compute_capability()
        return {"name": d.name(), "vendor": "NVIDIA", "compute_capability": f"{cc[0]}.{cc[1]}",
                "driver": ".".join(map(str, drv.get_driver_version() and
                                       divmod(drv.get_driver_version(), 1000))),
                "compute_units": d.get_attribute(drv.device_attribute.MULTIPROCESSOR_COUNT),
                "memory_bytes": total, "memory_free_bytes": free, "gemm": self.gemm_path,
                "gemm_params": self.gemm_params}



# cuda.h's CUtensorMapDataType UINT16 (the TMA moves 16-bit inputs as they are),
# CUtensorMapSwizzle 128B and CUtensorMapL2promotion L2_256B
TMA_UINT16, TMA_SWIZZLE_128B, TMA_L2_256B = 1, 3, 3


@functools.lru_cache(maxsize=None)
def _tma_api():
    lib = ctypes.CDLL("libcuda.so.1")
    p, u32 = ctypes.c_void_p, ctypes.c_uint32
    lib.cuTensorMapEncodeTiled.argtypes = [p, ctypes.c_int, u32, p, p, p, p, p, ctypes.c_int,
                                           ctypes.c_int, ctypes.c_int, ctypes.c_int]
    lib.cuTensorMapEncodeTiled.restype = ctypes.c_int
    return lib
