"""Networks learn, allocate nothing after the first step, save and load across devices,
and give the same results on every backend for the same seed."""
import gc

import numpy as np
import pytest

import portanet as pn
from portanet.data import coordinates


def seed_network(device):
    """The seed's network: 2 -> 30 relu -> 1 sigmoid, binary cross-entropy."""
    return pn.Sequential([pn.Dense(30, "relu"), pn.Dense(1, "sigmoid")], input_shape=2,
                         loss="binary_cross_entropy", device=device, seed=1)


def test_coordinates_reach_95_percent(device_name):
    (x, y), (xt, yt) = coordinates(seed=4)
    net = seed_network(device_name)
    net.fit(x, y, epochs=30, batch_size=32, optimizer=pn.SGD(0.1, 0.9), seed=0)
    loss, acc = net.evaluate(xt, yt)
    assert acc >= 0.95, (loss, acc)
    pred = net.predict_classes(xt)
    assert np.mean(pred == yt[:, 0]) == pytest.approx(acc)


def test_training_step_allocates_nothing_after_the_first(device_name):
    bk = pn.device(device_name)
    net = pn.mlp((20,), classes=5, hidden=(16, 8), device=device_name)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((100, 20)).astype(np.float32), rng.integers(0, 5, 100)
    net.train_batch(x[:32], y[:32])
    gc.collect()            # networks other tests dropped in reference cycles: freed now
    count, live = bk.allocations, bk.allocated_bytes
    for i in range(5):
        net.train_batch(x[i * 10:i * 10 + 32], y[i * 10:i * 10 + 32])
    net.train_batch(x[:7], y[:7])                  # a smaller batch: views, no allocation
    net.fit(x[:96], y[:96], epochs=2, batch_size=32, data_on_device=False)   # (True: below)
    bk.synchronize()
    assert (bk.allocations, bk.allocated_bytes) == (count, live)


def test_partial_last_batch_is_trained():
    """67 samples in batches of 32: the last batch of 3 takes part (loss sums over 67)."""
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((67, 4)).astype(np.float32), rng.integers(0, 3, 67)
    net = pn.mlp((4,), classes=3, hidden=(5,), device="cpu")
    h = net.fit(x, y, epochs=1, batch_size=32, shuffle=False, optimizer=pn.SGD(0.1))
    ref = pn.mlp((4,), classes=3, hidden=(5,), device="cpu")
    losses = []
    for i in range(0, 67, 32):
        losses.append(ref.evaluate(x[i:i + 32], y[i:i + 32])[0] * len(x[i:i + 32]))
        ref.train_batch(x[i:i + 32], y[i:i + 32], pn.SGD(0.1))
    assert h["loss"][0] == pytest.approx(sum(losses) / 67, rel=1e-5)
    assert np.allclose(net.layers[0].w, ref.layers[0].w)


def test_same_seed_same_results_on_every_device(device_name):
    """Against the float64 reference, so that the cpu case compares two computations too."""
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((300, 12)).astype(np.float32), rng.integers(0, 4, 300)
    nets = [pn.mlp((12,), classes=4, hidden=(9, 7), activation="tanh", device=d, seed=5,
                   dtype=dtype) for d, dtype in (("cpu", "float64"), (device_name, "float32"))]
    for net in nets:
        net.fit(x, y, epochs=3, batch_size=25, optimizer=pn.SGD(0.05, 0.9), seed=7)
    p_ref, p = (net.predict(x) for net in nets)
    assert 0 < np.abs(p - p_ref).max() < 1e-4


def test_save_load_across_devices(device_name, tmp_path):
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((50, 6)).astype(np.float32), rng.integers(0, 3, 50)
    net = pn.mlp((6,), classes=3, hidden=(8,), device=device_name)
    net.fit(x, y, epochs=2, batch_size=16)
    path = tmp_path / "net.safetensors"
    net.save(path)
    loaded = pn.load(path, device="cpu", dtype="float64")      # another backend, also for cpu
    assert loaded.backend is not net.backend
    assert np.abs(loaded.predict(x) - net.predict(x)).max() < 1e-6
    back = pn.load(path, device=device_name)
    assert np.array_equal(back.predict(x), net.predict(x))


def test_inference_uses_the_trained_parameters_without_a_copy(device_name):
    """predict reads the very arrays training updates: it allocates nothing for them, and
    a change to w shows in the next prediction."""
    net = pn.mlp((3,), classes=2, hidden=(4,), device=device_name)
    x = np.random.default_rng(6).standard_normal((5, 3)).astype(np.float32)
    before = net.predict(x)
    bk, w = net.backend, net.layers[0].w
    count = bk.allocations
    bk.fill(w, 0.0)                        # hidden layer: relu(0 x + b) = relu(b) for all x
    after = net.predict(x)
    assert bk.allocations == count
    assert not np.allclose(before, after) and np.allclose(after, after[0])


def test_fashion_mnist_subset_learns(device_name):
    """A quick look at real data; the full 5-epoch run is in the README and closing notes."""
    try:
        (x, y), (xt, yt) = pn.load_dataset("fashion-mnist", flatten=True)
    except pn.DataError as e:
        pytest.skip(str(e))
    net = pn.mlp(device=device_name, hidden=(64,))
    net.fit(x[:6000], y[:6000], epochs=2, batch_size=64, optimizer=pn.SGD(0.02, 0.9))
    _, acc = net.evaluate(xt[:2000], yt[:2000])
    assert acc > 0.75
