"""Kernel builds (KernelBackend.build_all, the runtimes' build_many): every family and its
16-bit storage build built once, several at once, the kernels then computing what NumPy
does; a program asked for from several threads built once; a failed build naming its file."""
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from portanet.backends import gpu
from portanet.errors import KernelBuildError

from conftest import _OPENCL, _SIMULATORS, get_backend

DEVICES = [d for d in _OPENCL + _SIMULATORS if d != "opencl"]


def fresh(spec, precision=None, monkeypatch=None):
    """A new backend on the device `spec` (none of its kernels built in this process), its
    builds counted in `built` (family, options) and a build's name in the test's log."""
    from portanet.backends import opencl
    p, d = map(int, get_backend(spec).name.split(":")[1:])
    bk = opencl.OpenCLBackend(p, d, np.float32, precision)
    bk.built = []
    build = bk.runtime._build_program

    def counted(family, extra):
        bk.built.append((family, tuple(extra)))
        return build(family, extra)
    bk.runtime._build_program = counted
    return bk


@pytest.mark.parametrize("spec", DEVICES)
def test_build_all_builds_each_family_once_and_they_work(spec):
    bk = fresh(spec)
    seen = []
    assert bk.build_all(seen.append) > 0
    wanted = {(f, tuple(bk._options(f, ()))) for f in gpu.FAMILIES}
    assert sorted(bk.built) == sorted(wanted)           # each once
    assert {(f, tuple(o)) for f, o, _ in seen} == wanted
    assert set(gpu.FAMILY_OF) <= set(bk._kernels)
    bk.build_all()
    assert len(bk.built) == len(wanted)                 # nothing again
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    y = np.ones((3, 4), np.float32)
    dx, dy = bk.upload(x), bk.upload(y)
    bk.axpy(2.0, dx, dy)
    assert np.array_equal(bk.download(dy), 2 * x + 1)
    assert bk.built == bk.built[:len(wanted)]           # the op built nothing more


@pytest.mark.parametrize("spec", DEVICES)
def test_16_bit_storage_builds_come_too(spec):
    if "fp16" not in get_backend(spec).precisions:
        pytest.skip(f"{spec} does not compute in fp16")
    bk = fresh(spec, "fp16")
    if bk.storage_dtype is None:
        pytest.skip(f"{spec} keeps fp16 in float32")
    bk.build_all()
    stored = {(f, tuple(bk._options(f, gpu.STORED))) for f in gpu.FAMILIES}
    assert stored <= set(bk.built)
    assert all(((name, "stored") in bk._kernels) for name in gpu.FAMILY_OF)


@pytest.mark.parametrize("spec", DEVICES[:1])
def test_a_program_asked_for_from_several_threads_is_built_once(spec):
    bk = fresh(spec)
    slow = bk.runtime._build_program

    def slower(family, extra):
        time.sleep(0.2)                 # the others ask while it builds
        return slow(family, extra)
    bk.runtime._build_program = slower
    got = []
    threads = [threading.Thread(target=lambda: got.append(bk.runtime.program("conv")))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert bk.built == [("conv", ())] and len(got) == 4 and all(p is got[0] for p in got)


@pytest.mark.parametrize("spec", DEVICES[:1])
def test_a_failed_build_names_its_file_and_the_others_are_kept(spec):
    bk = fresh(spec)
    with pytest.raises(KernelBuildError, match=r"blas\.cl failed to build"):
        bk.runtime.build_many([("elementwise", [], None), ("blas", ["-DGROUP_THREADS=x+"], None),
                               ("conv", [], None)])
    assert ("elementwise", ()) in bk.runtime._programs and ("conv", ()) in bk.runtime._programs


@pytest.mark.parametrize("spec", DEVICES[:1])
def test_a_first_build_says_so_on_stderr_where_logging_is_not_set_up(tmp_path, spec):
    get_backend(spec)
    script = ("import numpy as np, portanet as pn, sys\n"
              "net = pn.lenet(input_shape=(1, 28, 28), device=sys.argv[1])\n"
              "net.predict(np.zeros((2, 1, 28, 28), np.float32))\n")
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path), HOME=str(tmp_path))
    job = subprocess.run([sys.executable, "-c", script, spec], env=env, capture_output=True,
                         text=True, timeout=300)
    assert job.returncode == 0, job.stderr[-2000:]
    assert "building kernels for opencl:" in job.stderr and "first use" in job.stderr


