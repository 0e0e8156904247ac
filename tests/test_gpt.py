"""pn.gpt, a language model from the sequence layers, and net.generate: nanoGPT's sizes, a
small GPT that learns a text on each device as on the reference and continues it, and
what generate refuses."""
import numpy as np
import pytest

import portanet as pn
from portanet.errors import InputError, ShapeError

TEXT = "the cat sat on the mat. " * 6
CHARS = sorted(set(TEXT))
T = 8


def windows(text=TEXT):
    ids = np.array([CHARS.index(c) for c in text])
    starts = np.arange(len(ids) - T)
    return (np.stack([ids[s:s + T] for s in starts]),
            np.stack([ids[s + 1:s + T + 1] for s in starts]))


def small(device="cpu", dropout=0.0):
    return pn.gpt(len(CHARS), T, layers=1, heads=2, dim=16, dropout=dropout, device=device,
                  seed=0)


def test_nanogpt_s_baby_gpt_has_its_parameters():
    net = pn.gpt(65, 256, device="cpu")
    assert sum(v.size for v in net.get_weights().values()) == 10_795_841
    attention = [l for _, l in pn.layers.walk(net.layers)
                 if isinstance(l, pn.MultiHeadAttention)]
    assert len(attention) == 6 and attention[0].heads == 6 and attention[0].causal
    assert net.output_shape == (65, 256)


def test_a_small_gpt_learns_a_text_and_continues_it(device_name):
    x, y = windows()
    runs = {}
    for device in ("cpu", device_name):
        net = small(device)
        net.fit(x, y, epochs=25, batch_size=16, optimizer=pn.AdamW(0.01), verbose=0, seed=2)
        runs[device] = net
    loss, accuracy = runs["cpu"].evaluate(x, y)
    assert accuracy > 0.9
    assert runs[device_name].evaluate(x, y)[0] == pytest.approx(loss, rel=2e-3, abs=1e-4)
    prompt = [CHARS.index(c) for c in "the c"]
    out = runs[device_name].generate(prompt, 12, top_k=1)          # the likeliest each time
    assert "".join(CHARS[i] for i in out) == "the cat sat on th"


def test_generate_draws_from_the_distribution_it_is_given():
    net = small()
    prompt = np.array([[0, 1], [2, 3]])
    a = net.generate(prompt, 20, temperature=1.5, seed=7)
    assert a.shape == (2, 22) and np.array_equal(a[:, :2], prompt)
    assert np.array_equal(a, net.generate(prompt, 20, temperature=1.5, seed=7))
    assert not np.array_equal(a, net.generate(prompt, 20, temperature=1.5, seed=8))
    assert set(net.generate([1], 30, top_k=2, seed=0)[1:]) <= set(range(len(CHARS)))
    long = net.generate(list(range(len(CHARS))) * 2, 3, top_k=1)    # beyond the context
    assert long.shape == (2 * len(CHARS) + 3,)


def test_what_generate_refuses():
    net = small()
    with pytest.raises(InputError, match="temperature must be a positive number"):
        net.generate([1], 2, temperature=0)
    with pytest.raises(InputError, match="top_k"):
        net.generate([1], 2, top_k=0)
    with pytest.raises(InputError, match=r"token id 99 at sample 0, position 1"):
        net.generate([1, 99], 2)
    with pytest.raises(ShapeError, match="give token ids"):
        net.generate(np.zeros((1, 1, 1), int), 2)
    with pytest.raises(InputError, match="takes a language model"):
        pn.mlp((4,), classes=2, device="cpu").generate([1], 2)


def test_a_description_builds_the_sequence_layers():
    net = pn.from_description("embedding(5, 4, positions=true) residual(layernorm "
                              "attention(2, causal=false)) dense(5, softmax)", (6,),
                              device="cpu")
    kinds = [type(l).__name__ for _, l in pn.layers.walk(net.layers)]
    assert kinds == ["Embedding", "Residual", "LayerNorm", "MultiHeadAttention", "Dense"]
    assert net.layers[0].positions and not net.layers[1].layers[1].causal


def test_dropouts_of_one_seed_draw_masks_of_their_own():
    net = small(dropout=0.5)
    x, y = windows()
    net.fit(x[:4], y[:4], epochs=1, batch_size=4, verbose=0)
    keys = [l.key for _, l in pn.layers.walk(net.layers) if isinstance(l, pn.Dropout)]
    assert len(keys) == 3 and len(set(keys)) == 3
