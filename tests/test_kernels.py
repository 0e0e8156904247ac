"""Every backend primitive against a float64 NumPy result, on fresh random inputs of odd
shapes (not multiples of any tile size). Outputs are poisoned with NaN first, so an
element the kernel forgot to write fails the test."""
import numpy as np
import pytest

from portanet.backends.numpy import activate, activate_grad
from conftest import F32, gemm_scale, rel_err, simulated

GEMM_SHAPES = [(1, 1, 1), (7, 129, 1000), (129, 7, 1), (1000, 1, 7), (33, 65, 17),
               (130, 257, 129)]


def poisoned(bk, shape, dtype=None):
    x = bk.empty(shape, dtype)
    bk.write(x, np.full(shape, np.nan, dtype or bk.dtype))
    return x


def gemm_paths(bk):
    """The GEMM paths this backend has: own and, where installed, vendor."""
    if bk.kind == "cpu":
        return ["reference"]
    return ["own", "vendor", "auto"] if bk.vendor_gemm else ["own"]


@pytest.mark.parametrize("m,n,k", GEMM_SHAPES)
@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
def test_gemm(backend, rng, m, n, k, trans_a, trans_b):
    simulated(backend, m * n * k)
    a = rng.standard_normal((k, m) if trans_a else (m, k))
    b = rng.standard_normal((n, k) if trans_b else (k, n))
    c = rng.standard_normal((m, n))
    for alpha, beta in ((1.0, 0.0), (-0.7, 0.3)):
        op_a, op_b = (a.T if trans_a else a), (b.T if trans_b else b)
        ref = alpha * op_a @ op_b + beta * c
        scale = gemm_scale(alpha, op_a, op_b, beta, c)
        saved = backend.gemm_path
        for path in gemm_paths(backend):
            backend.gemm_path = path
            try:
                C = backend.upload(c) if beta else poisoned(backend, (m, n))
                backend.gemm(alpha, backend.upload(a), backend.upload(b), beta, C,
                             trans_a, trans_b)
                assert rel_err(backend.download(C), ref, scale) < F32, path
            finally:
                backend.gemm_path = saved


def test_gemm_on_views(backend, rng):
    """Operands at offsets inside larger buffers, as batch views are."""
    m, n, k = 5, 9, 13
    big = backend.upload(rng.standard_normal(1000))
    host = backend.download(big).astype(np.float64)
    a = backend.view(big, (m, k), 3)
    b = backend.view(big, (k, n), 100)
    c = backend.view(big, (m, n), 500)
    ref = host[3:3 + m * k].reshape(m, k) @ host[100:100 + k * n].reshape(k, n)
    saved = backend.gemm_path
    for path in gemm_paths(backend):
        backend.gemm_path = path
        backend.gemm(1.0, a, b, 0.0, c)
        assert rel_err(backend.download(c), ref) < F32, path
    backend.gemm_path = saved
    rest = backend.download(big).astype(np.float64)
    rest[500:500 + m * n] = host[500:500 + m * n]
    assert np.array_equal(rest, host), "gemm wrote outside its view"


def test_auto_gemm_routes_each_shape_once_and_keeps_c(backend, rng, monkeypatch):
    """Routing times both paths on the real operands, writing into c: a product that reads
    c (beta != 0, the momentum update) must still see c as it was."""
    if "auto" not in gemm_paths(backend):
        pytest.skip(f"{backend.name} has one GEMM path: nothing to route")
    monkeypatch.setattr(backend, "gemm_path", "auto")
    monkeypatch.setattr(backend, "_routes", {})
    m, n, k = 37, 21, 300
    a, b, c = (rng.standard_normal(s) for s in ((m, k), (n, k), (m, n)))
    A, B, C = backend.upload(a), backend.upload(b), backend.upload(c)
    backend.gemm_path = "own"
    backend.gemm(1.0, A, B, 0.0, backend.empty((m, n)), trans_b=True)   # its split-K workspace
    backend.gemm_path = "auto"
    count = backend.allocations
    backend.gemm(-0.5, A, B, 0.9, C, trans_b=True)
    ref = -0.5 * a @ b.T + 0.9 * c
    assert rel_err(backend.download(C), ref, gemm_scale(-0.5, a, b.T, 0.9, c)) < F32
    assert list(backend._routes) == [(m, n, k, False, True)]
    assert backend._routes[(m, n, k, False, True)] in ("own", "vendor")
    assert backend.allocations == count            # routing allocated nothing