@pytest.mark.parametrize("spec", DEVICES[:1])
def test_the_device_check_says_what_it_is_doing(spec):
    from click.testing import CliRunner
    from portanet.cli import main
    get_backend(spec)
    r = CliRunner().invoke(main, ["devices", "--check", "--device", spec])
    assert r.exit_code == 0, r.output
    said = r.output.splitlines()
    assert said.index(f"{spec}: building its kernels") < said.index(
        f"{spec}: a GEMM, a LeNet training step and each precision against the NumPy "
        f"reference") < len(said) - 1


def _standin_env(tmp_path):
    """A subprocess's environment over the CUDA stand-ins (tests/cuda_standin/ first on
    its path), its caches in tmp_path."""
    standin = Path(__file__).resolve().parent / "cuda_standin"
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path), HOME=str(tmp_path),
               PYTHONPATH=os.pathsep.join([str(standin)] + [
                   p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    env.pop("PORTANET_PRECISION", None)
    return env


@pytest.mark.parametrize("nvrtc", ["1", "0"])
def test_cuda_builds_only_the_family_of_its_first_kernel(tmp_path, nvrtc):
    """Over the stand-ins for pycuda and cuda-bindings (tests/cuda_standin/), by NVRTC or,
    where it is missing, nvcc: a first kernel builds its own family and no other (building
    every family ahead, side by side, made a first LeNet epoch on an H100 slower: 54.7 s
    against 47.7 s); a second process finds its binary on disk and builds nothing."""
    script = ("import json, numpy as np, portanet as pn\n"
              "from pycuda import compiler\n"
              "bk = pn.device('cuda')\n"
              "x = bk.upload(np.arange(12, dtype=np.float32))\n"
              "y = bk.upload(np.ones(12, np.float32))\n"
              "bk.axpy(2.0, x, y)\n"
              "from portanet.backends.runtime import cubins\n"
              "print(cubins.compiler(bk.runtime.arch, bk.runtime.driver)[0])\n"
              "print(json.dumps(compiler.COMPILED))\n")
    env = _standin_env(tmp_path)
    env["STANDIN_NVRTC"] = nvrtc
    runs = []
    for _ in range(2):
        job = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                             text=True, timeout=300)
        assert job.returncode == 0, job.stderr[-3000:]
        *_, which, compiled = job.stdout.strip().splitlines()
        assert which.startswith("nvrtc" if nvrtc == "1" else "nvcc"), which
        runs.append(json.loads(compiled))
    compiled, again = runs
    assert len(compiled) == 1                   # named by its first kernel (the stand-in's)
    assert compiled[0][0] in gpu.FAMILIES[gpu.FAMILY_OF["axpy"]]
    assert again == [] and len(list((tmp_path / "portanet" / "kernels-cuda").iterdir())) == 1


def test_a_first_cuda_training_makes_every_build_in_one_batch(tmp_path):
    """Over the CUDA stand-ins: a LeNet's fit (a last batch smaller than the others), then
    its evaluation and prediction at the training's batch sizes (64, then 44), make every
    build in one batch (the runtime's build_many): the network's creation and its
    optimizer's state build nothing (`clear`), fit's first step and last batch are
    foreseen together, and the evaluation's products are the training forward's."""
    script = ("import ctypes, json, numpy as np\n"
              "class Driver:\n"
              "    def __getattr__(self, name):\n"
              "        call = lambda *args: 0\n"
              "        call.argtypes = call.restype = None\n"
              "        return call\n"
              "real = ctypes.CDLL\n"
              "ctypes.CDLL = lambda name, *a, **k: (Driver() if str(name).startswith('libcuda')\n"
              "                                    else real(name, *a, **k))\n"
              "import portanet as pn\n"
              "from pycuda import compiler\n"
              "from portanet.backends.runtime import cuda\n"
              "batches, many = [], cuda.CudaRuntime.build_many\n"
              "def counted(self, builds, *args, **kw):\n"
              "    builds = list(builds)\n"
              "    batches.append(sum(not self.built(*b) for b in builds))\n"
              "    return many(self, builds, *args, **kw)\n"
              "cuda.CudaRuntime.build_many = counted\n"
              "rng = np.random.default_rng(0)\n"
              "x = rng.standard_normal((300, 1, 28, 28)).astype(np.float32)\n"
              "y = rng.integers(0, 10, 300)\n"
              "net = pn.lenet(device='cuda', seed=0)\n"
              "net.fit(x, y, epochs=1, batch_size=64, verbose=0)\n"
              "net.evaluate(x[:108], y[:108], batch_size=64)\n"
              "net.predict(x[:108], batch_size=64)\n"
              "print(json.dumps([len(compiler.COMPILED), batches]))\n")
    env = _standin_env(tmp_path)
    job = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=300)
    assert job.returncode == 0, job.stderr[-3000:]
    compiled, batches = json.loads(job.stdout.strip().splitlines()[-1])
    assert compiled > 20 and [b for b in batches if b] == [compiled], (compiled, batches)


