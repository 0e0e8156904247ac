"""Sequences end to end: token ids through Embedding, Dense and LayerNorm a token at a
time, to a class per token (softmax cross-entropy, the mean over every token, as PyTorch's
cross_entropy over (N T) tokens). Outputs (N, T, classes); targets (N, T); each device
trains as the NumPy reference does; what a sequence network refuses."""
import numpy as np
import pytest

import portanet as pn
from portanet.errors import InputError, ShapeError

T, VOCAB = 6, 7


def network(device="cpu", dtype="float32", seed=0):
    return pn.Sequential([pn.Embedding(VOCAB, 8, positions=True), pn.LayerNorm(),
                          pn.Residual([pn.Dense(8, "gelu"), pn.Dense(8)]), pn.LayerNorm(),
                          pn.Dense(VOCAB, "softmax")], (T,), device=device, dtype=dtype,
                         seed=seed)


def task(rng, n):
    """Each token's class a function of the token and its position."""
    x = rng.integers(0, VOCAB, (n, T))
    return x, (x * 3 + np.arange(T)) % VOCAB


def test_outputs_loss_and_accuracy_are_per_token(rng):
    net = network(dtype="float64")
    x, y = task(rng, 9)
    p = net.predict(x)
    assert p.shape == (9, T, VOCAB)
    np.testing.assert_allclose(p.sum(axis=-1), 1)
    assert net.predict_classes(x).shape == (9, T)
    loss, accuracy = net.evaluate(x, y)
    want = -np.log(np.take_along_axis(p, y[..., None], -1)).mean()
    assert loss == pytest.approx(want, rel=1e-12)
    assert accuracy == pytest.approx((p.argmax(-1) == y).mean(), rel=1e-12)


def test_it_learns_and_each_device_trains_as_the_reference(rng, device_name):
    x, y = task(rng, 256)
    runs = {}
    for device in ("cpu", device_name):
        net = network(device)
        net.fit(x, y, epochs=20, batch_size=32, optimizer=pn.Adam(0.01), verbose=0, seed=1)
        runs[device] = net.evaluate(x, y)
    assert runs["cpu"][1] > 0.9                 # from 1 / 7 by chance
    assert runs[device_name][0] == pytest.approx(runs["cpu"][0], rel=1e-3, abs=1e-4)


def test_it_saves_and_loads(rng, tmp_path):
    net = network()
    x, _ = task(rng, 5)
    net.save(tmp_path / "seq.safetensors")
    back = pn.load(tmp_path / "seq.safetensors")
    assert np.array_equal(back.predict(x), net.predict(x))


def test_targets_are_a_label_per_token(rng):
    net = network()
    x, y = task(rng, 4)
    with pytest.raises(ShapeError, match=r"a class label per token, \(N, 6\), got \(4,\)"):
        net.evaluate(x, y[:, 0])
    y[2, 3] = VOCAB
    with pytest.raises(InputError, match="label 7 at sample 2, token 3 is out of range"):
        net.evaluate(x, y)


def test_what_a_sequence_output_refuses(rng):
    with pytest.raises(ShapeError, match="loss='softmax_cross_entropy' \\(a class per token\\)"):
        pn.Sequential([pn.Embedding(VOCAB, 4), pn.Dense(1, "sigmoid")], (T,),
                      loss="binary_cross_entropy", device="cpu")
    x, y = task(rng, 8)
    with pytest.raises(InputError, match="sent with each batch"):
        network().fit(x, y, epochs=1, verbose=0, data_on_device=True)