@pytest.mark.parametrize("rows,cols", [(1, 1), (7, 129), (130, 3)])
@pytest.mark.parametrize("trans", [False, True])
def test_gemv(backend, rng, rows, cols, trans):
    a = rng.standard_normal((rows, cols))
    x = rng.standard_normal(rows if trans else cols)
    y = rng.standard_normal(cols if trans else rows)
    Y = backend.upload(y)
    backend.gemv(0.6, backend.upload(a), backend.upload(x), -1.5, Y, trans)
    op_a = a.T if trans else a
    assert rel_err(backend.download(Y), 0.6 * op_a @ x - 1.5 * y,
                   gemm_scale(0.6, op_a, x, -1.5, y)) < F32
    Y = poisoned(backend, y.shape)
    backend.gemv(1.0, backend.upload(a), backend.upload(x), 0.0, Y, trans)
    assert rel_err(backend.download(Y), (a.T if trans else a) @ x) < F32


def test_apply_update(backend, rng):
    w, v, b, vb = (rng.standard_normal(s) for s in ((7, 13), (7, 13), (7,), (7,)))
    W, B = backend.upload(w), backend.upload(b)
    backend.apply_update(W, backend.upload(v), B, backend.upload(vb))
    assert rel_err(backend.download(W), w + v) < F32
    assert rel_err(backend.download(B), b + vb) < F32


def test_ger_axpy_scal_fill_copy(backend, rng):
    rows, cols = 13, 37
    a, x, y = rng.standard_normal((rows, cols)), rng.standard_normal(rows), rng.standard_normal(cols)
    A = backend.upload(a)
    backend.ger(0.25, backend.upload(x), backend.upload(y), A)
    assert rel_err(backend.download(A), a + 0.25 * np.outer(x, y)) < F32
    u, v = rng.standard_normal(1001), rng.standard_normal(1001)
    V = backend.upload(v)
    backend.axpy(-2.5, backend.upload(u), V)
    assert rel_err(backend.download(V), v - 2.5 * u) < F32
    backend.scal(0.3, V)
    assert rel_err(backend.download(V), 0.3 * (v - 2.5 * u)) < F32
    backend.fill(V, 1.25)
    assert np.all(backend.download(V) == 1.25)
    W = poisoned(backend, (1001,))
    backend.copy(backend.upload(u), W)
    assert rel_err(backend.download(W), u) < F32


@pytest.mark.parametrize("kind", ["linear", "relu", "sigmoid", "tanh", "softmax"])
def test_bias_activation(backend, rng, kind):
    rows, cols = (10, 131) if kind == "softmax" else (67, 131)
    z = 3 * rng.standard_normal((rows, cols))
    b = rng.standard_normal(rows)
    Z, A = backend.upload(z), poisoned(backend, (rows, cols))
    backend.bias_activation(kind, Z, backend.upload(b), A)
    z_ref = z + b[:, None]
    assert rel_err(backend.download(Z), z_ref) < F32
    assert rel_err(backend.download(A), activate(kind, z_ref)) < F32


@pytest.mark.parametrize("kind", ["linear", "relu", "sigmoid", "tanh"])
def test_activation_grad(backend, rng, kind):
    z, da = 3 * rng.standard_normal((29, 77)), rng.standard_normal((29, 77))
    Z = backend.upload(z)
    backend.activation_grad(kind, Z, backend.upload(da))
    assert rel_err(backend.download(Z), activate_grad(kind, z) * da) < F32


def _probabilities(rng, rows, cols):
    e = np.exp(2 * rng.standard_normal((rows, cols)))
    return e / e.sum(axis=0)


