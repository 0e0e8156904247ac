"""Attention (the backends' attention and attention_grad; kernel family attention.cl): the
NumPy reference against direct formulas and central differences, then every backend
against it in float32 and float64 at awkward sizes (one token, T prime, one head, head
dims of 1, 3, 32, 64, 80 and 128), causal and not, with dropout on the probabilities and
without. Outputs are poisoned with NaN first, so an element a kernel forgot to write fails
the test."""
import numpy as np
import pytest

from portanet.backends.numpy import NumpyBackend
from portanet.errors import ShapeError
from portanet.rng import key_array
from conftest import F32, F64_GRAD, poisoned, rel_err, simulated

REF = NumpyBackend("cpu", np.float64)
TOL = {np.dtype(np.float32): 2 * F32, np.dtype(np.float64): 1e-12}
# heads, head dim, tokens, samples
SIZES = [(1, 1, 1, 1), (2, 3, 7, 3), (3, 5, 1, 4), (1, 32, 13, 2), (2, 64, 5, 2),
         (1, 80, 9, 1), (1, 128, 4, 2)]


KEY = 0x9C4F1E27             # a dropout's key: its masks are fixed functions of it


def dropout(bk, rate):
    """The key and rate arguments of a dropout of `rate` (none at 0)."""
    return ((bk.upload(key_array(KEY)), rate) if rate else (None, 0.0))


def forward(bk, qkv, heads, t, causal, rate=0.0):
    dim, cols = qkv.shape[0] // 3, qkv.shape[1]
    o, lse = poisoned(bk, (dim, cols)), poisoned(bk, (heads, cols))
    bk.attention(o, lse, bk.upload(qkv), heads, t, causal, *dropout(bk, rate))
    return bk.download(o), bk.download(lse)


def backward(bk, dout, qkv, o, lse, heads, t, causal, rate=0.0):
    dqkv, dsum = poisoned(bk, qkv.shape), poisoned(bk, lse.shape)
    bk.attention_grad(dqkv, dsum, bk.upload(dout), bk.upload(qkv), bk.upload(o),
                      bk.upload(lse), heads, t, causal, *dropout(bk, rate))
    return bk.download(dqkv)


def case(rng, heads, hd, t, m):
    dim = heads * hd
    return rng.standard_normal((3 * dim, t * m)), rng.standard_normal((dim, t * m))


@pytest.mark.parametrize("causal", [True, False])
def test_reference_against_a_direct_formula(rng, causal):
    heads, hd, t, m = 2, 3, 5, 2
    qkv, _ = case(rng, heads, hd, t, m)
    o, lse = forward(REF, qkv, heads, t, causal)
    dim = heads * hd
    for h in range(heads):
        for n in range(m):
            rows = slice(h * hd, (h + 1) * hd)
            cols = [i * m + n for i in range(t)]
            q, k, v = (qkv[part * dim:][rows][:, cols] for part in range(3))
            s = q.T @ k / np.sqrt(hd)
            if causal:
                s[np.triu_indices(t, 1)] = -np.inf
            p = np.exp(s - s.max(1, keepdims=True))
            np.testing.assert_allclose(lse[h, cols], np.log(p.sum(1)) + s.max(1), rtol=1e-12)
            p /= p.sum(1, keepdims=True)
            np.testing.assert_allclose(o[rows][:, cols], v @ p.T, rtol=1e-12, atol=1e-12)


def test_reference_dropout_zeroes_probabilities_after_the_softmax(rng):
    """With dropout, o is the sum of the kept probabilities times 1 / (1 - rate), the
    softmax's sum (lse) untouched; about `rate` of them are dropped, a mask per head and
    sample."""
    heads, hd, t, m, rate = 2, 3, 40, 3, 0.3
    qkv, _ = case(rng, heads, hd, t, m)
    o, lse = forward(REF, qkv, heads, t, False)
    o_drop, lse_drop = forward(REF, qkv, heads, t, False, rate)
    np.testing.assert_array_equal(lse_drop, lse)
    # v = 1 in every row: o is then the sum of the kept probabilities, times 1 / (1 - rate)
    qkv[2 * heads * hd:] = 1.0
    o_ones, _ = forward(REF, qkv, heads, t, False, rate)
    assert not np.allclose(o_ones, 1.0)
    assert abs(o_ones.mean() - 1.0) < 0.1
    assert not np.allclose(o_ones[:hd], o_ones[hd:2 * hd])      # each head its mask


@pytest.mark.parametrize("causal, rate", [(True, 0.0), (False, 0.0), (True, 0.4)])
def test_reference_gradient_by_finite_differences(rng, causal, rate):
    heads, hd, t, m = 2, 2, 4, 2
    qkv, w = case(rng, heads, hd, t, m)
    o, lse = forward(REF, qkv, heads, t, causal, rate)
    got = backward(REF, w, qkv, o, lse, heads, t, causal, rate)
    numeric = np.zeros_like(qkv)
    for i in np.ndindex(qkv.shape):
        up, down = qkv.copy(), qkv.copy()
        up[i] += 1e-6
        down[i] -= 1e-6
        numeric[i] = (np.sum(w * forward(REF, up, heads, t, causal, rate)[0])
                      - np.sum(w * forward(REF, down, heads, t, causal, rate)[0])) / 2e-6
    assert rel_err(got, numeric) < F64_GRAD


@pytest.mark.parametrize("causal, rate", [(True, 0.0), (False, 0.0), (True, 0.25),
                                          (False, 0.5)])
@pytest.mark.parametrize("heads, hd, t, m", SIZES)
def test_attention(bk, rng, heads, hd, t, m, causal, rate):
    simulated(bk, 3 * heads * hd * t * t * m)
    qkv, dout = case(rng, heads, hd, t, m)
    qkv, dout = qkv.astype(bk.dtype), dout.astype(bk.dtype)
    want_o, want_lse = forward(REF, qkv, heads, t, causal, rate)
    o, lse = forward(bk, qkv, heads, t, causal, rate)
    assert rel_err(o, want_o) < TOL[bk.dtype]
    assert rel_err(lse, want_lse) < TOL[bk.dtype]
    # the backward from the reference's forward, as the device would hold it
    o, lse = want_o.astype(bk.dtype), want_lse.astype(bk.dtype)
    want = backward(REF, dout, qkv, o, lse, heads, t, causal, rate)
    got = backward(bk, dout, qkv, o, lse, heads, t, causal, rate)
    assert rel_err(got, want) < TOL[bk.dtype]


def test_attention_refuses_bad_shapes(bk):
    qkv = bk.zeros((12, 6))
    with pytest.raises(ShapeError, match="4 features do not make 3 heads"):
        bk.attention(bk.zeros((4, 6)), bk.zeros((3, 6)), qkv, 3, 2, True)
    with pytest.raises(ShapeError, match=r"lse \(1, 6\) must be \(2, 6\)"):
        bk.attention(bk.zeros((4, 6)), bk.zeros((1, 6)), qkv, 2, 2, True)
    with pytest.raises(ShapeError, match=r"qkv \(12, 6\) must be \(3 dim, 4 m\)"):
        bk.attention(bk.zeros((4, 6)), bk.zeros((2, 6)), qkv, 2, 4, True)
