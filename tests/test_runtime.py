"""The runtime contract (backends/runtime/): its verbs called directly on each device that
has a runtime (every OpenCL device, the simulator with its checks on, CUDA), and the
backends' way of holding one: the ops reach the device through the runtime's own bound
methods, and no module above the runtimes imports a driver."""
import ast
import inspect
from pathlib import Path

import numpy as np
import pytest

import portanet
from portanet.backends import sources
from portanet.backends.runtime import Recorded, Runtime
from conftest import _SIMULATORS, KERNEL_DEVICES, get_backend, oclgrind_log

RUNTIME_DEVICES = [d for d in KERNEL_DEVICES if d != "cpu"]
BACKENDS = Path(portanet.__file__).resolve().parent / "backends"
DRIVERS = ("pyopencl", "pycuda", "pyclblast", "nvmath")
# the verbs a backend's ops call, taken from its runtime as they are (KernelBackend._attach)
BOUND = {"_launch": "launch", "_kernel": "kernel", "_pointer": "pointer",
         "_free_buffer": "free_buffer", "_send": "send", "_laid_out": "laid_out",
         "_marker": "marker", "_elapsed": "elapsed", "_device_id": "device_id"}


@pytest.fixture(params=RUNTIME_DEVICES)
def runtime(request):
    bk = get_backend(request.param)
    if request.param in _SIMULATORS:
        with oclgrind_log():
            yield bk.runtime
    else:
        yield bk.runtime


def _scal(rt, x, alpha):
    """elementwise.cl's scal (x <- alpha x) built and launched through the runtime alone."""
    kernel = rt.kernel("elementwise", "scal")
    args = [rt.pointer(x), np.int32(x.offset), rt.backend.dtype.type(alpha), np.int32(x.size)]
    return kernel, args


def test_every_verb_is_the_runtimes_own(runtime):
    rt, bk = runtime, runtime.backend
    assert isinstance(rt, Runtime) and bk.runtime is rt
    verbs = [name for name, value in vars(Runtime).items() if not name.startswith("_")
             and (isinstance(value, (staticmethod, property)) or inspect.isfunction(value))]
    assert len(verbs) >= 12, verbs
    for name in verbs:
        assert inspect.getattr_static(type(rt), name) is not vars(Runtime)[name], \
            f"{type(rt).__name__} does not implement {name}"
    for mine, theirs in BOUND.items():
        assert getattr(bk, mine) == getattr(rt, theirs), f"bk.{mine} is not rt.{theirs}"
    assert bk._launch.__self__ is rt             # the ops' launches: no frame in between
    assert bk.cache_dir == rt.cache_dir and bk._lock is rt.lock


def test_allocate_write_read_free(runtime):
    rt, bk = runtime, runtime.backend
    before, made = bk.allocated_bytes, bk.allocations
    x = rt.empty((3, 5), np.float32, label="runtime test")
    assert x.shape == (3, 5) and x.dtype == np.float32 and x.offset == 0
    assert bk.allocated_bytes == before + 60 and bk.allocations == made + 1
    host = np.arange(15, dtype=np.float32).reshape(3, 5)
    rt.write(x, host)
    assert np.array_equal(rt.download(x), host)
    part = bk.view(x, (4,), 6)                  # a copy in at an offset
    rt.write(part, np.full(4, -1, np.float32), wait=False)
    rt.synchronize()
    want = host.copy().reshape(-1)
    want[6:10] = -1
    out = np.empty((3, 5), np.float32)
    rt.download_into(x, out)
    rt.synchronize()
    assert np.array_equal(out.reshape(-1), want)
    assert np.array_equal(rt.download(part), np.full(4, -1, np.float32))
    bk.free(x)                                   # the accounting hands the buffer back
    assert bk.allocated_bytes == before


