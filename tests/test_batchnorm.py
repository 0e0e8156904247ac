"""Batch normalization (the backends' batchnorm_*; kernel family norm.cl): the NumPy
reference against direct formulas and central differences, then every backend against the
reference in float32 and float64, on awkward shapes (rows 1, 3, 17; n 1, 2, 5, 333, 2049),
in place, with beta != 0 and without dx. Outputs are poisoned with NaN first, so an
element a kernel forgot to write fails the test."""
import shutil
import subprocess

import numpy as np
import pytest

from portanet.backends import gpu, sources
from portanet.backends.base import ACTIVATIONS
from portanet.backends.numpy import NumpyBackend, activate, activate_grad
from portanet.errors import InputError, ShapeError
from conftest import F32, F64_GRAD, poisoned, rel_err, simulated

NORM_FAMILY = gpu.FAMILIES["norm"]
NORM_ACTIVATIONS = [a for a in ACTIVATIONS if a != "softmax"]


REF = NumpyBackend("cpu", np.float64)
# relative error per dtype: float32 as conftest's F32; float64 kernels against the float64
# reference differ by the order of their sums alone
TOL = {np.dtype(np.float32): F32, np.dtype(np.float64): 1e-12}
ROWS, NS = [1, 3, 17], [1, 2, 5, 333, 2049]
EPS, MOMENTUM = 1e-5, 0.1


def rounded(bk, *arrays):
    """The arrays as bk holds them, back in float64: the reference then sees the very
    inputs the device does, and the comparison measures the kernel's arithmetic alone."""
    return [np.asarray(a).astype(bk.dtype).astype(np.float64) for a in arrays]


def row_work(rows, n, bk):
    """Operations of a row-wise call: three passes over each row, and a group of work-items
    per row, whatever its length."""
    return 3 * rows * max(n, getattr(bk, "gemv_threads", 1))


def inputs(rng, bk, shape):
    """x, gamma, beta, running_mean, running_var, rounded to bk's dtype."""
    rows = shape[0]
    return rounded(bk, 3 * rng.standard_normal(shape) + 1, 1 + 0.5 * rng.standard_normal(rows),
                   rng.standard_normal(rows), rng.standard_normal(rows), 0.5 + rng.random(rows))


TRAIN_OUT = ("z", "a", "mean", "inv_std", "running_mean", "running_var")


def train(bk, kind, x, gamma, beta, rm, rv, z_is_x=False, eps=EPS, momentum=MOMENTUM):
    """batchnorm_train on bk; its outputs as host arrays (TRAIN_OUT)."""
    rows = x.shape[0]
    X, RM, RV = bk.upload(x), bk.upload(rm), bk.upload(rv)
    Z = X if z_is_x else poisoned(bk, x.shape)
    A, M, S = poisoned(bk, x.shape), poisoned(bk, (rows,)), poisoned(bk, (rows,))
    bk.batchnorm_train(kind, Z, A, M, S, X, bk.upload(gamma), bk.upload(beta), RM, RV, eps,
                       momentum)
    return dict(zip(TRAIN_OUT, map(bk.download, (Z, A, M, S, RM, RV))))


def infer(bk, kind, x, gamma, beta, rm, rv):
    Z, A = poisoned(bk, x.shape), poisoned(bk, x.shape)
    bk.batchnorm_infer(kind, Z, A, bk.upload(x), bk.upload(gamma), bk.upload(beta),
                       bk.upload(rm), bk.upload(rv), EPS)
    return {"z": bk.download(Z), "a": bk.download(A)}


