"""A backend is shared by every network built on its device string, so it must be safe to
use from several threads at once: two threads training their own networks on one OpenCL
device get bit for bit the results of the same trainings run one after the other."""
import gc
import sys
import threading

import numpy as np
import pytest

import portanet as pn
from portanet import backends
from portanet.errors import DeviceError

# a CNN whose conv weight gradient (4 x 9 outputs, K = 100 per sample) is one tile, so our
# GEMM splits its K (split-K workspace, then gemm_split_sum) on a device of >= 2 compute
# units; im2col, col2im and max-pool run too. An MLP of other shapes in the other thread.
JOBS = [("conv(4, 3, relu) maxpool(2) flatten dense(5, softmax)", (1, 12, 12), 1),
        ("conv(3, 3, tanh) maxpool(2) flatten dense(16, relu) dense(5, softmax)", (1, 12, 12), 2),
        ("dense(24, relu) dense(5, softmax)", (20,), 3)]
TRIALS = 10


def gpu_backend(device, gemm):
    try:
        bk = pn.device(device)
    except DeviceError as e:
        pytest.skip(f"no {device} device here: {e}")
    module = sys.modules[type(bk).__module__]
    if gemm == "vendor" and getattr(module, "pyclblast" if device == "opencl" else "cublas") is None:
        pytest.skip(f"no vendor GEMM for {device} installed")
    return bk


def train(job, batch, device):
    """Build one network of `job` on the shared backend of `device`, train it 3 steps and
    return its predictions and weights as NumPy arrays."""
    description, shape, seed = job
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((3 * batch, *shape)).astype(np.float32)
    y = rng.integers(0, 5, 3 * batch)
    net = pn.from_description(description, shape, device=device, seed=seed)
    net.fit(x, y, epochs=1, batch_size=batch, shuffle=False, optimizer=pn.SGD(0.05, 0.9))
    out = [net.predict(x[:batch])]
    out += [net.backend.download(layer.w) for layer in net.layers
            if getattr(layer, "w", None) is not None]
    net.free()
    return out


def together(*work):
    """The results of the callables `work`, each run in its own thread, all started at
    once; the first exception of any is raised here."""
    start = threading.Barrier(len(work))
    results, errors = [None] * len(work), []

    def run(i):
        try:
            start.wait()
            results[i] = work[i]()
        except BaseException as e:        # noqa: B036 -- raised again in the caller
            start.abort()
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(work))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


@pytest.mark.parametrize("device", ["opencl", "cuda"])
@pytest.mark.parametrize("gemm", ["own", "vendor"])
@pytest.mark.parametrize("batch", [32, 128])
def test_two_threads_on_one_device_match_sequential(device, gemm, batch, monkeypatch):
    bk = gpu_backend(device, gemm)
    monkeypatch.setattr(bk, "gemm_path", gemm)
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)        # switch threads often: interleave launches finely
    try:
        for pair in (JOBS[:2], JOBS[1:]):            # CNN + CNN, then CNN + MLP
            expected = [train(job, batch, device) for job in pair]
            for trial in range(TRIALS):
                got = together(*(lambda job=job: train(job, batch, device) for job in pair))
                for job, want, have in zip(pair, expected, got):
                    for k, (w, h) in enumerate(zip(want, have)):
                        assert np.array_equal(w, h), (
                            f"trial {trial}, {job[0]!r}, {device}, batch {batch}, gemm {gemm}: output "
                            f"{k} differs from the sequential run in {np.sum(w != h)} of "
                            f"{w.size} values")
    finally:
        sys.setswitchinterval(old_interval)


def test_device_registry_makes_one_backend_per_device_under_threads(monkeypatch):
    """Threads asking for the same device at once get one backend (one context), not one
    each."""
    gpu_backend("opencl", "own")
    monkeypatch.setattr(backends, "_instances", {})
    got = together(*[lambda: pn.device("opencl")] * 4)
    assert all(b is got[0] for b in got)


def test_cpu_accounting_under_threads():
    """The counters stay exact when threads allocate, free and drop arrays at once (the
    drops are released by finalizers, in whichever thread collects them)."""
    bk = pn.device("cpu")
    gc.collect()
    before = (bk.allocations, bk.allocated_bytes)
    threads, rounds = 4, 2000

    def churn():
        for _ in range(rounds):
            kept, dropped = bk.empty((3,)), bk.empty((5,))
            bk.free(kept)
            del dropped

    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        together(*[churn] * threads)
    finally:
        sys.setswitchinterval(old_interval)
    gc.collect()
    assert bk.allocations == before[0] + 2 * threads * rounds
    assert bk.allocated_bytes == before[1]
