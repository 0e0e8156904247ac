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


def test_a_plain_input_of_two_axes_is_flattened_as_before(rng):
    """Only Embedding's output (and what follows it) is a sequence: floats of (N, A, B)
    go into Dense flattened, as they always did."""
    net = pn.mlp((6, 5), classes=3, hidden=(8,), device="cpu")
    assert net.layers[0].w.shape == (8, 30) and net.output_shape == (3,)
    x = rng.standard_normal((4, 6, 5)).astype(np.float32)
    net.fit(x, np.array([0, 1, 2, 0]), epochs=1, verbose=0)
    assert net.predict(x).shape == (4, 3)


def test_a_sequence_of_one_token_is_still_a_sequence(rng):
    net = pn.gpt(VOCAB, 1, layers=1, heads=1, dim=4, dropout=0.0, device="cpu")
    x = rng.integers(0, VOCAB, (3, 1))
    assert net.predict(x).shape == (3, 1, VOCAB)
    assert net.generate([1, 2], 3, seed=0).shape == (5,)


def test_what_a_sequence_output_refuses(rng):
    with pytest.raises(ShapeError, match="loss='softmax_cross_entropy' \\(a class per token\\)"):
        pn.Sequential([pn.Embedding(VOCAB, 4), pn.Dense(1, "sigmoid")], (T,),
                      loss="binary_cross_entropy", device="cpu")
    x, y = task(rng, 8)
    net = network()
    before = net.get_weights()["0.table"].copy()
    with pytest.raises(InputError, match="sent with each batch"):
        net.fit(x, y, epochs=1, verbose=0, data_on_device=True)
    assert np.array_equal(net.get_weights()["0.table"], before)


def test_a_buffer_beyond_32_bit_indices_is_refused_by_name():
    """A GPT-2-sized vocabulary over long windows makes logits of more elements than the
    kernels' 32-bit indices reach: refused before anything is allocated, naming the
    buffer (where the host could hold it at all)."""
    net = pn.Sequential([pn.Embedding(50000, 8), pn.Dense(50000, "softmax")], (1024,),
                        device="cpu")
    try:
        if not net.memory_plan(48).fits:
            pytest.skip("this machine cannot hold the buffers the test needs refused")
        with pytest.raises(ShapeError, match=r"_z would hold 2,457,600,000 elements"):
            net.predict(np.zeros((48, 1024), int), batch_size=48)
    finally:
        net.free()              # now, not when a later test's allocations are counted