def grad(bk, dz, x, gamma, mean, inv_std, alpha, beta, old, dx="new"):
    """batchnorm_grad on bk: dx "new" (a poisoned array), "x" (over x), "dz" (over dz) or
    None; old: (dgamma, dbeta) before the call, poisoned where beta = 0. Returns dx (or
    None), dgamma, dbeta."""
    rows = x.shape[0]
    X, DZ = bk.upload(x), bk.upload(dz)
    DX = {"new": poisoned(bk, x.shape) if dx == "new" else None, "x": X, "dz": DZ,
          None: None}[dx]
    DG, DB = ((poisoned(bk, (rows,)), poisoned(bk, (rows,))) if beta == 0
              else (bk.upload(old[0]), bk.upload(old[1])))
    bk.batchnorm_grad(DX, DG, DB, DZ, X, bk.upload(gamma), bk.upload(mean), bk.upload(inv_std),
                      alpha, beta)
    return (None if DX is None else bk.download(DX)), bk.download(DG), bk.download(DB)


def grad_scales(dz, x, gamma, mean, inv_std, alpha, beta, old):
    """What the rounding of each gradient is relative to: the size of its terms, which
    cancel (dx of a row of two is 1e-5 of its terms at eps = 1e-5; sums of dz xhat)."""
    rows, n = x.shape[0], x.size // x.shape[0]
    dz, x = dz.reshape(rows, n), x.reshape(rows, n)
    xhat = (x - mean[:, None]) * inv_std[:, None]
    mean_dz = np.abs(dz.sum(1))[:, None] / n
    mean_dz_xhat = np.abs((dz * xhat).sum(1))[:, None] / n
    dx = np.abs(gamma * inv_std)[:, None] * (np.abs(dz) + mean_dz + np.abs(xhat) * mean_dz_xhat)
    dgamma = abs(alpha) * np.abs(dz * xhat).sum(1) + abs(beta) * np.abs(old[0])
    dbeta = abs(alpha) * np.abs(dz).sum(1) + abs(beta) * np.abs(old[1])
    return [np.linalg.norm(s) for s in (dx, dgamma, dbeta)]


def statistics(rng, bk, x, gamma, beta):
    """dz and the mean and inv_std of x as the forward pass left them, rounded to bk's."""
    out = train(REF, "linear", x, gamma, beta, np.zeros(x.shape[0]), np.ones(x.shape[0]))
    return rounded(bk, rng.standard_normal(x.shape), out["mean"], out["inv_std"])


# -- the reference: direct formulas and central differences, float64 ---------------------