def test_softmax_xent(backend, rng):
    rows, cols = 10, 257
    a = _probabilities(rng, rows, cols)
    labels = rng.integers(0, rows, cols)
    D = poisoned(backend, (rows, cols))
    l0, h0 = rng.random(cols), rng.integers(0, 5, cols).astype(float)   # sums so far
    L, H = backend.upload(l0), backend.upload(h0)
    backend.softmax_xent(D, L, H, backend.upload(a), backend.upload(labels))
    onehot = np.eye(rows)[labels].T
    assert rel_err(backend.download(D), a - onehot) < F32
    assert rel_err(backend.download(L), l0 - np.log(a[labels, np.arange(cols)])) < F32
    assert np.array_equal(backend.download(H), h0 + (a.argmax(0) == labels))


def test_sigmoid_bce(backend, rng):
    rows, cols = 3, 101
    a = 1 / (1 + np.exp(-rng.standard_normal((rows, cols))))
    y = (rng.random((rows, cols)) > 0.5).astype(float)
    D = poisoned(backend, (rows, cols))
    l0, h0 = rng.random(cols), rng.integers(0, 5, cols).astype(float)
    L, H = backend.upload(l0), backend.upload(h0)
    backend.sigmoid_bce(D, L, H, backend.upload(a), backend.upload(y))
    assert rel_err(backend.download(D), a - y) < F32
    loss = -(y * np.log(a) + (1 - y) * np.log(1 - a)).sum(0)
    assert rel_err(backend.download(L), l0 + loss) < F32
    assert np.array_equal(backend.download(H), h0 + np.all((a > .5) == (y > .5), 0))


def test_losses_keep_nan_nan(backend, rng):
    """A diverged network's NaN outputs give a NaN loss on every backend, as in NumPy;
    OpenCL's fmax(NaN, FLT_MIN) used to turn it into -log(FLT_MIN) = 87.34 and hide it."""
    from portanet.backends.numpy import NumpyBackend
    rows, cols = 4, 9
    a = _probabilities(rng, rows, cols)
    a[:, [2, 7]] = np.nan
    a[1, 5] = 0.0                                   # a true 0 is still clamped: finite
    labels = np.ones(cols, np.int64)
    y = (rng.random((rows, cols)) > 0.5).astype(float)
    ref = NumpyBackend("cpu", np.float64)
    for kernel, target in (("softmax_xent", labels), ("sigmoid_bce", y)):
        want = [np.empty((rows, cols)), np.zeros(cols), np.zeros(cols)]
        getattr(ref, kernel)(*want, a, target.astype(np.int32) if target is labels else target)
        got = [poisoned(backend, (rows, cols)), backend.zeros((cols,)), backend.zeros((cols,))]
        getattr(backend, kernel)(*got, backend.upload(a), backend.upload(target))
        loss = backend.download(got[1])
        assert np.array_equal(np.isnan(loss), np.isnan(want[1])), kernel
        assert np.isnan(loss[[2, 7]]).all() and np.isfinite(loss[5]), kernel


@pytest.mark.parametrize("rows", [1, 5])
def test_mse_in_place(backend, rng, rows):
    """The MSE kernel writes dL/da over a itself (delta aliases a)."""
    cols = 73
    a, y = rng.standard_normal((rows, cols)), rng.standard_normal((rows, cols))
    A = backend.upload(a)
    l0, h0 = rng.random(cols), rng.integers(0, 5, cols).astype(float)
    L, H = backend.upload(l0), backend.upload(h0)
    backend.mse(A, L, H, A, backend.upload(y))
    assert rel_err(backend.download(A), 2 * (a - y) / rows) < F32
    assert rel_err(backend.download(L), l0 + ((a - y) ** 2).mean(0)) < F32
    hit = a.argmax(0) == y.argmax(0) if rows > 1 else np.abs(a - y)[0] < 0.5
    assert np.array_equal(backend.download(H), h0 + hit)


def test_argmax(backend, rng):
    a = rng.standard_normal((17, 203))
    out = backend.empty((203,), np.int32)
    backend.argmax(out, backend.upload(a))
    assert np.array_equal(backend.download(out), a.argmax(0))


