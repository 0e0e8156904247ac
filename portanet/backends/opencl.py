"""The OpenCL backend (pyopencl): one set of kernels, kernels_cl/, for AMD, Intel, NVIDIA
GPUs and CPUs (PoCL, Intel's CPU runtime) and the Oclgrind simulator. GEMM goes, shape by
shape, to CLBlast (pyclblast) or our own tiled kernel, whichever was measured faster
(PORTANET_GEMM=auto); own or vendor force a path. Every kernel parameter (tile sizes,
work-group sizes) derives from the device's limits, which PORTANET_CL_LIMITS can cap to
those of a class of device we cannot test on (Limits, in opencl_devices.py with the
platforms and the simulator's settings)."""
import dataclasses
import functools
import re

import numpy as np

from .. import config
from ..errors import DeviceError, KernelBuildError
from .gemm import tuned
from .gemm.tiling import SMALL_TILES, gemm_options, gemm_params
from .gpu import KernelBackend, operand_options
# the devices, their names and limits; SimulatorReport, simulator_checks, default_device,
# enumerate_devices, platform_number, SIMULATOR_VARIABLES and PROFILES are named here too,
# for the callers that know them as the OpenCL backend's
from .opencl_devices import (PROFILES, SIMULATOR_VARIABLES, SIMULATORS, Limits,  # noqa: F401
                             SimulatorReport, _devices, _platforms, default_device,
                             device_precisions, enumerate_devices, platform_number,
                             platform_words, simulator_checks, simulator_settings)
# the runtime under this backend; its replay's helpers are named here too
from .runtime.opencl import OpenCLRuntime, _enqueue_api, _status_name, cl  # noqa: F401

try:
    import pyclblast
except (ImportError, OSError):
    pyclblast = None

# OpenCL C 3.0's optional features that prelude.h's device-scope fences need (gemm.cl's
# SPLIT_K 2); OpenCL C 2.0 has them all
FENCE_FEATURES = {"__opencl_c_atomic_order_acq_rel", "__opencl_c_atomic_scope_device"}

CPU_GEMV_THREADS = 32       # work-items of gemv's groups on a CPU device