@pytest.mark.parametrize("shape", [(3, 5), (2, 1), (1, 2), (4, 2, 3, 5)])
def test_reference_against_direct_formulas(rng, shape):
    x, gamma, beta, rm, rv = inputs(rng, REF, shape)
    rows, n = shape[0], x.size // shape[0]
    xs = x.reshape(rows, n)
    got = train(REF, "tanh", x, gamma, beta, rm, rv)
    var = xs.var(axis=1)
    z = ((xs - xs.mean(axis=1, keepdims=True)) / np.sqrt(var + EPS)[:, None] * gamma[:, None]
         + beta[:, None]).reshape(shape)
    unbiased = xs.var(axis=1, ddof=1) if n > 1 else var
    want = {"z": z, "a": np.tanh(z), "mean": xs.mean(axis=1), "inv_std": 1 / np.sqrt(var + EPS),
            "running_mean": 0.9 * rm + 0.1 * xs.mean(axis=1),
            "running_var": 0.9 * rv + 0.1 * unbiased}
    for name in TRAIN_OUT:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-12, atol=1e-12, err_msg=name)

    got = infer(REF, "sigmoid", x, gamma, beta, rm, rv)
    z = (gamma[:, None] * (xs - rm[:, None]) / np.sqrt(rv + EPS)[:, None]
         + beta[:, None]).reshape(shape)
    np.testing.assert_allclose(got["z"], z, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got["a"], 1 / (1 + np.exp(-z)), rtol=1e-12, atol=1e-12)

    # the gradient as the Jacobian of each row, J = gamma s (I - 1/n - xhat xhat^T / n)
    dz, mean, inv_std = statistics(rng, REF, x, gamma, beta)
    old = rng.standard_normal(rows), rng.standard_normal(rows)
    dx, dgamma, dbeta = grad(REF, dz, x, gamma, mean, inv_std, -0.5, 0.9, old)
    dzs = dz.reshape(rows, n)
    for r in range(rows):
        xhat = (xs[r] - mean[r]) * inv_std[r]
        jac = gamma[r] * inv_std[r] * (np.eye(n) - 1 / n - np.outer(xhat, xhat) / n)
        np.testing.assert_allclose(dx.reshape(rows, n)[r], jac @ dzs[r], rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(dgamma[r], -0.5 * dzs[r] @ xhat + 0.9 * old[0][r], rtol=1e-12)
        np.testing.assert_allclose(dbeta[r], -0.5 * dzs[r].sum() + 0.9 * old[1][r], rtol=1e-12)


@pytest.mark.parametrize("shape", [(3, 5), (1, 2), (2, 3, 2, 4)])
def test_reference_gradients_by_finite_differences(rng, shape):
    """batchnorm_grad's dx, dgamma, dbeta are those of L = sum(w z), z from batchnorm_train,
    by central differences; eps large enough (0.1) that a formula ignoring it would fail."""
    eps, rows = 0.1, shape[0]
    x, gamma, beta = 2 * rng.standard_normal(shape) + 0.5, 1 + 0.3 * rng.standard_normal(rows), \
        rng.standard_normal(rows)
    w = rng.standard_normal(shape)

    def loss(x, gamma, beta):
        out = train(REF, "linear", x, gamma, beta, np.zeros(rows), np.ones(rows), eps=eps)
        return np.sum(w * out["z"]), out

    def numeric(param):
        g = np.zeros_like(param)
        for i in np.ndindex(param.shape):
            old = param[i]
            param[i] = old + 1e-6
            up = loss(x, gamma, beta)[0]
            param[i] = old - 1e-6
            down = loss(x, gamma, beta)[0]
            param[i] = old
            g[i] = (up - down) / 2e-6
        return g

    out = loss(x, gamma, beta)[1]
    dx, dgamma, dbeta = grad(REF, w, x, gamma, out["mean"], out["inv_std"], 1.0, 0.0, None)
    assert rel_err(dx, numeric(x)) < F64_GRAD
    assert rel_err(dgamma, numeric(gamma)) < F64_GRAD
    assert rel_err(dbeta, numeric(beta)) < F64_GRAD


# -- every backend against the reference ---------------------------------------------------

@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("n", NS)
def test_batchnorm_train(bk, rng, rows, n):
    simulated(bk, row_work(rows, n, bk))
    args = inputs(rng, bk, (rows, n))
    want, got = train(REF, "relu", *args), train(bk, "relu", *args)
    for name in TRAIN_OUT:
        assert rel_err(got[name], want[name]) < TOL[bk.dtype], name


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("n", NS)
def test_batchnorm_infer(bk, rng, rows, n):
    simulated(bk, rows * n)
    args = inputs(rng, bk, (rows, n))
    want, got = infer(REF, "tanh", *args), infer(bk, "tanh", *args)
    for name in ("z", "a"):
        assert rel_err(got[name], want[name]) < TOL[bk.dtype], name


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("n", NS)
def test_batchnorm_grad(bk, rng, rows, n):
    """Into a new dx with beta = 0 (old dgamma, dbeta NaN: not read), over x itself and
    without dx with beta != 0 (the fused momentum update)."""
    simulated(bk, row_work(rows, n, bk))
    x, gamma, beta, _, _ = inputs(rng, bk, (rows, n))
    dz, mean, inv_std = statistics(rng, bk, x, gamma, beta)
    old = rounded(bk, rng.standard_normal(rows), rng.standard_normal(rows))
    for dx, alpha, beta_ in (("new", 1 / n, 0.0), ("x", -0.01 / n, 0.9), (None, 0.3, -1.0)):
        want = grad(REF, dz, x, gamma, mean, inv_std, alpha, beta_, old, dx)
        got = grad(bk, dz, x, gamma, mean, inv_std, alpha, beta_, old, dx)
        scales = grad_scales(dz, x, gamma, mean, inv_std, alpha, beta_, old)
        for name, g, w, scale in zip(("dx", "dgamma", "dbeta"), got, want, scales):
            if w is None:
                assert g is None
            else:
                assert rel_err(g, w, scale) < TOL[bk.dtype], (name, dx)


@pytest.mark.parametrize("kind", NORM_ACTIVATIONS)
def test_batchnorm_activations(bk, rng, kind):
    args = inputs(rng, bk, (5, 37))
    for run in (train, infer):
        want, got = run(REF, kind, *args), run(bk, kind, *args)
        assert rel_err(got["a"], want["a"]) < TOL[bk.dtype], run.__name__
        assert rel_err(want["a"], activate(kind, want["z"])) == 0


def delta(bk, kind, da, x, gamma, beta, mean, inv_std, in_place):
    """batchnorm_delta on bk, into a poisoned array or over da; the delta as a host array."""
    DA = bk.upload(da)
    D = DA if in_place else poisoned(bk, x.shape)
    bk.batchnorm_delta(kind, D, DA, bk.upload(x), *map(bk.upload, (gamma, beta, mean, inv_std)))
    return bk.download(D)


@pytest.mark.parametrize("kind", NORM_ACTIVATIONS)
def test_reference_delta_is_the_derivative_at_the_forwards_z(rng, kind):
    """The reference makes z again operation for operation as batchnorm_train did: f'(z) da
    with the z the forward wrote, to the last bit."""
    x, gamma, beta, rm, rv = inputs(rng, REF, (3, 2, 3, 7))
    out = train(REF, kind, x, gamma, beta, rm, rv)
    da = rng.standard_normal(x.shape)
    got = delta(REF, kind, da, x, gamma, beta, out["mean"], out["inv_std"], False)
    assert np.array_equal(got, activate_grad(kind, out["z"]) * da)


@pytest.mark.parametrize("kind", NORM_ACTIVATIONS)
@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (17, 333), (3, 2, 3, 37)])
def test_batchnorm_delta(bk, rng, kind, shape):
    """Against the reference, into a new array and over da, on the statistics of the
    forward pass."""
    simulated(bk, int(np.prod(shape)))
    x, gamma, beta, rm, rv = inputs(rng, bk, shape)
    out = train(REF, "linear", x, gamma, beta, rm, rv)
    mean, inv_std = rounded(bk, out["mean"], out["inv_std"])
    da, = rounded(bk, rng.standard_normal(shape))
    want = delta(REF, kind, da, x, gamma, beta, mean, inv_std, False)
    for in_place in (False, True):
        got = delta(bk, kind, da, x, gamma, beta, mean, inv_std, in_place)
        assert rel_err(got, want, np.linalg.norm(da) + 1e-30) < TOL[bk.dtype], in_place


