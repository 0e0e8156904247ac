"""Configuration that reaches the kernels: PORTANET_CL_LIMITS caps under which no tiling of
the GEMM kernel fits are refused as the limits are parsed, naming the variable and the
smallest values that work (they failed at device creation with a raw RuntimeError)."""
import re

import numpy as np
import pytest

from portanet.backends import opencl
from portanet.backends.gemm import tiling as gemm_tiling
from portanet.errors import DeviceError

# a GPU's limits, as Limits.of reads them from a device
GPU = opencl.Limits(work_group=1024, work_items=(1024, 1024, 64), local_bytes=48 * 1024,
                    fp64=True, max_alloc=1 << 30, memory=1 << 32, vector_width=1, gpu=True)
CPU = opencl.Limits(work_group=4096, work_items=(4096,) * 3, local_bytes=1 << 20, fp64=False,
                    max_alloc=1 << 30, memory=1 << 32, vector_width=8, gpu=False)


def _smallest_tiling(itemsize):
    """(work-items, local bytes) of the smallest tiling gemm_params falls back to."""
    p = gemm_tiling.gemm_params(False, 1 << 16, 1 << 30, itemsize)
    while gemm_tiling._halved(p) is not None:
        p = gemm_tiling._halved(p)
    threads = (p["TSM"] // p["WPTM"]) * (p["TSN"] // p["WPTN"])
    slabs = p["TSK"] * (p["TSM"] + p["TSN"] + 2 * p["PAD"]) * itemsize + gemm_tiling.LOCAL_RESERVED
    return threads, slabs


@pytest.mark.parametrize("own", [GPU, CPU], ids=["gpu", "cpu"])
@pytest.mark.parametrize("spec", ["work_group=1", "local=1", "work_group=1,local=1",
                                  "work_group=63", "mobile,local=1k"])
def test_caps_that_leave_the_gemm_no_tiling_are_refused_naming_what_works(own, spec):
    with pytest.raises(DeviceError) as refused:
        own.capped(spec)
    said = str(refused.value)
    assert said.startswith(f"PORTANET_CL_LIMITS={spec!r}") and "no tiling" in said, said
    # the values it names work, and are the smallest that do
    fix = re.match(r"\w+=\d+(,\w+=\d+)*", said.split("the smallest values that work: ")[1])[0]
    held = own.capped(f"{spec},{fix}")
    for key, value in (item.split("=") for item in fix.split(",")):
        with pytest.raises(DeviceError):
            own.capped(f"{spec},{fix},{key}={int(value) - 1}")
    assert gemm_tiling.gemm_params(held.gpu, held.work_group, held.local_bytes, 4)


def test_the_smallest_values_are_the_smallest_tiling_s():
    threads, slabs = _smallest_tiling(4)
    with pytest.raises(DeviceError, match=f"work_group={threads},local={slabs}$"):
        CPU.capped("work_group=1,local=1")


def test_float64_needs_its_own_room_and_fp64_no_keeps_float32():
    """Where the device keeps float64, its slabs (twice float32's) must fit too."""
    threads, slabs = _smallest_tiling(8)
    between = (_smallest_tiling(4)[1] + slabs) // 2
    with pytest.raises(DeviceError, match=f"in float64.*local={slabs}, or fp64=no"):
        GPU.capped(f"local={between}")
    assert GPU.capped(f"local={between},fp64=no").local_bytes == between
    assert CPU.capped(f"local={between}").local_bytes == between      # no float64 there


def test_caps_that_fit_are_taken_as_before():
    for spec in ("amd", "intel-gpu", "mobile", "work_group=64,local=8k", "work_group=64"):
        GPU.capped(spec)
        CPU.capped(spec)


def test_the_backend_refuses_them_before_it_is_made():
    try:
        p, d = opencl.default_device()
    except DeviceError as e:
        pytest.skip(f"no OpenCL device: {e}")
    with pytest.raises(DeviceError, match="PORTANET_CL_LIMITS='local=1'.*local="):
        opencl.OpenCLBackend(p, d, np.float32, limits="local=1")
