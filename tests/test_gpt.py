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
    # top_k: each token drawn is among the k likeliest after what came before it
    out = net.generate([1], 12, top_k=2, seed=0)
    for i in range(1, len(out)):
        window = out[max(0, i - T):i]
        padded = np.zeros((1, T), int)
        padded[0, :len(window)] = window
        p = net.predict(padded)[0, len(window) - 1]
        assert out[i] in np.argsort(p)[-2:]
    greedy = net.generate([1], 12, top_k=1)
    assert np.array_equal(greedy, net.generate([1], 12, temperature=1e-6, seed=3))
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
    whole = pn.from_description(f"embedding({len(CHARS)}, 4) attention(1, causal=false) "
                                f"dense({len(CHARS)}, softmax)", (T,), device="cpu")
    with pytest.raises(InputError, match="takes a causal network"):
        whole.generate([1], 2)


def test_a_description_builds_the_sequence_layers():
    net = pn.from_description("embedding(5, 4, positions=true) residual(layernorm "
                              "attention(2, causal=false)) dense(5, softmax)", (6,),
                              device="cpu")
    kinds = [type(l).__name__ for _, l in pn.layers.walk(net.layers)]
    assert kinds == ["Embedding", "Residual", "LayerNorm", "MultiHeadAttention", "Dense"]
    assert net.layers[0].positions and not net.layers[1].layers[1].causal


def test_dropouts_of_one_seed_draw_masks_of_their_own():
    """Each layer that draws masks (the Dropouts, the attention's dropout) its own key; the
    first keeps the key a network of one Dropout always had (so such networks draw the
    masks they did)."""
    from portanet.rng import mix32
    net = small(dropout=0.5)
    x, y = windows()
    net.fit(x[:4], y[:4], epochs=1, batch_size=4, verbose=0)
    drawing = pn.layers.masking(net.layers)
    assert [type(l).__name__ for _, l in drawing] == ["Dropout", "MultiHeadAttention",
                                                      "Dropout", "Dropout"]
    keys = [l.key for _, l in drawing]
    assert len(set(keys)) == 4
    assert keys[0] == mix32(0 * 0x9E3779B1 + mix32(1))     # seed 0, step 1, rank 0


def test_the_attention_s_dropout_trains_and_resumes(tmp_path):
    """A GPT whose only dropout is the attention's: its masks change the training (and are
    drawn anew each step), not the predictions, and a run resumed from a checkpoint draws
    the masks the whole run drew."""
    x, y = windows()

    def gpt(rate):
        return pn.from_description(f"embedding({len(CHARS)}, 16, positions=true) residual("
                                   f"layernorm attention(2, dropout={rate})) layernorm "
                                   f"dense({len(CHARS)}, softmax)", (T,), device="cpu", seed=2)
    runs = {}
    for rate in (0.0, 0.3):
        net = gpt(rate)
        net.fit(x, y, epochs=2, batch_size=16, optimizer=pn.AdamW(1e-2), verbose=0)
        runs[rate] = net
    assert not np.allclose(runs[0.0].get_weights()["1.1.w_qkv"],
                           runs[0.3].get_weights()["1.1.w_qkv"])
    assert np.array_equal(runs[0.3].predict(x[:3]), runs[0.3].predict(x[:3]))
    half = gpt(0.3)
    half.fit(x, y, epochs=1, batch_size=16, optimizer=pn.AdamW(1e-2), verbose=0,
             checkpoint=tmp_path / "run.ckpt")
    again = gpt(0.3)
    again.fit(x, y, epochs=2, batch_size=16, optimizer=pn.AdamW(1e-2), verbose=0,
              resume=tmp_path / "run.ckpt")
    assert np.array_equal(again.get_weights()["1.1.w_qkv"],
                          runs[0.3].get_weights()["1.1.w_qkv"])
    assert again.layers[1].layers[1].step == runs[0.3].layers[1].layers[1].step > 0


def test_attention_refuses_a_rate_outside_0_1():
    for rate in (-0.1, 1.0, True, "0.2"):
        with pytest.raises(InputError, match="dropout must be a number in"):
            pn.MultiHeadAttention(2, dropout=rate)


def test_gpt_starts_as_gpt2_does():
    net = pn.gpt(65, T, layers=2, heads=2, dim=32, dropout=0.0, device="cpu", seed=1)
    w = net.get_weights()
    assert w["1.1.w_qkv"].std() == pytest.approx(0.02, rel=0.1)
    assert w["1.1.w_o"].std() == pytest.approx(0.01, rel=0.15)       # 0.02 / sqrt(2 layers)
    assert w["2.2.w"].std() == pytest.approx(0.01, rel=0.15) and not w["2.1.b"].any()
    x = np.random.default_rng(0).integers(0, 65, (16, T))
    assert net.evaluate(x, x)[0] == pytest.approx(np.log(65), abs=0.05)