def test_batchnorm_output_over_z(bk, rng):
    """z and a one array, as a BatchNorm binds them: it holds a = f(z) after the forward."""
    x, gamma, beta, rm, rv = inputs(rng, bk, (3, 41))
    want = train(REF, "relu", x, gamma, beta, rm, rv)
    X, A = bk.upload(x), poisoned(bk, x.shape)
    M, S = poisoned(bk, (3,)), poisoned(bk, (3,))
    bk.batchnorm_train("relu", A, A, M, S, X, bk.upload(gamma), bk.upload(beta),
                       bk.upload(rm), bk.upload(rv), EPS, MOMENTUM)
    assert rel_err(bk.download(A), want["a"]) < TOL[bk.dtype]
    A = poisoned(bk, x.shape)
    bk.batchnorm_infer("relu", A, A, X, bk.upload(gamma), bk.upload(beta), bk.upload(rm),
                       bk.upload(rv), EPS)
    assert rel_err(bk.download(A), infer(REF, "relu", x, gamma, beta, rm, rv)["a"]) \
        < TOL[bk.dtype]


def test_batchnorm_in_place(bk, rng):
    """z over x in the forward pass; dx over x and over dz in the backward pass."""
    shape = (3, 2, 3, 37)                                   # images (C, H, W, N)
    args = inputs(rng, bk, shape)
    want, got = train(REF, "linear", *args), train(bk, "linear", *args, z_is_x=True)
    for name in TRAIN_OUT:
        assert rel_err(got[name], want[name]) < TOL[bk.dtype], name
    x, gamma = args[0], args[1]
    dz, mean, inv_std = statistics(rng, bk, x, gamma, args[2])
    old = (np.zeros(3), np.zeros(3))
    want = grad(REF, dz, x, gamma, mean, inv_std, 1.0, 0.0, old)
    scales = grad_scales(dz, x, gamma, mean, inv_std, 1.0, 0.0, old)
    for dx in ("x", "dz"):
        got = grad(bk, dz, x, gamma, mean, inv_std, 1.0, 0.0, old, dx)
        for name, g, w, scale in zip(("dx", "dgamma", "dbeta"), got, want, scales):
            assert rel_err(g, w, scale) < TOL[bk.dtype], (name, dx)


