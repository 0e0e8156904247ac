"""Layer normalization (the backends' layernorm and layernorm_grad; kernel family
norm.cl): the NumPy reference against central differences, then every backend against the
reference in float32 and float64, on awkward shapes (rows 1, 3, 17, 130; columns 1, 2, 5,
333, 2049), in place (y over x; dx over x and over dy), with beta != 0 and without dx.
Outputs are poisoned with NaN first, so an element a kernel forgot to write fails."""
import numpy as np
import pytest

from portanet.backends.numpy import NumpyBackend
from portanet.errors import ShapeError
from conftest import F32, F64_GRAD, poisoned, rel_err, simulated

REF = NumpyBackend("cpu", np.float64)
TOL = {np.dtype(np.float32): F32, np.dtype(np.float64): 1e-12}
EPS = 1e-5


def rounded(bk, *arrays):
    return [np.asarray(a).astype(bk.dtype).astype(np.float64) for a in arrays]


def inputs(rng, bk, shape):
    """x (columns of mean far from 0), gamma, beta, dy, rounded to bk's dtype."""
    rows = shape[0]
    return rounded(bk, 3 * rng.standard_normal(shape) + rng.standard_normal(shape[1:]),
                   1 + 0.5 * rng.standard_normal(rows), rng.standard_normal(rows),
                   rng.standard_normal(shape))


def forward(bk, x, gamma, beta, over_x=False, eps=EPS):
    """layernorm on bk: (y, mean, inv_std) as host arrays."""
    n = x.size // x.shape[0]
    X = bk.upload(x)
    Y = X if over_x else poisoned(bk, x.shape)
    M, S = poisoned(bk, (n,)), poisoned(bk, (n,))
    bk.layernorm(Y, M, S, X, bk.upload(gamma), bk.upload(beta), eps)
    return bk.download(Y), bk.download(M), bk.download(S)


def backward(bk, dy, x, gamma, mean, inv_std, alpha, beta, old, dx="new"):
    """layernorm_grad on bk: dx "new" (a poisoned array), "x" (over x), "dy" (over dy) or
    None; dgamma and dbeta start as `old`. (dx or None, dgamma, dbeta) as host arrays."""
    DY, X = bk.upload(dy), bk.upload(x)
    DX = {"new": poisoned(bk, x.shape), "x": X, "dy": DY, None: None}[dx]
    DG, DB = bk.upload(old[0]), bk.upload(old[1])
    bk.layernorm_grad(DX, DG, DB, DY, X, bk.upload(gamma), bk.upload(mean), bk.upload(inv_std),
                      alpha, beta)
    return (None if DX is None else bk.download(DX)), bk.download(DG), bk.download(DB)


@pytest.mark.parametrize("shape", [(3, 5), (1, 2), (4, 3, 2, 2)])
def test_reference_against_finite_differences(rng, shape):
    """dx, dgamma, dbeta of L = sum(w y), y from layernorm, by central differences; eps
    large (0.1) so that a formula that ignored it would fail. rows 1: y is beta alone."""
    eps, rows = 0.1, shape[0]
    x, gamma, beta = (2 * rng.standard_normal(shape) + 0.5, 1 + 0.3 * rng.standard_normal(rows),
                      rng.standard_normal(rows))
    w = rng.standard_normal(shape)

    def loss():
        return np.sum(w * forward(REF, x, gamma, beta, eps=eps)[0])

    def numeric(param):
        g = np.zeros_like(param)
        for i in np.ndindex(param.shape):
            old = param[i]
            param[i] = old + 1e-6
            up = loss()
            param[i] = old - 1e-6
            down = loss()
            param[i] = old
            g[i] = (up - down) / 2e-6
        return g

    _, mean, inv_std = forward(REF, x, gamma, beta, eps=eps)
    zeros = (np.zeros(rows), np.zeros(rows))
    dx, dgamma, dbeta = backward(REF, w, x, gamma, mean, inv_std, 1.0, 0.0, zeros)
    for got, want in ((dx, numeric(x)), (dgamma, numeric(gamma)), (dbeta, numeric(beta))):
        assert rel_err(got, want, max(np.linalg.norm(want), 1e-3)) < F64_GRAD


