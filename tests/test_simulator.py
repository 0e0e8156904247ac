"""The Oclgrind simulator checks what portanet does, not its own bookkeeping: a host write
into part of a buffer is tracked byte for byte (Oclgrind's uninitialised-value check, left
to itself, takes such a write's bytes and the rest of the buffer for uninitialised), so a
training step and `portanet devices --check` report nothing there, while a read of bytes
nothing wrote is still reported; and the check runs the simulator with its checks on
whatever opened it first."""
import os

import numpy as np
import pytest

import portanet as pn
from conftest import OCLGRIND_LOG, SIMULATOR, get_backend, oclgrind_log
from portanet import backends, check
from portanet.backends import opencl
from portanet.errors import DeviceError


@pytest.fixture
def sim():
    return get_backend(SIMULATOR)


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
@pytest.mark.parametrize("offset,n", [(5, 4), (0, 4), (3, 9)])
def test_a_write_into_part_of_a_buffer_is_initialised_there(sim, dtype, offset, n):
    """A buffer written whole, then n elements at offset: a kernel reads the new elements
    and the old ones around them, and the simulator reports nothing (it took the new ones
    for uninitialised where offset > 0, and the old ones past n in every case)."""
    old = np.arange(100, 112).astype(dtype)
    new = np.arange(n).astype(dtype)
    want = old.copy()
    want[offset:offset + n] = new
    with oclgrind_log():
        base = sim.upload(old)
        sim.write(sim.view(base, (n,), offset), new)
        out = sim.empty((12,), dtype)
        if dtype == np.float32:
            sim.copy(base, out)
        else:                           # labels, gathered by index
            sim.gather(out, base, sim.upload(np.arange(12, dtype=np.int32)))
        assert np.array_equal(sim.download(out), want)


def test_bytes_nothing_wrote_are_still_reported(sim):
    """A write into part of a never-written buffer makes only its own bytes initialised: a
    read of the others is reported as before. In a context of its own: Oclgrind reuses the
    memory of released buffers with what it knew of it, so after other tests a new buffer
    of the shared backend can read as initialised."""
    p, d = map(int, sim.name.split(":")[1:])
    sim = opencl.OpenCLBackend(p, d)
    base = sim.empty((12,))
    sim.write(sim.view(base, (4,), 5), np.ones(4, np.float32))
    out = sim.empty((5,))
    report = opencl.SimulatorReport(OCLGRIND_LOG)
    sim.copy(sim.view(base, (5,), 0), out)
    sim.synchronize()
    assert "Uninitialized" in report.read()


@pytest.mark.parametrize("lane", ["plain", "lane"])
def test_write_samples_through_both_halves_of_staging_reports_nothing(sim, monkeypatch, lane):
    """A batch in parts of two samples, in turn through the halves of a staging buffer that
    is itself a view at an offset, by plain writes or by the copy lane's (a plain write
    on the simulator too), laid out by features_first."""
    from portanet.backends import gpu
    monkeypatch.setattr(gpu, "LANE_BYTES", {"plain": 2**62, "lane": 0}[lane])
    n, m = 3, 7
    x = np.random.default_rng(1).standard_normal((m, n))
    with oclgrind_log():
        staging = sim.view(sim.empty((4 * n + 3,)), (4 * n,), 3)
        dst = sim.empty((n, m))
        sim.write_samples(dst, x, staging)
        assert np.array_equal(sim.download(dst), x.T.astype(np.float32))


def test_a_training_step_on_the_simulator_reports_nothing(sim):
    """train_batch sends its batch through the halves of the staging buffer in turn (the
    first into the second half, at an offset), predict in parts at offsets of the input."""
    rng = np.random.default_rng(0)
    x = rng.random((3, 5), dtype=np.float32)
    y = rng.integers(0, 3, 3)
    with oclgrind_log():
        net = pn.Sequential([pn.Dense(4, activation="relu"), pn.Dense(3, activation="softmax")],
                            input_shape=(5,), device=sim, seed=0)
        ref = pn.Sequential([pn.Dense(4, activation="relu"), pn.Dense(3, activation="softmax")],
                            input_shape=(5,), device="cpu", seed=0)
        for _ in range(2):
            net.train_batch(x, y, pn.SGD(0.1))
            ref.train_batch(x, y, pn.SGD(0.1))
        assert np.allclose(net.predict(x), ref.predict(x), atol=1e-6)
        net.free()


def test_the_check_passes_on_the_simulator(sim, monkeypatch):
    """What `portanet devices --check` runs, on shapes small enough for a test: a gemm
    and a LeNet step (on 6 x 6 images, the least its layers take) and one timed step."""
    monkeypatch.setattr(check, "GEMM_SHAPE", (5, 7, 9))
    monkeypatch.setattr(check, "STEP_IMAGE", (1, 6, 6))
    monkeypatch.setattr(check, "STEP_REPEATS", 1)
    r = check.check_device(sim)
    assert r.passed, r.failures


def test_the_check_turns_the_simulators_checks_on_before_it_opens_a_device(monkeypatch):
    """`--device opencl:oclgrind` names the simulator otherwise than the list does, so the
    check opens it to learn its name: with the checks on, or its context would have none
    (Oclgrind reads them when a context is made) and every check of it pass."""
    names = ("OCLGRIND_DATA_RACES", "OCLGRIND_UNINITIALIZED", "OCLGRIND_LOG")
    for name in names:
        monkeypatch.delenv(name, raising=False)
    seen = []

    def device(spec, *args, **kwargs):
        seen.append({name: os.environ.get(name) for name in names})
        raise DeviceError("not opened in this test")
    monkeypatch.setattr(backends, "device", device)
    check.targets(["opencl:oclgrind"])
    assert seen and seen[0]["OCLGRIND_UNINITIALIZED"] == "1" \
        and seen[0]["OCLGRIND_DATA_RACES"] == "1" and seen[0]["OCLGRIND_LOG"]


def test_a_simulator_opened_without_the_checks_fails_saying_so(sim, monkeypatch):
    """A simulator whose context was made before the checks were on (by other code in the
    process) checked nothing: the check says so rather than pass it."""
    monkeypatch.delenv("OCLGRIND_UNINITIALIZED")
    p, d = map(int, sim.name.split(":")[1:])
    unchecked = opencl.OpenCLBackend(p, d)
    monkeypatch.setenv("OCLGRIND_UNINITIALIZED", "1")
    monkeypatch.setattr(check, "check_gemm", lambda bk, rng: 0.0)
    monkeypatch.setattr(check, "check_step", lambda bk, rng, seed: (0.0, "0.w", 1.0))
    r = check.check_device(unchecked)
    assert not r.passed
    assert any(f.startswith("simulator: ") and "OCLGRIND_UNINITIALIZED" in f
               for f in r.failures), r.failures
