"""A backend is shared by every network built on its device string, so it must be safe to
use from several threads at once: two threads training their own networks on one OpenCL
device get bit for bit the results of the same trainings run one after the other. One
network used from several threads runs their calls one at a time, and free() waits for
the call that runs."""
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
def test_two_threads_on_one_device_match_sequential(device, gemm, batch):
    bk = gpu_backend(device, gemm)
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)        # switch threads often: interleave launches finely
    try:
        with bk.pinned(gemm=gemm):
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


# -- one network, several threads: one call at a time ----------------------------------------

def small_net(device, seed=0):
    try:
        return pn.from_description("dense(16, relu) dense(3, softmax)", (6,), device=device,
                                   seed=seed)
    except DeviceError as e:
        pytest.skip(f"no {device} device here: {e}")


def paused_forward(net, inside, pause=0.2):
    """Make net's forward pass in this thread (the one that calls this) set `inside` and
    wait `pause` seconds, the first time, so that another thread's call comes while it
    runs; the network's other threads run it as it is."""
    forward, caller = net._forward, threading.get_ident()

    def slow(*args, **kwargs):
        if threading.get_ident() == caller and not inside.is_set():
            inside.set()
            threading.Event().wait(pause)
        return forward(*args, **kwargs)
    net._forward = slow


@pytest.mark.parametrize("device", ["cpu", "opencl:pocl", "opencl:intel"])
def test_free_waits_for_another_threads_predict(device):
    """free() from another thread while predict runs (which freed the buffers under the
    kernels: SIGSEGV on PoCL, a failed launch on Intel's OpenCL, NaN on cpu) waits for
    predict to end; later calls are refused, naming free()."""
    net = small_net(device)
    x = np.random.default_rng(0).standard_normal((40, 6)).astype(np.float32)
    want = net.predict(x)
    inside = threading.Event()

    def predict():
        paused_forward(net, inside)
        return net.predict(x)

    def free():
        assert inside.wait(10)
        net.free()

    got, _ = together(predict, free)
    assert np.array_equal(got, want)
    with pytest.raises(pn.PortanetError, match=r"free\(\)"):
        net.predict(x)


def test_fit_and_predict_from_two_threads_give_a_serial_result():
    """predict in one thread while fit runs in another: fit's weights and predict's outputs
    are those of one order of the two calls (predict came first, so fit waits), bit for
    bit, though fit and predict bind batches of other sizes."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((30, 6)).astype(np.float32)
    y = rng.integers(0, 3, 30)
    serial = small_net("cpu")
    want_predict = serial.predict(x)
    serial.fit(x, y, epochs=2, batch_size=4)
    want_weights = serial.get_weights()

    net = small_net("cpu")
    inside = threading.Event()

    def predict():
        paused_forward(net, inside)
        return net.predict(x)

    def fit():
        assert inside.wait(10)
        net.fit(x, y, epochs=2, batch_size=4)
        return net.get_weights()

    got_predict, got_weights = together(predict, fit)
    assert np.array_equal(got_predict, want_predict)
    for name, w in want_weights.items():
        assert np.array_equal(got_weights[name], w), name


def test_threads_sharing_one_network_match_a_serial_run():
    """fit, predict and evaluate on one network from three threads at once, switched often:
    fit ends on the weights of fit alone, and predict and evaluate give what they give
    before or after it."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((24, 6)).astype(np.float32)
    y = rng.integers(0, 3, 24)
    serial = small_net("cpu")
    before = serial.predict(x[:7]), serial.evaluate(x[:10], y[:10], batch_size=3)
    serial.fit(x, y, epochs=2, batch_size=5)
    after = serial.predict(x[:7]), serial.evaluate(x[:10], y[:10], batch_size=3)
    want = serial.get_weights()
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for trial in range(5):
            net = small_net("cpu")

            def fit():
                net.fit(x, y, epochs=2, batch_size=5)
                return net.get_weights()

            def infer():
                return [(net.predict(x[:7]), net.evaluate(x[:10], y[:10], batch_size=3))
                        for _ in range(6)]

            weights, seen = together(fit, infer)
            assert all(np.array_equal(weights[k], w) for k, w in want.items()), trial
            for p, e in seen:           # (fit may come between the two)
                assert any(np.array_equal(p, r[0]) for r in (before, after)), trial
                assert e in (before[1], after[1]), trial
    finally:
        sys.setswitchinterval(old_interval)