def test_compile_once_and_launch(runtime, monkeypatch):
    rt = runtime
    loads = []
    real_load = sources.load
    monkeypatch.setattr(sources, "load", lambda family, lang: loads.append(family) or
                        real_load(family, lang))
    options = ["-DPORTANET_RUNTIME_TEST=1"]     # a build of its own, whatever ran before
    first = rt.kernel("elementwise", "scal", options)
    again = rt.kernel("elementwise", "scal", options)
    rt.kernel("elementwise", "axpy", options)    # another kernel of the same build
    assert loads == ["elementwise"], loads
    assert first is not None and again is not None
    host = np.arange(1, 301, dtype=rt.backend.dtype)
    x = rt.backend.upload(host)
    kernel, args = _scal(rt, x, 0.5)
    rt.launch(kernel, (x.size,), None, args)     # the default work-group
    rt.launch(first, (x.size,), (32,), args)    # a group asked for
    assert np.array_equal(rt.download(x), host * 0.25)
    with pytest.raises(portanet.errors.KernelBuildError, match=r"elementwise"):
        rt.kernel("elementwise", "scal", ["-DREAL=not_a_type"])


def test_capture_records_and_replays(runtime):
    rt, bk = runtime, runtime.backend
    x = bk.upload(np.ones(40, bk.dtype))
    kernel, args = _scal(rt, x, 2.0)
    rt.launch(kernel, (x.size,), None, args)     # built and bound, as before a step is recorded
    replay = rt.capture(lambda: rt.launch(kernel, (x.size,), None, args))
    assert isinstance(replay, Recorded) and replay.current
    assert np.array_equal(rt.download(x), np.full(40, 2, bk.dtype))     # recorded, not run
    replay()
    replay()
    assert np.array_equal(rt.download(x), np.full(40, 8, bk.dtype))
    if bk.kind == "opencl":                      # a copy cannot be replayed: not recorded
        assert rt.capture(lambda: rt.download(x)) is None
        assert np.array_equal(rt.download(x), np.full(40, 8, bk.dtype))
    bk.generation += 1                           # what it points at went away
    assert not replay.current
    bk.generation -= 1


def test_markers_time_the_queue(runtime):
    rt, bk = runtime, runtime.backend
    x = bk.upload(np.ones(64, bk.dtype))
    kernel, args = _scal(rt, x, 1.0)
    with rt.profiling():
        start = rt.marker()
        rt.launch(kernel, (x.size,), None, args)
        end = rt.marker()
        assert rt.elapsed(start, end) >= 0
    rt.synchronize()


def test_memory_info(runtime):
    rt, bk = runtime, runtime.backend
    free, total = rt.memory_info()
    assert 0 <= free <= total and total > 0
    assert bk.memory_info() == (free, total) or bk.kind == "cuda"    # others' use moves it
    if bk.kind == "opencl":                      # what this backend holds, counted exactly
        x = rt.empty((1000,), np.float32)
        assert rt.memory_info() == (free - 4000, total)
        bk.free(x)
        assert rt.memory_info() == (free, total)


def _imports(path):
    """Every module `path` imports, anywhere in its text (inside functions too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found.add(node.module or "")
    return found


def test_only_runtimes_and_vendor_backends_import_a_driver():
    """The op modules (gpu.py, conv.py, shadows.py, gemm/, ops/) reach the device through
    the runtime's verbs only: none imports pyopencl, pycuda or a vendor BLAS (the runtimes
    and opencl.py / cuda.py do)."""
    ops = [BACKENDS / name for name in ("gpu.py", "conv.py", "shadows.py")]
    assert all(path.exists() for path in ops)
    ops += sorted((BACKENDS / "gemm").glob("*.py")) + sorted((BACKENDS / "ops").glob("*.py"))
    assert len(ops) > 10, ops
    for path in ops:
        drivers = {m for m in _imports(path) if m.split(".")[0] in DRIVERS}
        assert not drivers, f"{path.relative_to(BACKENDS)} imports {sorted(drivers)}"
    # the check sees a driver where there is one
    assert "pyopencl" in _imports(BACKENDS / "runtime" / "opencl.py")
    assert "pycuda.driver" in _imports(BACKENDS / "runtime" / "cuda.py")
