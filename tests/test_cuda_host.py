"""The CUDA backend's host code, run where there is no GPU: over a stand-in for pycuda and
nvmath's cuBLAS (tests/cuda_standin/) whose device memory is host memory. Copies are real;
kernels are looked up by name in the source the backend built and checked at each launch
(argument count and types against their preparation, every pointer inside a live
allocation, grid and block sizes), cuBLAS calls checked against their operands' extents;
nothing is computed. It catches what a GPU-less CI otherwise cannot (a renamed attribute, a
missing argument, an address past a buffer) on every path a precision takes: our GEMM,
cuBLAS, mma.cu's TF32 and wgmma.cu's bf16/fp16 kernels, recorded steps. Numerics are the
GPU's tests' (the cuda cases of the other files)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

STANDIN = Path(__file__).resolve().parent / "cuda_standin"


def run(tmp_path, *precisions):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(STANDIN)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
        HOME=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / "cache"))
    for name in ("PORTANET_DEVICE", "PORTANET_ROUTES", "PORTANET_GEMM", "PORTANET_CONV"):
        env.pop(name, None)
    job = subprocess.run([sys.executable, str(STANDIN / "exercise.py"), *precisions], env=env,
                         capture_output=True, text=True, timeout=600)
    assert job.returncode == 0, job.stderr[-4000:]
    return json.loads(job.stdout.strip().splitlines()[-1])


def test_every_precision_runs_its_paths(tmp_path):
    seen = run(tmp_path, "fp32", "tf32", "bf16", "fp16")
    launched = seen["launches"]
    for kernel in ("gemm", "gemm_tf32", "gemm_wgmma", "kmajor16", "im2col", "conv_direct",
                   "batchnorm_train", "batchnorm_grad", "adam_update", "gather_batch",
                   "unscale_check", "update_loss_scale"):
        assert launched.get(kernel, 0) > 0, f"{kernel} never launched: {sorted(launched)}"
    assert seen["cublas"].get("sgemm", 0) > 0 and seen["cublas"].get("gemm_ex", 0) > 0
    assert seen["captures"] > 0                 # recorded steps


@pytest.fixture
def standin():
    """The stand-in's pycuda, imported here and taken out of sys.modules afterwards (a real
    pycuda imported before is put back), so that no other test sees it."""
    saved = {k: sys.modules.pop(k) for k in list(sys.modules) if k.split(".")[0] == "pycuda"}
    sys.path.insert(0, str(STANDIN))
    try:
        from pycuda import compiler, driver
        yield compiler, driver
    finally:
        sys.path.remove(str(STANDIN))
        for k in [k for k in sys.modules if k.split(".")[0] == "pycuda"]:
            del sys.modules[k]
        sys.modules.update(saved)


def test_the_standin_refuses_a_bad_launch(standin):
    compiler, driver = standin
    buf = driver.mem_alloc(64)
    kernel = compiler.SourceModule('KERNEL void f(float* x, int n) {}', arch="sm_90",
                                   no_extern_c=True).get_function("f").prepare("Pi")
    stream = driver.Stream()
    kernel.prepared_async_call((1, 1), (32, 1, 1), stream, np.uintp(int(buf)), np.int32(3))
    with pytest.raises(driver.LogicError, match="1 arguments for 2"):
        kernel.prepared_async_call((1, 1), (32, 1, 1), stream, np.uintp(int(buf)))
    with pytest.raises(driver.LogicError, match="in no allocation|run past"):
        kernel.prepared_async_call((1, 1), (32, 1, 1), stream, np.uintp(int(buf) + 4096),
                                   np.int32(3))
    with pytest.raises(driver.LogicError, match="named symbol not found"):
        compiler.SourceModule('KERNEL void f(int n) {}', arch="sm_90",
                              no_extern_c=True).get_function("g")
    buf.free()