@pytest.mark.parametrize("shape", [(3, 28, 28, 256), (4096, 64), (1, 100_003)])
def test_batchnorm_large_shapes(bk, rng, shape):
    """A conv layer's channels (n = 200704), a wide Dense layer, one long row."""
    rows = shape[0]
    simulated(bk, row_work(rows, np.prod(shape) // rows, bk))
    args = inputs(rng, bk, shape)
    want, got = train(REF, "linear", *args), train(bk, "linear", *args)
    for name in TRAIN_OUT:
        assert rel_err(got[name], want[name]) < TOL[bk.dtype], name
    x, gamma = args[0], args[1]
    dz, mean, inv_std = statistics(rng, bk, x, gamma, args[2])
    old = (np.zeros(rows), np.zeros(rows))
    want = grad(REF, dz, x, gamma, mean, inv_std, 1.0, 0.0, old)
    got = grad(bk, dz, x, gamma, mean, inv_std, 1.0, 0.0, old)
    for name, g, w, scale in zip(("dx", "dgamma", "dbeta"), got, want,
                                 grad_scales(dz, x, gamma, mean, inv_std, 1.0, 0.0, old)):
        assert rel_err(g, w, scale) < TOL[bk.dtype], name


@pytest.mark.parametrize("shape,parts", [((3, 5, 7, 11), 2), ((2, 1000), 7), ((1, 3), 5)])
def test_batchnorm_in_pieces(bk, rng, shape, parts, monkeypatch):
    """Rows split into pieces (norm_parts, where the rows alone leave a GPU idle): each
    group's sums through the workspace, then its piece's outputs from the row's totals;
    pieces that do not divide the row, and more pieces than columns (empty ones), z over
    x, dx new, over x and over dz, without dx, and beta != 0."""
    if bk.kind == "cpu":
        pytest.skip("the reference has no pieces")
    monkeypatch.setattr(gpu, "norm_parts", lambda *_: parts)
    rows = shape[0]
    args = inputs(rng, bk, shape)
    want = train(REF, "tanh", *args)
    for z_is_x in (False, True):
        got = train(bk, "tanh", *args, z_is_x=z_is_x)
        for name in TRAIN_OUT:
            assert rel_err(got[name], want[name]) < TOL[bk.dtype], (name, z_is_x)
    x, gamma = args[0], args[1]
    dz, mean, inv_std = statistics(rng, bk, x, gamma, args[2])
    old = rounded(bk, rng.standard_normal(rows), rng.standard_normal(rows))
    for dx, beta in (("new", 0.0), ("x", 0.9), ("dz", 0.0), (None, -1.0)):
        want = grad(REF, dz, x, gamma, mean, inv_std, 0.5, beta, old, dx)
        got = grad(bk, dz, x, gamma, mean, inv_std, 0.5, beta, old, dx)
        scales = grad_scales(dz, x, gamma, mean, inv_std, 0.5, beta, old)
        for name, g, w, scale in zip(("dx", "dgamma", "dbeta"), got, want, scales):
            if w is None:
                assert g is None
            else:
                assert rel_err(g, w, scale) < TOL[bk.dtype], (name, dx)


def test_norm_parts_fill_the_device():
    """One group per row where the rows fill the device, else pieces up to
    NORM_GROUPS_PER_UNIT groups per compute unit, none under SPLIT_RUN columns a work-item."""
    assert gpu.norm_parts(2000, 10**6, 256, 132) == 1
    assert gpu.norm_parts(32, 28 * 28 * 512, 256, 132) == 33
    assert gpu.norm_parts(32, 4096, 256, 132) == 2
    assert gpu.norm_parts(3, 100, 256, 2) == 1


def test_variance_of_an_offset_row(bk, rng):
    """Rows whose mean is 10^7 times their spread, in float64, with the statistics known
    exactly (x = 10^7 + v, v in multiples of 2^-20 and their negatives: mean 10^7 exactly).
    E[x^2] - E[x]^2 is wrong by about 10^-2 here; two passes by about 10^-9."""
    if bk.dtype != np.float64:
        pytest.skip("float32 cannot hold the deviations of a row with a mean of 10^7")
    rows, half = 3, 200
    v = np.round(rng.standard_normal((rows, half)) * 2**20) / 2**20
    v = np.concatenate([v, -v], axis=1)
    x = 1e7 + v
    var = (v * v).mean(axis=1)
    gamma, beta = np.ones(rows), np.zeros(rows)
    got = train(bk, "linear", x, gamma, beta, np.zeros(rows), np.zeros(rows))
    assert rel_err(got["mean"], np.full(rows, 1e7)) < 1e-14
    assert rel_err(got["inv_std"], 1 / np.sqrt(var + EPS)) < F32
    assert rel_err(got["running_var"], 0.1 * var * 2 * half / (2 * half - 1)) < F32
    assert rel_err(got["z"], v / np.sqrt(var + EPS)[:, None]) < F32


def test_batchnorm_refuses_bad_arguments(bk):
    x, v = bk.zeros((3, 4)), bk.zeros((3,))
    with pytest.raises(InputError, match="softmax"):
        bk.batchnorm_train("softmax", x, x, v, v, x, v, v, v, v, EPS, MOMENTUM)
    with pytest.raises(InputError, match="unknown activation"):
        bk.batchnorm_infer("swish!", x, x, x, v, v, v, v, EPS)
    with pytest.raises(ShapeError, match=r"gamma \(4,\) must be \(3,\)"):
        bk.batchnorm_infer("relu", x, x, x, bk.zeros((4,)), v, v, v, EPS)
    with pytest.raises(ShapeError, match=r"dx \(4, 3\) must have the shape of x"):
        bk.batchnorm_grad(bk.zeros((4, 3)), v, v, x, x, v, v, v, 1.0, 0.0)


# -- the sources ---------------------------------------------------------------------------

def test_norm_body_holds_the_family():
    cl_path, cl_text = sources.load("norm", "cl")
    cu_path, cu_text = sources.load("norm", "cu")
    for text in (cl_text, cu_text):
        assert tuple(n for n in NORM_FAMILY if f"KERNEL void {n}(" in text) == NORM_FAMILY
    assert cu_path == cl_path                     # one body, each language's prelude


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("real", ["float", "double"])
def test_norm_cuda_compiles(real, tmp_path):
    path = tmp_path / "norm.cu"
    path.write_text(sources.load("norm", "cu")[1])
    for flags in ([], ["-DGROUP_THREADS=64"]):
        cmd = ["nvcc", "-c", "-o", str(tmp_path / "k.o"), "-arch=sm_80", f"-DREAL={real}",
               f"-DREAL_IS_DOUBLE={int(real == 'double')}", *flags, "-I", str(path.parent),
               str(path)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