@pytest.mark.parametrize("spec", [d for d in DEVICES if d not in _SIMULATORS])
def test_routing_builds_its_trials_kernels_together(spec, monkeypatch):
    """Where a backend prebuilds (GPUs; here switched on, with the tiling search, on a CPU
    runtime), routing's trials have their kernels built in batches (the runtime's
    build_many) before any is timed, every tiling's build once, several in the first
    batch; the product is then NumPy's, and c, which the trials wrote, was
    put back before it (beta != 0)."""
    bk = fresh(spec)
    monkeypatch.setattr(bk, "searches_tilings", True)
    monkeypatch.setattr(bk, "prebuilds", True)
    batches, many = [], bk.runtime.build_many
    monkeypatch.setattr(bk.runtime, "build_many", lambda builds, *args, **kw: (
        batches.append([family for family, _, _ in builds]), many(builds, *args, **kw))[1])
    rng = np.random.default_rng(5)
    m, n, k = 37, 70, 600
    a, b, c = (rng.standard_normal(s).astype(np.float32) for s in ((m, k), (n, k), (m, n)))
    C = bk.upload(c)
    with bk.pinned(gemm="auto"):
        bk.gemm(-0.5, bk.upload(a), bk.upload(b), 0.9, C, trans_b=True)
    got, want = bk.download(C), -0.5 * (a.astype(np.float64) @ b.T) + 0.9 * c
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
    gemms = [options for family, options in bk.built if family == "gemm"]
    assert len(gemms) == len(set(gemms)) > 2 and batches
    assert batches[0].count("gemm") >= 3      # the trials' first builds, made together
    assert sum(batch.count("gemm") for batch in batches) == len(gemms)


def test_cuda_builds_by_nvrtc_only_where_it_serves_the_gpu(monkeypatch):
    """NVRTC where it builds for the GPU's architecture and its CUDA is not newer than the
    driver's (whose loader may refuse its binaries); nvcc otherwise, or where it is missing."""
    from portanet.backends.runtime import cubins
    monkeypatch.setattr(cubins, "_nvrtc", lambda: ("nvrtc 13.0", "nvrtc's", {75, 80, 90}, 13))
    monkeypatch.setattr(cubins, "_nvcc", lambda: ("nvcc", "nvcc's"))
    assert cubins.compiler("sm_90") == ("nvrtc 13.0", "nvrtc's")
    assert cubins.compiler("sm_90a", 13000) == ("nvrtc 13.0", "nvrtc's")
    assert cubins.compiler("sm_70") == ("nvcc", "nvcc's")            # not one it builds for
    assert cubins.compiler("sm_90", 12080) == ("nvcc", "nvcc's")     # a driver of an older CUDA
    monkeypatch.setattr(cubins, "_nvrtc", lambda: None)
    assert cubins.compiler("sm_90") == ("nvcc", "nvcc's")


def test_cuda_binaries_are_kept_by_content(tmp_path, monkeypatch):
    """A binary is built once per source, options, architecture and compiler, then read
    from the folder; a folder that cannot be written builds each time and leaves nothing."""
    from portanet.backends.runtime import cubins
    built = []

    def build(text, options, arch, name):
        built.append((text, tuple(options), arch))
        return f"{text} {options} {arch}".encode()
    which = ["nvrtc 13.0"]
    monkeypatch.setattr(cubins, "compiler", lambda arch, driver=None: (which[0], build))
    folder = tmp_path / "kernels-cuda"
    first = cubins.cubin("k", ["-DA=1"], "sm_90", folder)
    assert cubins.cubin("k", ["-DA=1"], "sm_90", folder) == first and len(built) == 1
    for text, options, arch in (("k2", ["-DA=1"], "sm_90"), ("k", ["-DA=2"], "sm_90"),
                                ("k", ["-DA=1"], "sm_90a")):
        cubins.cubin(text, options, arch, folder)
    which[0] = "nvcc 13.0"
    cubins.cubin("k", ["-DA=1"], "sm_90", folder)
    assert len(built) == 5 and len(list(folder.iterdir())) == 5
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    for _ in range(2):
        assert cubins.cubin("k", [], "sm_90", blocked / "cache") == b"k [] sm_90"
    assert len(built) == 7 and sorted(p.name for p in tmp_path.iterdir()) == ["file",
                                                                             "kernels-cuda"]