class OpenCLBackend(KernelBackend):
    kind, lang = "opencl", "cl"

    def __init__(self, platform, device, dtype=np.float32, precision=None, limits=None):
        """limits: a PORTANET_CL_LIMITS string (None: the variable's value, if set)."""
        found = {(p, d): (pl, dev) for p, d, pl, dev in _devices()}
        if (platform, device) not in found:
            raise DeviceError(f"there is no OpenCL platform {platform} with a device {device}")
        super().__init__(f"opencl:{platform}:{device}", dtype, precision)
        self.platform, self.device = found[(platform, device)]
        self.check_precision()
        # a simulator checks our kernels: built unoptimised (Oclgrind's uninitialised-value
        # check stops at the `freeze` instructions LLVM's optimiser makes), with the tilings
        # of a CPU (it reports itself as every kind of device) and without CLBlast
        self.simulator = platform_words(_platforms())[platform] in SIMULATORS
        self.limits = Limits.of(self.device, config.cl_limits() if limits is None else limits,
                                simulator=self.simulator)
        if self.dtype == np.float64 and not self.limits.fp64:
            held = "" if self.device.double_fp_config else " under PORTANET_CL_LIMITS"
            raise DeviceError(f"{self.device.name.strip()} has no double precision{held}: "
                              f"use float32")
        # what the simulator checks in this context: it reads them as the context is made
        self.simulator_settings = simulator_settings() if self.simulator else None
        self.runtime = rt = OpenCLRuntime(self, self.platform, self.device, self.limits,
                                          self.simulator)
        self.ctx = rt.ctx
        real = "double" if self.dtype == np.float64 else "float"
        self.options = [f"-DREAL={real}", f"-DREAL_IS_DOUBLE={int(real == 'double')}"]
        self.options += operand_options(self.precision)
        if self.device.single_fp_config & cl.device_fp_config.CORRECTLY_ROUNDED_DIVIDE_SQRT:
            self.options.append("-cl-fp32-correctly-rounded-divide-sqrt")
        if self.simulator:
            self.options.append("-cl-opt-disable")
        lim = self.limits
        self.is_gpu = lim.gpu
        self.compute_units = self.device.max_compute_units
        self.gemm_limits = (lim.work_group, lim.local_bytes, self.dtype.itemsize)
        self.gemm_params = gemm_params(lim.gpu, *self.gemm_limits)
        # gemv's row groups (and the row sums that share them): 32 work-items on a CPU,
        # where a group runs on one core and Intel's runtime pays for each of its
        # work-items (a Fashion-MNIST MLP epoch 2.0-2.2 -> 1.5-1.8 s there, PoCL alike);
        # a simulator keeps a GPU's 256, whose group sums its checks are for
        threads = 256 if lim.gpu or self.simulator else CPU_GEMV_THREADS
        self.gemv_threads = 1 << (min(threads, lim.work_group).bit_length() - 1)
        rt.options = self.options
        self._attach(rt)
        self._program = rt.program              # a family's program, built once
        self._wrappers = rt._wrappers           # see _wrapper (emptied as buffers go)
        # CLBlast multiplies its inputs as they are: fp16's products are our kernels'
        self.vendor_gemm = (pyclblast is not None and not self.simulator
                            and self.precision in ("fp32", "fp64"))
        rt.check_compiler()
        self._load_kernels()
        self.gemm_path = "own" if self.simulator else self.gemm_path_asked()
        tuned.apply(self)               # `portanet tune`'s parameters for this device

    @property
    def precisions(self):
        return device_precisions(self.device, self.dtype)

    def device_text(self):
        return f"{self.device.name.strip()}, OpenCL"

    def precision_hint(self):
        if self.precision in ("tf32", "bf16"):
            return (f"; {self.precision} runs on CUDA devices of compute capability 8.0 or "
                    f"newer (cuda:N), and emulated on cpu")
        if self.precision == "fp16":
            return ("; fp16 runs on OpenCL devices with half arithmetic (cl_khr_fp16: most "
                    "AMD and Intel GPUs, Intel's CPU runtime), on CUDA devices of compute "
                    "capability 7.0 or newer (cuda:N), and emulated on cpu")
        return super().precision_hint()

    @functools.cached_property
    def finish_options(self):
        """The -cl-std that builds gemm.cl's SPLIT_K 2 (a split K added up by its last part)
        with prelude.h's device-scope fences, which order the parts' writes before their
        count: OpenCL 1.2 orders memory across work-groups only through atomics (NVIDIA's
        1.2 mem_fence is a membar.cta). CL3.0 where the device's OpenCL C 3.0 has
        FENCE_FEATURES; CL2.0 where it has OpenCL C 2.0, or where its compiler builds the
        kernel as OpenCL C 2.0 (NVIDIA's: its C 3.0 lists neither feature, yet it takes
        -cl-std=CL2.0 and makes the fences membar.gl, checked in its PTX: docs/gemm.md).
        None elsewhere (or where the compiler refuses), and on the simulator, which has no
        OpenCL C 2.0 atomics: gemm_split_sum adds the parts."""
        dev = self.device
        if self.simulator:
            return None
        try:
            features = {f.name for f in dev.opencl_c_features}
            versions = {(v.version >> 22, v.version >> 12 & 0x3FF)
                        for v in dev.opencl_c_all_versions}
        except (cl.Error, AttributeError):      # not an OpenCL 3.0 device
            features, versions = set(), set()
        if FENCE_FEATURES <= features:
            return ["-cl-std=CL3.0"]
        if (2, 0) in versions or re.match(r"OpenCL C [2-9]", dev.opencl_c_version):
            return ["-cl-std=CL2.0"]
        try:
            self._build("gemm", "gemm", gemm_options(False, False, dict(SMALL_TILES, SPLIT_K=2))
                        + ["-DBIAS_ACT=0", "-cl-std=CL2.0"])
        except (KernelBuildError, cl.Error):
            return None
        return ["-cl-std=CL2.0"]

    @property
    def queue(self):
        """The runtime's queue (a profiling one while a profile records)."""
        return self.runtime.queue

    def dlpack_view(self, x):
        raise DeviceError(
            f"{self.name}: OpenCL arrays cannot be lent through DLPack. DLPack names OpenCL "
            f"devices (kDLOpenCL = 4), but no library imports them (PyTorch, CuPy, JAX and "
            f"NumPy take CPU, CUDA and ROCm memory): copy them to the host with "
            f"net.get_weights() (or backend.download(x)), or build the network on cpu or "
            f"cuda, whose arrays are lent without a copy")

    @property
    def max_alloc_bytes(self):
        return self.limits.max_alloc

    # -- GEMM ----------------------------------------------------------------------------

    def _register_cap(self, params):
        """NVIDIA's OpenCL takes a register cap (cl_nv_compiler_options): at most the
        registers that let MIN_GROUPS work-groups share a multiprocessor's register file."""
        groups = params.get("MIN_GROUPS", 1)
        if groups <= 1 or "cl_nv_compiler_options" not in self.device.extensions:
            return []
        threads = (params["TSM"] // params["WPTM"]) * (params["TSN"] // params["WPTN"])
        registers = getattr(self.device, "registers_per_block_nv", 65536)
        return [f"-cl-nv-maxrregcount={min(255, registers // (threads * groups)) // 8 * 8}"]

    def _gemm_vendor(self, alpha, a, b, beta, c, trans_a, trans_b, m, n, k, ldc):
        """CLBlast, row-major, on the same queue."""
        if self.dry:
            return
        arr = [self._wrapper(x) for x in (a, b, c)]

        def call(queue):
            pyclblast.gemm(queue, m, n, k, arr[0], arr[1], arr[2], a_ld=a.shape[1],
                           b_ld=b.shape[1], c_ld=ldc, alpha=alpha, beta=beta, a_transp=trans_a,
                           b_transp=trans_b, a_offset=a.offset, b_offset=b.offset,
                           c_offset=c.offset)
        self.runtime.enqueue(call)

    def _wrapper(self, x):
        """The pyopencl Array pyclblast wants for x, made once (60 us for three of them
        per call on PoCL); offsets are passed to CLBlast separately."""
        key = (x.buf.int_ptr, x.shape, x.dtype)
        wrapper = self._wrappers.get(key)
        if wrapper is None:
            import pyopencl.array as cla
            wrapper = self._wrappers[key] = cla.Array(self.runtime.queue, x.shape, x.dtype,
                                                          data=x.buf)
        return wrapper

    def info(self):
        dev = self.device
        return {"name": dev.name.strip(), "vendor": dev.vendor.strip(),
                "platform": self.platform.name.strip(), "driver": dev.driver_version,
                "compute_units": dev.max_compute_units, "memory_bytes": dev.global_mem_size,
                "gemm": self.gemm_path, "gemm_params": self.gemm_params,
                "limits": dataclasses.asdict(self.limits)}