def test_views_write_download(backend, rng):
    x = rng.standard_normal(100).astype(np.float32)
    X = backend.upload(x)
    v = backend.view(X, (3, 5), 10)
    assert np.array_equal(backend.download(v), x[10:25].reshape(3, 5))
    backend.write(v, np.zeros((3, 5)))
    expect = x.copy()
    expect[10:25] = 0
    assert np.array_equal(backend.download(X), expect)


def test_integer_scalars_are_taken_as_reals(backend, rng):
    """alpha = 2 (a Python int) must act as 2.0, not as the bits of an int32."""
    x, y = rng.standard_normal(50), rng.standard_normal(50)
    Y = backend.upload(y)
    backend.axpy(2, backend.upload(x), Y)
    assert rel_err(backend.download(Y), 2 * x + y) < F32
    backend.fill(Y, 3)
    assert np.all(backend.download(Y) == 3)
    a, b = rng.standard_normal((4, 6)), rng.standard_normal((6, 5))
    C = backend.upload(np.ones((4, 5)))
    backend.gemm(1, backend.upload(a), backend.upload(b), 1, C)
    assert rel_err(backend.download(C), a @ b + 1) < F32


@pytest.mark.parametrize("tiling", [dict(TSM=32, TSN=16, TSK=8, WPTM=4, WPTN=2, MICRO=0, PAD=1),
                                    dict(TSM=32, TSN=32, TSK=8, WPTM=4, WPTN=4, MICRO=1, PAD=4)])
def test_own_gemm_tilings(backend, rng, tiling):
    """Our kernel is right for other tilings than the device's default (set_gemm_params)."""
    if backend.kind == "cpu":
        pytest.skip("the reference backend has no GEMM kernel")
    saved_params, saved_path = backend.gemm_params, backend.gemm_path
    backend.set_gemm_params(tiling)
    backend.gemm_path = "own"
    try:
        for trans_a in (False, True):
            for trans_b in (False, True):
                # ragged in every tile of both tilings; smaller on the simulator
                m, n, k = (35, 21, 19) if backend.simulator else (67, 45, 131)
                a = rng.standard_normal((k, m) if trans_a else (m, k))
                b = rng.standard_normal((n, k) if trans_b else (k, n))
                C = poisoned(backend, (m, n))
                backend.gemm(1.0, backend.upload(a), backend.upload(b), 0.0, C, trans_a, trans_b)
                ref = (a.T if trans_a else a) @ (b.T if trans_b else b)
                assert rel_err(backend.download(C), ref) < F32
    finally:
        backend.set_gemm_params(saved_params)
        backend.gemm_path = saved_path


@pytest.mark.parametrize("m,n,k", [(5, 7, 3001), (32, 144, 4099), (1, 1, 1000),
                                   (130, 200, 3000)])
def test_own_gemm_split_k(backend, rng, m, n, k):
    """Few output tiles and a long K: the sum is split over work-groups and added up, in
    the device's tiles or, for outputs smaller than one, in SMALL_TILES."""
    if backend.kind == "cpu":
        pytest.skip("the reference backend has no GEMM kernel")
    simulated(backend, m * n * k)
    from portanet.backends.gpu import split_k
    saved_units, saved_path = backend.compute_units, backend.gemm_path
    backend.compute_units, backend.gemm_path = 64, "own"
    try:
        assert split_k(1, k, backend.gemm_params["TSK"], 64)[0] > 1
        for trans_a in (False, True):
            for trans_b in (False, True):
                a = rng.standard_normal((k, m) if trans_a else (m, k))
                b = rng.standard_normal((n, k) if trans_b else (k, n))
                c = rng.standard_normal((m, n))
                C = backend.upload(c)
                backend.gemm(0.5, backend.upload(a), backend.upload(b), -1.0, C, trans_a, trans_b)
                op_a, op_b = (a.T if trans_a else a), (b.T if trans_b else b)
                ref = 0.5 * op_a @ op_b - c
                assert rel_err(backend.download(C), ref, gemm_scale(0.5, op_a, op_b, -1, c)) < F32
    finally:
        backend.compute_units, backend.gemm_path = saved_units, saved_path