def test_a_trial_that_fails_leaves_the_outputs_as_they_were():
    """Routing's trials write into the real outputs; where one raises (a build it cannot
    make), the outputs it named are put back before the error goes on, and nothing is
    routed."""
    spec = next((d for d in DEVICES if d not in _SIMULATORS), None)
    if spec is None:
        pytest.skip("no CPU OpenCL runtime here")
    bk = fresh(spec)
    c = np.arange(6, dtype=np.float32)
    C = bk.upload(c)

    def writes_then_fails():
        bk.fill(C, 7.0)
        raise KernelBuildError("a build that fails")
    with pytest.raises(KernelBuildError):
        bk._fastest(("trial",), {"one": lambda: bk.fill(C, 3.0), "two": writes_then_fails},
                    restore=[C])
    assert np.array_equal(bk.download(C), c) and ("trial",) not in bk._routes


def test_a_first_step_has_its_builds_made_together_by_a_dry_run_that_changes_nothing(
        monkeypatch):
    """Where a backend prebuilds (GPUs; here switched on, with the tiling search, on a CPU
    runtime), a network's first training step is first called dry (Backend.prebuild): its
    builds, routing's trials' included, are made in one batch, and the dry call launches
    nothing and changes nothing (parameters, the optimizer's state, the routes); the step
    that follows builds nothing more and computes what the NumPy reference does."""
    import portanet as pn
    spec = next((d for d in DEVICES if d not in _SIMULATORS), None)
    if spec is None:
        pytest.skip("no CPU OpenCL runtime here")
    bk = fresh(spec)
    monkeypatch.setattr(bk, "searches_tilings", True)
    monkeypatch.setattr(bk, "prebuilds", True)
    launches, launch = [], bk._launch
    monkeypatch.setattr(bk, "_launch", lambda *args: (launches.append(args[0]), launch(*args)))
    layers = lambda: [pn.Conv2D(4, 3, activation="relu"), pn.MaxPool2D(2), pn.Flatten(),
                      pn.Dense(5, "softmax")]
    net = pn.Sequential(layers(), input_shape=(1, 9, 9), device=bk, seed=3)
    ref = pn.Sequential(layers(), input_shape=(1, 9, 9), device="cpu", seed=3)
    rng = np.random.default_rng(8)
    x, y = rng.standard_normal((13, 1, 9, 9)).astype(np.float32), rng.integers(0, 5, 13)
    dry = []
    prebuild = bk.prebuild

    def state():
        arrays = [a for _, layer in net.walk() for a in layer.params().values()]
        arrays += list(net.optimizer_state.tensors().values())
        return [bk.download(a) for a in arrays], dict(bk.routes), len(launches)

    def watched(*works):
        before, built = state(), len(bk.built)
        made = prebuild(*works)
        after = state()
        dry.append((made, len(bk.built) - built, before[1:] == after[1:],
                    all(np.array_equal(u, v) for u, v in zip(before[0], after[0]))))
        return made
    monkeypatch.setattr(bk, "prebuild", watched)
    optimizer = pn.SGD(0.1, momentum=0.9)
    before = len(bk.built)                      # the network's creation's (OpenCL's fill)
    with bk.pinned(gemm="auto"):
        net.train_batch(x, y, optimizer)
        assert bk.routes                        # the real step measured its paths
    ref.train_batch(x, y, optimizer)
    (made, built, unchanged, same), *trials = dry
    assert made == built > 3 and unchanged and same
    assert trials and all(m == b == 0 for m, b, _, _ in trials)   # nothing left to build
    assert len(bk.built) == before + made           # the real step built nothing more
    other = fresh(spec)         # what a backend decides by a trial build, it decides first
    with other._dry_run(set()):
        assert "finish_options" in vars(other)      # (cached: not from a noted build)

    def stops():                # a dry run that raises: what it noted is built, no error
        other._run("scal", (1,))
        raise ValueError("met again by the real call")
    monkeypatch.setattr(other, "prebuilds", True)
    assert other.prebuild(stops) == 1 and not other.dry
    assert other.runtime.built(gpu.FAMILY_OF["scal"], other._options("elementwise", ()))
    assert np.allclose(net.predict(x), ref.predict(x), rtol=1e-4, atol=1e-6)
