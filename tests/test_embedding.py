"""Token embeddings (the backends' embedding and embedding_grad; kernel family embed.cl):
the NumPy reference against direct loops, then every backend against it in float32 and
float64 on awkward shapes (a vocabulary of 1, ids repeated, one sample, one position),
with and without positions, with beta != 0; and the ids a network refuses. Outputs are
poisoned with NaN first, so an element a kernel forgot to write fails the test."""
import numpy as np
import pytest

import portanet as pn
from portanet.backends.numpy import NumpyBackend
from portanet.errors import InputError, ShapeError
from conftest import F32, poisoned, rel_err, simulated

REF = NumpyBackend("cpu", np.float64)
TOL = {np.dtype(np.float32): F32, np.dtype(np.float64): 1e-12}
SHAPES = [(1, 1, 1, 1), (7, 5, 3, 4), (300, 3, 17, 5), (11, 64, 9, 33)]   # vocab, dim, T, m


def case(rng, vocab, dim, t, m):
    """ids (T, m) as reals (a few ids only, so that they repeat), table, pos, dout."""
    ids = rng.integers(0, min(vocab, 4 + vocab // 10), (t, m)).astype(np.float64)
    return ids, rng.standard_normal((vocab, dim)), rng.standard_normal((t, dim)), \
        rng.standard_normal((dim, t * m))


def forward(bk, ids, table, pos):
    out = poisoned(bk, (table.shape[1], ids.size))
    bk.embedding(out, bk.upload(table), None if pos is None else bk.upload(pos),
                 bk.upload(ids))
    return bk.download(out)


def backward(bk, dout, ids, old_table, old_pos, alpha, beta):
    g_table = bk.upload(old_table)
    g_pos = None if old_pos is None else bk.upload(old_pos)
    bk.embedding_grad(g_table, g_pos, bk.upload(dout), bk.upload(ids), alpha, beta)
    return bk.download(g_table), None if g_pos is None else bk.download(g_pos)


def test_reference_against_loops(rng):
    vocab, dim, t, m = 6, 3, 4, 5
    ids, table, pos, dout = case(rng, vocab, dim, t, m)
    out = forward(REF, ids, table, pos)
    g_table, g_pos = backward(REF, dout, ids, np.ones((vocab, dim)), np.ones((t, dim)), 0.5,
                              0.25)
    want_table, want_pos = np.full((vocab, dim), 0.25), np.full((t, dim), 0.25)
    for ti in range(t):
        for n in range(m):
            c = ti * m + n
            np.testing.assert_allclose(out[:, c], table[int(ids[ti, n])] + pos[ti])
            want_table[int(ids[ti, n])] += 0.5 * dout[:, c]
            want_pos[ti] += 0.5 * dout[:, c]
    np.testing.assert_allclose(g_table, want_table, rtol=1e-12)
    np.testing.assert_allclose(g_pos, want_pos, rtol=1e-12)


@pytest.mark.parametrize("vocab, dim, t, m", SHAPES)
def test_embedding(bk, rng, vocab, dim, t, m):
    simulated(bk, dim * t * m)
    ids, table, pos, _ = case(rng, vocab, dim, t, m)
    table, pos = table.astype(bk.dtype), pos.astype(bk.dtype)
    for p in (None, pos):
        assert rel_err(forward(bk, ids, table, p), forward(REF, ids, table, p)) < TOL[bk.dtype]


@pytest.mark.parametrize("vocab, dim, t, m", SHAPES)
def test_embedding_grad(bk, rng, vocab, dim, t, m):
    """Into gradients holding NaN with beta = 0 (not read), then added to old ones."""
    simulated(bk, vocab * dim * t * m)
    ids, _, _, dout = case(rng, vocab, dim, t, m)
    dout = dout.astype(bk.dtype)
    nan = (np.full((vocab, dim), np.nan), np.full((t, dim), np.nan))
    old = (rng.standard_normal((vocab, dim)).astype(bk.dtype),
           rng.standard_normal((t, dim)).astype(bk.dtype))
    for start, alpha, beta, with_pos in ((nan, 1 / m, 0.0, True), (old, -0.01, 0.9, True),
                                         (nan, 0.5, 0.0, False)):
        args = (dout, ids, start[0], start[1] if with_pos else None, alpha, beta)
        got, want = backward(bk, *args), backward(REF, *args)
        for g, w, o in zip(got, want, start):
            if w is None:
                assert g is None
                continue
            # the sum over tokens and beta times the old value, measured against both
            scale = abs(alpha) * np.linalg.norm(dout) + (abs(beta) * np.linalg.norm(o)
                                                         if beta else 0)
            assert rel_err(g, w, scale) < TOL[bk.dtype]


def test_embedding_refuses_bad_shapes(bk):
    ids, table = bk.zeros((3, 2)), bk.zeros((5, 4))
    with pytest.raises(ShapeError, match=r"out \(4, 5\) must be \(4, 6\)"):
        bk.embedding(bk.zeros((4, 5)), table, None, ids)
    with pytest.raises(ShapeError, match=r"pos \(2, 4\) must be \(3, 4\)"):
        bk.embedding(bk.zeros((4, 6)), table, bk.zeros((2, 4)), ids)


def test_a_network_takes_ids_and_refuses_what_is_not_one():
    net = pn.Sequential([pn.Embedding(5, 3), pn.Flatten(), pn.Dense(2, "softmax")], (4,),
                        device="cpu")
    assert net.predict(np.array([[0, 4, 4, 1]])).shape == (1, 2)
    assert net.predict(np.array([[0.0, 4.0, 4.0, 1.0]])).shape == (1, 2)   # whole reals
    for bad, where in ((5, "token id 5.0 at sample 1, position 2"), (-1, "token id -1.0"),
                       (1.5, "token id 1.5"), (np.nan, "token id nan")):
        x = np.zeros((2, 4))
        x[1, 2] = bad
        with pytest.raises(InputError, match=where):
            net.predict(x)
    with pytest.raises(InputError, match="token id 7 at sample 0, position 3"):
        net.predict(np.array([[0, 1, 2, 7]]))
    with pytest.raises(InputError, match="dtype <U1; give integers"):
        net.predict(np.array([["a"] * 4]))
    with pytest.raises(ShapeError, match=r"expects \(4,\)"):
        net.predict(np.zeros((1, 5), int))
    with pytest.raises(ShapeError, match="takes a sequence of T token ids"):
        pn.Sequential([pn.Embedding(5, 3), pn.Dense(2, "softmax")], (2, 4), device="cpu")
    for layers, where in (([pn.Dense(4), pn.Embedding(5, 3)], "layer 1, Embedding"),
                          ([pn.Embedding(5, 3), pn.Residual([pn.Embedding(5, 3)])],
                           "layer 1.0, Embedding")):
        with pytest.raises(InputError, match=where + ".*must be the network's first layer"):
            pn.Sequential(layers + [pn.Flatten(), pn.Dense(2, "softmax")], (4,),
                          device="cpu")


def test_a_vocabulary_beyond_the_type_s_whole_numbers_is_refused():
    net = pn.Sequential([pn.Embedding(2**24 + 1, 1), pn.Flatten(), pn.Dense(2, "softmax")],
                        (1,), device="cpu")
    with pytest.raises(InputError, match="at most 16777216"):
        net.predict(np.zeros((1, 1), int))