@pytest.mark.parametrize("rows", [1, 3, 17, 130])
@pytest.mark.parametrize("n", [1, 2, 5, 333, 2049])
def test_layernorm(bk, rng, rows, n):
    simulated(bk, 3 * rows * n)
    x, gamma, beta, _ = inputs(rng, bk, (rows, n))
    want = forward(REF, x, gamma, beta)
    for over_x in (False, True):
        got = forward(bk, x, gamma, beta, over_x)
        for name, g, w in zip(("y", "mean", "inv_std"), got, want):
            assert rel_err(g, w) < TOL[bk.dtype], (name, over_x)


@pytest.mark.parametrize("rows", [1, 3, 17, 130])
@pytest.mark.parametrize("n", [1, 2, 5, 333, 2049])
def test_layernorm_grad(bk, rng, rows, n):
    """Into a new dx with beta = 0 (old dgamma, dbeta NaN: not read), over x, over dy, and
    without dx with beta != 0 (the fused momentum update)."""
    simulated(bk, 4 * rows * max(n, getattr(bk, "gemv_threads", 1)))
    x, gamma, beta, dy = inputs(rng, bk, (rows, n))
    _, mean, inv_std = forward(REF, x, gamma, beta)
    mean, inv_std = rounded(bk, mean, inv_std)
    nan = (np.full(rows, np.nan), np.full(rows, np.nan))
    old = rounded(bk, rng.standard_normal(rows), rng.standard_normal(rows))
    for dx, alpha, beta_, start in (("new", 1 / n, 0.0, nan), ("x", -0.01, 0.9, old),
                                    ("dy", 0.5, 0.0, nan), (None, 0.3, -1.0, old)):
        want = backward(REF, dy, x, gamma, mean, inv_std, alpha, beta_, start, dx)
        got = backward(bk, dy, x, gamma, mean, inv_std, alpha, beta_, start, dx)
        # dx's terms cancel (to 0 for one row); dgamma and dbeta add alpha-scaled sums to
        # beta old: each measured against the size of its terms
        xhat = (x.reshape(rows, -1) - mean) * inv_std
        terms = [np.linalg.norm(inv_std * gamma[:, None] * dy.reshape(rows, -1)), abs(alpha) * np.linalg.norm(np.abs(dy.reshape(rows, -1) * xhat).sum(1))
                 + (abs(beta_) * np.linalg.norm(start[0]) if beta_ else 0),
                 abs(alpha) * np.linalg.norm(np.abs(dy).reshape(rows, -1).sum(1))
                 + (abs(beta_) * np.linalg.norm(start[1]) if beta_ else 0)]
        for name, g, w, scale in zip(("dx", "dgamma", "dbeta"), got, want, terms):
            if w is None:
                assert g is None
            else:
                assert rel_err(g, w, max(scale, 1e-30)) < TOL[bk.dtype], (name, dx)


def test_layernorm_refuses_bad_arguments(bk):
    x, rows, cols = bk.zeros((3, 4)), bk.zeros((3,)), bk.zeros((4,))
    with pytest.raises(ShapeError, match=r"gamma \(4,\) must be \(3,\)"):
        bk.layernorm(x, cols, cols, x, cols, rows, EPS)
    with pytest.raises(ShapeError, match=r"mean \(3,\) must be \(4,\), one value per column"):
        bk.layernorm(x, rows, cols, x, rows, rows, EPS)
    with pytest.raises(ShapeError, match=r"dy \(4, 3\) must have the shape of x"):
        bk.layernorm_grad(x, rows, rows, bk.zeros((4, 3)), x, rows, cols, cols, 1.0, 0.0)
