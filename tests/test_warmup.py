"""`portanet warmup`: every family built in each precision asked, a line per build where no
bar is drawn, nothing to build on the cpu, and after it a first training in a new process
compiles nothing (the drivers' caches hold every binary it loads)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from portanet.backends import gpu
from portanet.cli import main

from conftest import _OPENCL, get_backend

STANDIN = Path(__file__).resolve().parent / "cuda_standin"
OPENCL = [d for d in _OPENCL if d != "opencl"]

# a first training of LeNet at batch 32 (fit, evaluate, predict on random images), which
# prints how many programs the drivers' caches gained while it ran
TRAIN = """
import numpy as np, portanet as pn, sys
bk = pn.device(sys.argv[1])
cache = bk.cache_dir
files = lambda: {f for f in cache.rglob('*') if f.is_file()}    # rglob: none if absent
before = files()
net = pn.lenet(input_shape=(1, 28, 28), device=sys.argv[1], seed=0)
x = np.random.default_rng(0).random((64, 1, 28, 28), dtype=np.float32)
y = np.arange(64) % 10
net.fit(x, y, epochs=1, batch_size=32, verbose=0)
net.evaluate(x, y)
net.predict(x)
print(len(files() - before))
"""


def command(tmp_path, *args, standin=False):
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"), HOME=str(tmp_path))
    if standin:
        env["PYTHONPATH"] = os.pathsep.join([str(STANDIN)] + [
            p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    for name in ("PORTANET_DEVICE", "PORTANET_ROUTES", "PORTANET_GEMM", "PORTANET_CONV",
                 "PORTANET_PRECISION"):
        env.pop(name, None)
    job = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True,
                         timeout=600)
    assert job.returncode == 0, job.stderr[-4000:]
    return job


def test_on_the_cpu_there_is_nothing_to_build():
    r = CliRunner().invoke(main, ["warmup", "--device", "cpu"])
    assert r.exit_code == 0, r.output
    assert "cpu: nothing to build" in r.output


@pytest.mark.parametrize("spec", OPENCL)
def test_every_family_in_each_precision_a_line_each(spec):
    bk = get_backend(spec)
    r = CliRunner().invoke(main, ["warmup", "--device", spec])
    assert r.exit_code == 0, r.output
    for precision in bk.precisions:
        stored = precision in ("bf16", "fp16") and \
            get_backend(spec).__class__(*map(int, bk.name.split(":")[1:]),
                                        precision=precision).storage_dtype is not None
        count = len(gpu.FAMILIES) + (len(gpu.FAMILIES) - len(gpu.REAL_ONLY) if stored else 0)
        for family in gpu.FAMILIES:
            assert f"{bk.name} {precision}: built " in r.output
            assert any(line.startswith(f"{bk.name} {precision}: built ") and
                       line.split()[4] == family for line in r.output.splitlines()), family
        assert f"{bk.name} {precision}: built {count}/{count} " in r.output
        assert f"{bk.name} {precision} (" in r.output and "ready in" in r.output


def test_a_precision_the_device_lacks_is_refused_by_name():
    spec = OPENCL[0] if OPENCL else pytest.skip("no OpenCL device here")
    bk = get_backend(spec)
    lacking = next((p for p in ("bf16", "tf32") if p not in bk.precisions), None)
    if lacking is None:
        pytest.skip(f"{spec} computes every precision")
    r = CliRunner().invoke(main, ["warmup", "--device", spec, "--precision", lacking])
    assert r.exit_code == 1 and f"does not compute in {lacking}" in r.output


@pytest.mark.parametrize("spec", [d for d in OPENCL if "intel" in d or "oclgrind" not in d][:1])
def test_after_warmup_a_first_training_compiles_nothing(tmp_path, spec):
    get_backend(spec)
    first = command(tmp_path / "cold", "-c", TRAIN, spec)
    assert int(first.stdout.split()[-1]) > 0            # what a first use compiles
    command(tmp_path, "-m", "portanet.cli", "warmup", "--device", spec, "--precision",
            "fp32", "--model", "lenet", "--batch-size", "32")
    job = command(tmp_path, "-c", TRAIN, spec)
    assert int(job.stdout.split()[-1]) == 0, job.stderr[-2000:]


def test_cuda_builds_every_family_in_each_precision(tmp_path):
    """Over the stand-in for pycuda (tests/cuda_standin/): each family compiled by nvcc once
    per precision and options, in threads, then loaded."""
    script = """
import json
from pycuda import compiler
from portanet.cli import main
try:
    main(["warmup", "--device", "cuda"])
except SystemExit as e:
    assert not e.code, e.code
print(json.dumps(compiler.COMPILED))
"""
    job = command(tmp_path, "-c", script, standin=True)
    compiled = [(name, tuple(options), arch) for name, options, arch in
                json.loads(job.stdout.strip().splitlines()[-1])]
    assert len(compiled) == len(set(compiled))          # each build once
    for precision in ("fp32", "tf32", "bf16", "fp16"):
        assert f"cuda:0 {precision}: built" in job.stderr and "ready in" in job.stderr
    assert "-DSTORED_HALF=1" in job.stderr
    # and the tensor-core families: mma.cu's in tf32, wgmma.cu's for Hopper in bf16, fp16
    assert sum("-DTRANS_A=1" in " ".join(o) for n, o, a in compiled) == 4
    assert {a for n, o, a in compiled} >= {"sm_90", "sm_90a"}


def test_warmup_trains_a_gpt_a_step(tmp_path):
    """--model gpt: a step of the bench's baby GPT on token windows, which builds the
    attention family for its head dim (64)."""
    spec = next((d for d in OPENCL if "intel" in d), None)
    if spec is None:
        pytest.skip("Intel's CPU OpenCL is not installed here")
    get_backend(spec)
    r = CliRunner().invoke(main, ["warmup", "--device", spec, "--precision", "fp32",
                                  "--model", "gpt", "--batch-size", "1"])
    assert r.exit_code == 0, r.output
    assert "gpt, one step at batch 1" in r.output and "ready in" in r.output
