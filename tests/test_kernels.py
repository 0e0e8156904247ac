"""Every backend primitive against a float64 NumPy result, on fresh random inputs of odd
shapes (not multiples of any tile size). Outputs are poisoned with NaN first, so an
element the kernel forgot to write fails the test."""
import contextlib
import math

import numpy as np
import pytest

import portanet as pn
from portanet.backends.base import conv_out
from portanet.backends.gemm import router as gemm_router
from portanet.backends.arrays import ACT, OF_OUTPUT
from portanet.backends.gemm.router import FINISH_PARTS
from portanet.backends.numpy import NumpyBackend, activate, activate_grad
from portanet.backends.ops import blas as blas_ops, loss as loss_ops
from portanet.errors import InputError, ShapeError
from portanet.optim import Adam
from conftest import F32, F64_GRAD, gemm_scale, get_backend, rel_err, simulated

REF = NumpyBackend("cpu", np.float64)
# float64 kernels against the float64 reference: rounding alone, a few ulps of each term
F64 = 1e-12
TOL = {np.dtype(np.float32): F32, np.dtype(np.float64): F64}
ELEMENTWISE = ["linear", "relu", "sigmoid", "tanh", "leaky_relu", "elu", "gelu", "silu"]

GEMM_SHAPES = [(1, 1, 1), (7, 129, 1000), (129, 7, 1), (1000, 1, 7), (33, 65, 17),
               (130, 257, 129)]


def poisoned(bk, shape, dtype=None):
    x = bk.empty(shape, dtype)
    bk.write(x, np.full(shape, np.nan, dtype or bk.dtype))
    return x


@pytest.fixture(params=["float32", "float64"])
def bk(request, backend):
    """`backend`'s device in float32, then in float64 (skipped where it has no fp64)."""
    return backend if request.param == "float32" else _float64(request, backend)


@pytest.fixture
def bk64(request, backend):
    """`backend`'s device in float64 (skipped where it has no fp64)."""
    return _float64(request, backend)


def _float64(request, backend):
    return get_backend(request.node.callspec.params["backend"], np.float64)


def real(bk, x):
    """x rounded to bk's real type, as float64: the inputs a test and its reference share."""
    return np.asarray(x).astype(bk.dtype).astype(np.float64)


def packed(bk, *arrays):
    """The arrays in one buffer, as views at odd offsets between NaN: a kernel that ignored
    an offset or ran past its view would read or leave NaN. The views, the buffer and a
    function that writes new values into the i-th view. The buffer is always written
    whole: Oclgrind takes memory written at an offset (pyopencl's dst_offset) for
    uninitialised."""
    host = np.full(sum(a.size + 3 for a in arrays) + 3, np.nan)
    starts = [3 + sum(a.size + 3 for a in arrays[:i]) for i in range(len(arrays))]
    for a, at in zip(arrays, starts):
        host[at:at + a.size] = a.ravel()
    big = bk.upload(host)

    def write(i, values):
        whole = bk.download(big)
        whole[starts[i]:starts[i] + values.size] = values.ravel()
        bk.write(big, whole)
    return [bk.view(big, a.shape, at) for a, at in zip(arrays, starts)], big, write


def gemm_paths(bk):
    """The GEMM paths this backend has: own and, where installed, vendor, and the vendor's
    on a transposed copy of a (routing's "vendor_t", which it tries on large products)."""
    if bk.kind == "cpu":
        return ["reference"]
    return ["own", "vendor", "vendor_t", "auto"] if bk.vendor_gemm else ["own"]


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
        for path in gemm_paths(backend):
            with backend.pinned(gemm=path):
                C = backend.upload(c) if beta else poisoned(backend, (m, n))
                backend.gemm(alpha, backend.upload(a), backend.upload(b), beta, C,
                             trans_a, trans_b)
                assert rel_err(backend.download(C), ref, scale) < F32, path


@pytest.mark.parametrize("m,n,k", [(0, 5, 3), (5, 0, 3), (5, 4, 0)])
@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_gemm_of_empty_operands(backend, rng, m, n, k, beta):
    """An empty output is nothing to do; an empty sum leaves c <- beta c (beta 0: zeros,
    whatever c held), as BLAS and NumPy do."""
    a, b, c = rng.standard_normal((m, k)), rng.standard_normal((k, n)), np.full((m, n), 2.0)
    C = backend.upload(c)
    backend.gemm(1.0, backend.upload(a), backend.upload(b), beta, C)
    assert np.array_equal(backend.download(C), np.full((m, n), 2.0 * beta))


def test_gemm_on_views(backend, rng):
    """Operands at offsets inside larger buffers, as batch views are."""
    m, n, k = 5, 9, 13
    big = backend.upload(rng.standard_normal(1000))
    host = backend.download(big).astype(np.float64)
    a = backend.view(big, (m, k), 3)
    b = backend.view(big, (k, n), 100)
    c = backend.view(big, (m, n), 500)
    ref = host[3:3 + m * k].reshape(m, k) @ host[100:100 + k * n].reshape(k, n)
    for path in gemm_paths(backend):
        with backend.pinned(gemm=path):
            backend.gemm(1.0, a, b, 0.0, c)
            assert rel_err(backend.download(c), ref) < F32, path
    rest = backend.download(big).astype(np.float64)
    rest[500:500 + m * n] = host[500:500 + m * n]
    assert np.array_equal(rest, host), "gemm wrote outside its view"


def test_auto_gemm_routes_each_shape_once_and_keeps_c(backend, rng, monkeypatch):
    """Routing times both paths on the real operands, writing into c, each replayed as a
    recorded step replays it: a product that reads c (beta != 0, the momentum update) must
    still see c as it was."""
    if "auto" not in gemm_paths(backend):
        pytest.skip(f"{backend.name} has one GEMM path: nothing to route")
    captured, capture = [], backend.capture
    monkeypatch.setattr(backend, "capture", lambda work: captured.append(work) or capture(work))
    m, n, k = 37, 21, 300
    a, b, c = (rng.standard_normal(s) for s in ((m, k), (n, k), (m, n)))
    A, B, C = backend.upload(a), backend.upload(b), backend.upload(c)
    with backend.pinned(gemm="own"):
        backend.gemm(1.0, A, B, 0.0, backend.empty((m, n)), trans_b=True)   # split-K workspace
    backend._split_workspace(max(t[1] for t in backend._candidates(m, n, k).values()) * m * n)
    count = backend.allocations
    with backend.pinned(gemm="auto"):
        backend.gemm(-0.5, A, B, 0.9, C, trans_b=True)
        routes = dict(backend.routes)
    ref = -0.5 * a @ b.T + 0.9 * c
    assert rel_err(backend.download(C), ref, gemm_scale(-0.5, a, b.T, 0.9, c)) < F32
    assert list(routes) == [(m, n, k, False, True)]
    route = routes[(m, n, k, False, True)]
    assert route == "vendor" or route.startswith("own")
    assert backend.allocations == count            # routing allocated nothing
    assert len(captured) == len(backend._candidates(m, n, k)) + 1


def test_routing_tries_other_tilings_and_runs_the_chosen(backend, rng, monkeypatch):
    """Where routing searches tilings (GPUs), every candidate of _candidates computes the
    product, and the route then runs the chosen one's tiling. On PoCL the search is
    switched on to run the same code: CPUs build each variant too slowly to search."""
    pocl = backend.kind == "opencl" and backend.info().get("platform", "").startswith(
        "Portable") and getattr(backend.limits, "profile", "") == "device"
    if backend.kind == "cpu" or backend.simulator or not (backend.searches_tilings or pocl):
        pytest.skip(f"{backend.name} does not search GEMM tilings")
    monkeypatch.setattr(backend, "searches_tilings", True)
    m, n, k = 70, 130, 600
    a, b = rng.standard_normal((m, k)), rng.standard_normal((n, k))
    A, B = backend.upload(a), backend.upload(b)
    candidates = backend._candidates(m, n, k)
    assert len(candidates) > 2 and any(t[1] > 1 for t in candidates.values())
    for name, tiling in candidates.items():
        C = poisoned(backend, (m, n))
        backend._gemm_own(1.0, A, B, 0.0, C, False, True, m, n, k, tiling=tiling)
        assert rel_err(backend.download(C), a @ b.T) < F32, name
    chosen = list(candidates)[-1]                   # as if it had been the fastest
    monkeypatch.setattr(backend, "_fastest",
                        lambda key, paths, restore=(): backend._routes.setdefault(key, chosen))
    used, own = [], backend._gemm_own
    monkeypatch.setattr(backend, "_gemm_own",
                        lambda *args, **kw: used.append(kw.get("tiling")) or own(*args, **kw))
    C = poisoned(backend, (m, n))
    with backend.pinned(gemm="auto"):
        backend.gemm(1.0, A, B, 0.0, C, trans_b=True)
        assert backend.routes[(m, n, k, False, True)] == chosen
    assert rel_err(backend.download(C), a @ b.T) < F32
    assert used == [candidates[chosen]]


@pytest.mark.parametrize("trans_a", [False, True])
def test_routing_tries_large_products_on_a_transposed_copy(backend, rng, trans_a,
                                                           monkeypatch):
    """A product of TRANSPOSED_FLOPS or more is also timed on a transposed copy of a
    (vendor_t), and where that wins the route runs it, in gemm and in dense, with the
    copy's workspace grown before the trials (their replays point at it)."""
    if "vendor_t" not in gemm_paths(backend) or backend.half_operands is not None:
        pytest.skip(f"{backend.name} has no vendor GEMM on float32 operands to transpose for")
    m, n, k = 37, 21, 300
    monkeypatch.setattr(gemm_router, "TRANSPOSED_FLOPS", 2 * m * n * k)
    monkeypatch.setattr(backend, "_transposed_ws", None, raising=False)
    tried, fastest = [], backend._fastest

    def choose(key, paths, restore=()):
        tried.append(sorted(paths))
        assert backend._transposed_ws.size >= m * k
        fastest(key, paths, restore)            # every path runs as routing runs it
        backend._routes[key] = "vendor_t"       # as if it had been the fastest
        return "vendor_t"
    monkeypatch.setattr(backend, "_fastest", choose)
    copies, transpose = [], backend.transpose
    monkeypatch.setattr(backend, "transpose",
                        lambda x, out: copies.append(x.shape) or transpose(x, out))
    a = rng.standard_normal((k, m) if trans_a else (m, k))
    op_a, b, c = (a.T if trans_a else a), rng.standard_normal((k, n)), rng.standard_normal((m, n))
    with backend.pinned(gemm="auto"):
        C = backend.upload(c)
        backend.gemm(-0.5, backend.upload(a), backend.upload(b), 0.9, C, trans_a)
        assert rel_err(backend.download(C), -0.5 * op_a @ b + 0.9 * c,
                       gemm_scale(-0.5, op_a, b, 0.9, c)) < F32
        assert "vendor_t" in tried[0] and "vendor" in tried[0]
        w, x, bias = (rng.standard_normal(s) for s in ((m, k), (k, n), (m,)))
        W, X, B = backend.upload(w), backend.upload(x), backend.upload(bias)
        backend.dense("tanh", W, X, B, poisoned(backend, (m, n)), poisoned(backend, (m, n)))
        assert backend.routes[("dense", m, n, k)] == "vendor_t"
        copies.clear()
        Z, A = poisoned(backend, (m, n)), poisoned(backend, (m, n))
        backend.dense("tanh", W, X, B, Z, A)                # routed: the copy, then the vendor's
        assert rel_err(backend.download(A), np.tanh(w @ x + bias[:, None])) < F32
        assert copies == [(m, k)]


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


@pytest.mark.parametrize("rows,cols", [(3, 0), (0, 5), (0, 0)])
@pytest.mark.parametrize("trans", [False, True])
@pytest.mark.parametrize("beta", [0.0, -1.5])
def test_gemv_of_an_empty_matrix(backend, rng, rows, cols, trans, beta):
    """An empty sum leaves beta y (0 for beta 0, over whatever y held), as BLAS and NumPy;
    an empty y is nothing to do."""
    x = rng.standard_normal(rows if trans else cols)
    y = rng.standard_normal(cols if trans else rows)
    Y = backend.upload(y) if beta else poisoned(backend, y.shape)
    backend.gemv(0.6, backend.empty((rows, cols)), backend.upload(x), beta, Y, trans)
    got = backend.download(Y)
    if beta == 0:
        assert np.array_equal(got, np.zeros_like(y))
    elif got.size:
        assert rel_err(got, beta * y) < F32


@pytest.mark.parametrize("rows,cols,parts", [(5, 3001, 1), (5, 3001, 3), (16, 4099, 7),
                                             (1, 777, 40)])
@pytest.mark.parametrize("beta", [0.0, -1.5])
def test_gemv_in_pieces(bk, rng, rows, cols, parts, beta):
    """gemv with each row's columns in pieces (parts of a split sum, then gemm_split_sum;
    few long rows: a conv layer's bias gradient), at odd offsets; 40 pieces asked of 777
    columns are 39 of 20 and a short last one."""
    if bk.kind == "cpu":
        pytest.skip("the reference backend has one gemv")
    simulated(bk, rows * cols)
    a, x, y = (real(bk, rng.standard_normal(s)) for s in ((rows, cols), cols, rows))
    (a_d, x_d, y_d), _, _ = packed(bk, a, x, y)
    bk._gemv_rows(0.6, a_d, x_d, beta, y_d, parts)
    assert rel_err(bk.download(y_d), 0.6 * a @ x + beta * y,
                   gemm_scale(0.6, a, x, beta, y)) < TOL[bk.dtype]


@contextlib.contextmanager
def held_to(monkeypatch, backend, path, units=64, routes=None):
    """A block in which backend is pinned to GEMM path `path` with routes of its own
    (`routes`, or none), on `units` compute units for the rest of the test (so that
    products and rows split as on a larger device)."""
    monkeypatch.setattr(backend, "compute_units", units)
    with backend.pinned(gemm=path, routes=routes):
        yield backend


def test_gemv_routes_few_long_rows(backend, rng, monkeypatch):
    """Where few rows leave the device idle, auto routing times one group per row against
    the rows in pieces, remembers the faster, and either gives gemv's result."""
    if backend.kind == "cpu":
        pytest.skip("the reference backend has one gemv")
    rows, cols = 3, 20000
    simulated(backend, rows * cols)
    from portanet.backends.gemm.tiling import gemv_parts
    with held_to(monkeypatch, backend, "auto"):
        assert gemv_parts(rows, cols, backend.gemv_threads, 64) > 1
        a, x, y = (rng.standard_normal(s) for s in ((rows, cols), cols, rows))
        for _ in range(2):                                  # routed, then as routed
            Y = backend.upload(y)
            backend.gemv(0.6, backend.upload(a), backend.upload(x), 0.9, Y)
            assert rel_err(backend.download(Y), 0.6 * a @ x + 0.9 * y,
                           gemm_scale(0.6, a, x, 0.9, y)) < F32
        assert backend.routes[("gemv", rows, cols)] in ("whole", "split")


# long sums: the error against float64 of a K-term float32 sum, normwise, for inputs whose
# products do not cancel (uniform in [0, 1)); one running float sum is above it from about
# K = 5000 on (8e-6 at K = 150000), a sum in pieces of ACC_K terms stays below 3e-7
LONG_SUM = 1e-6


def normwise_err(got, ref):
    return np.linalg.norm(got - ref) / np.linalg.norm(ref)


@pytest.mark.parametrize("k", [1000, 10_000, 150_000])
@pytest.mark.parametrize("trans_b", [False, True])
def test_gemm_long_sums_are_accurate(backend, rng, k, trans_b):
    """A gemm with a long K (a conv layer's weight gradient sums positions x batch) errs by
    at most LONG_SUM against float64, on every path, both split over work-groups (few
    outputs on many compute units) and in one work-group per tile (one compute unit)."""
    m, n = 9, 12
    simulated(backend, m * n * k)
    a = rng.random((m, k), dtype=np.float32)
    b = rng.random((n, k) if trans_b else (k, n), dtype=np.float32)
    ref = a.astype(np.float64) @ (b.T if trans_b else b).astype(np.float64)
    A, B = backend.upload(a), backend.upload(b)
    saved_units = getattr(backend, "compute_units", None)
    try:
        for path in gemm_paths(backend):
            for units in ({saved_units, 1} if path == "own" else {saved_units}):
                backend.compute_units = units
                with backend.pinned(gemm=path):
                    C = poisoned(backend, (m, n))
                    backend.gemm(1.0, A, B, 0.0, C, trans_b=trans_b)
                err = normwise_err(backend.download(C).astype(np.float64), ref)
                assert err <= LONG_SUM, (path, units, err)
    finally:
        backend.compute_units = saved_units


@pytest.mark.parametrize("k", [10_000, 150_000])
@pytest.mark.parametrize("trans", [False, True])
def test_gemv_long_sums_are_accurate(backend, rng, k, trans):
    """A bias gradient sums a batch (times positions) of deltas: LONG_SUM, as for gemm."""
    rows = 7
    simulated(backend, rows * k)
    a = rng.random((k, rows) if trans else (rows, k), dtype=np.float32)
    x = rng.random(k, dtype=np.float32)
    Y = poisoned(backend, (rows,))
    backend.gemv(1.0, backend.upload(a), backend.upload(x), 0.0, Y, trans)
    ref = (a.T if trans else a).astype(np.float64) @ x.astype(np.float64)
    assert normwise_err(backend.download(Y).astype(np.float64), ref) <= LONG_SUM


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


@pytest.mark.parametrize("kind", ELEMENTWISE + ["softmax"])
def test_bias_activation(bk, rng, kind):
    rows, cols = (10, 131) if kind == "softmax" else (67, 131)
    z = real(bk, 3 * rng.standard_normal((rows, cols)))
    b = real(bk, rng.standard_normal(rows))
    Z, A = bk.upload(z), poisoned(bk, (rows, cols))
    bk.bias_activation(kind, Z, bk.upload(b), A)
    z_ref = z + b[:, None]
    assert rel_err(bk.download(Z), z_ref) < TOL[bk.dtype]
    assert rel_err(bk.download(A), activate(kind, z_ref)) < TOL[bk.dtype]


@pytest.mark.parametrize("kind", ELEMENTWISE)
def test_activation_grad(bk, rng, kind):
    z, da = real(bk, 3 * rng.standard_normal((29, 77))), real(bk, rng.standard_normal((29, 77)))
    Z = bk.upload(z)
    bk.activation_grad(kind, Z, bk.upload(da))
    assert rel_err(bk.download(Z), activate_grad(kind, z) * da) < TOL[bk.dtype]


@pytest.mark.parametrize("kind,rows,cols,parts", [(k, 29, 77, 1) for k in ELEMENTWISE] + [
    ("tanh", 3, 257, 1), ("relu", 5, 3001, 3), ("silu", 16, 4099, 7)])
@pytest.mark.parametrize("beta", [0.0, 0.9])
def test_activation_bias_grad(bk, rng, kind, rows, cols, parts, beta):
    """A layer's delta z <- f'(z) . da and its bias gradient gb <- alpha z 1 + beta gb in
    one pass (whole rows, or rows in pieces and a split sum, as gemv), at odd offsets,
    against activation_grad's and gemv's reference."""
    simulated(bk, rows * cols)
    z, da = (real(bk, s * rng.standard_normal((rows, cols))) for s in (3, 1))
    gb = real(bk, rng.standard_normal(rows))
    (Z, DA, GB, ONES), _, _ = packed(bk, z, da, gb, np.ones(cols))
    if bk.kind == "cpu":
        bk.activation_bias_grad(kind, Z, DA, -0.4, beta, GB, ONES)
    else:
        bk._gemv_rows(-0.4, Z, DA, beta, GB, parts, ACT[kind])
    delta = activate_grad(kind, z) * da
    assert rel_err(bk.download(Z), delta) < TOL[bk.dtype]
    assert rel_err(bk.download(GB), -0.4 * delta.sum(axis=1) + beta * gb,
                   gemm_scale(-0.4, delta, np.ones(cols), beta, gb)) < TOL[bk.dtype]


def test_activation_bias_grad_routes_few_long_rows(backend, rng, monkeypatch):
    """Few long rows (a conv layer's channels): auto routing times whole rows, pieces and
    the two kernels apart; each gives the delta and the bias gradient."""
    if backend.kind == "cpu":
        pytest.skip("the reference backend has one way")
    rows, cols = 3, 6000
    simulated(backend, rows * cols)
    z, da, gb = (rng.standard_normal(s) for s in ((rows, cols), (rows, cols), rows))
    key = ("activation_bias_grad", rows, cols)
    for route in (None, "whole", "split", "apart"):     # routed, then each route
        Z, GB = backend.upload(z), backend.upload(gb)
        with held_to(monkeypatch, backend, "auto", routes=route and {key: route}):
            backend.activation_bias_grad("tanh", Z, backend.upload(da), 0.6, 0.9, GB,
                                         backend.upload(np.ones(cols)))
            taken = backend.routes[key]
        delta = activate_grad("tanh", z) * da
        assert rel_err(backend.download(Z), delta) < F32
        assert rel_err(backend.download(GB), 0.6 * delta.sum(axis=1) + 0.9 * gb,
                       gemm_scale(0.6, delta, np.ones(cols), 0.9, gb)) < F32
        assert taken in ("whole", "split", "apart")


@pytest.mark.parametrize("kind,m,n,k", [(k, 10, 131, 7) for k in ELEMENTWISE + ["softmax"]] + [
    (k, 67, 33, 3001) for k in ("linear", "gelu", "softmax")])
def test_dense(bk, rng, kind, m, n, k, monkeypatch):
    """A dense layer's forward z <- w x + b 1^T, a <- f(z) on every GEMM path; a long K
    on a device held to 64 compute units splits it, and the split sum adds the bias and
    activates (gemm_split_sum's epilogue; softmax, over a column, is bias_softmax's)."""
    simulated(bk, m * n * k)
    w, x = (real(bk, rng.standard_normal(s) / math.sqrt(k)) for s in ((m, k), (k, n)))
    b = real(bk, rng.standard_normal(m))
    (W, X, B), _, _ = packed(bk, w, x, b)
    z_ref = w @ x + b[:, None]
    for path in gemm_paths(bk):
        Z, A = poisoned(bk, (m, n)), poisoned(bk, (m, n))
        with (held_to(monkeypatch, bk, path) if bk.kind != "cpu" else
              contextlib.nullcontext()):
            bk.dense(kind, W, X, B, Z, A)
        assert rel_err(bk.download(Z), z_ref) < TOL[bk.dtype], path
        assert rel_err(bk.download(A), activate(kind, z_ref)) < TOL[bk.dtype], path


def test_dense_split_sum_fuses_the_epilogue(backend, rng, monkeypatch):
    """Where our GEMM splits K, dense is two launches (the parts, then their sum with the
    bias and activation), not three, and one where the last part adds the split up
    (finishes_splits): the launches saved are the point of it."""
    if backend.kind == "cpu":
        pytest.skip("the reference backend has no kernels")
    m, n, k = 67, 33, 3001
    simulated(backend, m * n * k)
    from portanet.backends.gemm.tiling import split_k
    with held_to(monkeypatch, backend, "own"):
        assert split_k(1, k, backend.gemm_params["TSK"], 64)[0] > 1
        launches = []
        real_launch = backend._launch
        monkeypatch.setattr(backend, "_launch", lambda kernel, *args: (
            launches.append(kernel), real_launch(kernel, *args)))
        w, x, b = (backend.upload(rng.standard_normal(s)) for s in ((m, k), (k, n), m))
        backend.dense("relu", w, x, b, backend.empty((m, n)), backend.empty((m, n)))
        parts = backend._tiling(m, n, k)[1]
        assert len(launches) == (1 if backend.finishes_splits and parts <= FINISH_PARTS else 2)


@pytest.mark.parametrize("kind", ELEMENTWISE)
def test_activation_grad_is_the_derivative(bk64, rng, kind):
    """f' of the kernels (activation_grad with da = 1) against central differences of
    their f (bias_activation with b = 0), in float64, away from relu's and leaky_relu's
    kink at 0."""
    z = 3 * rng.standard_normal((7, 143))
    z[np.abs(z) < 1e-2] = 0.5
    h = 1e-6
    f = []
    for shifted in (z + h, z - h):
        A = bk64.empty(z.shape)
        bk64.bias_activation(kind, bk64.upload(shifted), bk64.upload(np.zeros(7)), A)
        f.append(bk64.download(A))
    Z = bk64.upload(z)
    bk64.activation_grad(kind, Z, bk64.upload(np.ones_like(z)))
    assert rel_err(bk64.download(Z), (f[0] - f[1]) / (2 * h)) < F64_GRAD


@pytest.mark.parametrize("kind", ELEMENTWISE)
@pytest.mark.parametrize("shape", [(29, 77), (3, 7, 5, 11), (1001,)])
def test_add_activation(bk, rng, kind, shape):
    z, x = real(bk, 2 * rng.standard_normal(shape)), real(bk, 2 * rng.standard_normal(shape))
    (Z, X), _, _ = packed(bk, z, x)
    A = poisoned(bk, shape)
    bk.add_activation(kind, Z, X, A)
    assert rel_err(bk.download(Z), z + x) < TOL[bk.dtype]
    assert rel_err(bk.download(A), activate(kind, z + x)) < TOL[bk.dtype]
    assert rel_err(bk.download(X), x) == 0                  # x is only read


def test_add_activation_refuses(backend):
    z = backend.zeros((3, 4))
    with pytest.raises(InputError, match="softmax"):
        backend.add_activation("softmax", z, z, z)
    with pytest.raises(ShapeError, match="add_activation"):
        backend.add_activation("relu", z, backend.zeros((4, 3)), z)


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


def test_bias_softmax_xent(bk, rng):
    """A training step's output layer and loss in one launch: z <- z + b; a <- softmax(z);
    z <- a - onehot (the delta, in place); the loss and hits added to the sums. It gives
    bias_softmax and then softmax_xent bit for bit, on views at offsets."""
    rows, cols = 10, 257
    z = real(bk, 3 * rng.standard_normal((rows, cols)))
    b = real(bk, rng.standard_normal(rows))
    labels = rng.integers(0, rows, cols).astype(np.int32)
    l0, h0 = rng.random(cols), rng.integers(0, 5, cols).astype(float)   # sums so far
    results = []
    for fused in (True, False):
        Z = bk.view(bk.upload(np.r_[np.zeros(3), z.ravel()]), (rows, cols), 3)
        A = bk.view(poisoned(bk, (rows * cols + 1,)), (rows, cols), 1)
        L, H, B, Y = bk.upload(l0), bk.upload(h0), bk.upload(b), bk.upload(labels)
        if fused:
            bk.bias_softmax_xent(Z, B, A, L, H, Y)
        else:
            bk.bias_activation("softmax", Z, B, A)
            bk.softmax_xent(Z, L, H, A, Y)
        results.append([bk.download(x) for x in (Z, A, L, H)])
    for got, apart in zip(*results):
        assert np.array_equal(got, apart)
    a = activate("softmax", z + b[:, None])
    delta, probs, loss, hits = results[0]
    assert rel_err(probs, a) < TOL[bk.dtype]
    assert rel_err(delta, a - np.eye(rows)[labels].T) < TOL[bk.dtype]
    assert rel_err(loss, l0 - np.log(a[labels, np.arange(cols)])) < TOL[bk.dtype]
    assert np.array_equal(hits, h0 + (a.argmax(0) == labels))


@pytest.mark.parametrize("rows,cols", [(10, 257), (3, 1000), (17, 5)])
def test_bias_softmax_xent_grad(bk, rng, rows, cols, monkeypatch):
    """A training step's output layer and loss, and then its bias gradient from the delta
    left in z, gb <- alpha (delta 1) + beta gb: in one launch (one work-group) and apart,
    each forced by its route, on views at offsets. Both ways give bias_softmax_xent's and
    gemv's results bit for bit, and those the float64 reference's."""
    simulated(bk, rows * cols)
    z, b, gb = (real(bk, s * rng.standard_normal(n)) for s, n in ((3, (rows, cols)),
                                                                    (1, rows), (1, rows)))
    labels = rng.integers(0, rows, cols).astype(np.int32)
    l0, h0 = rng.random(cols), rng.integers(0, 5, cols).astype(float)   # sums so far
    key = ("bias_softmax_xent_grad", rows, cols)
    monkeypatch.setattr(loss_ops, "FUSED_LOSS_SAMPLES", 8)   # several samples a work-item too
    results = []
    for way in ["reference"] if bk.kind == "cpu" else ["fused", "apart", "calls"]:
        (Z, B, GB, ONES), _, _ = packed(bk, z, b, gb, np.ones(cols))
        A = bk.view(poisoned(bk, (rows * cols + 1,)), (rows, cols), 1)
        L, H, Y = bk.upload(l0), bk.upload(h0), bk.upload(labels)
        if way == "calls":
            bk.bias_softmax_xent(Z, B, A, L, H, Y)
            bk._gemv_rows(-0.3, Z, ONES, 0.9, GB, 1)
        else:                                 # gemv whole, as the fused launch sums
            pin = ({} if way == "reference" else
                   {"gemm": "auto", "routes": {key: way, ("gemv", rows, cols): "whole"}})
            with bk.pinned(**pin):
                bk.bias_softmax_xent_grad(Z, B, A, L, H, Y, -0.3, 0.9, GB, ONES)
        results.append([bk.download(x) for x in (Z, A, L, H, GB)])
    for got in results[1:]:
        for x, first in zip(got, results[0]):
            assert np.array_equal(x, first)
    a = activate("softmax", z + b[:, None])
    delta = a - np.eye(rows)[labels].T
    got_delta, probs, loss, hits, got_gb = results[0]
    assert rel_err(probs, a) < TOL[bk.dtype]
    assert rel_err(got_delta, delta) < TOL[bk.dtype]
    assert rel_err(loss, l0 - np.log(a[labels, np.arange(cols)])) < TOL[bk.dtype]
    assert np.array_equal(hits, h0 + (a.argmax(0) == labels))
    assert rel_err(got_gb, -0.3 * delta.sum(axis=1) + 0.9 * gb,
                   gemm_scale(-0.3, delta, np.ones(cols), 0.9, gb)) < TOL[bk.dtype]


def test_bias_softmax_xent_grad_routes(backend, rng, monkeypatch):
    """Auto routing times the fused launch against the two apart for a new shape, keeps
    the outputs as they were between trials, and either way gives the bias gradient."""
    if backend.kind == "cpu":
        pytest.skip("the reference backend has one way")
    from portanet.backends.ops.loss import FUSED_LOSS_SAMPLES
    # the fused launch is tried where a work-item takes at most FUSED_LOSS_SAMPLES samples
    rows, cols = 10, min(64, FUSED_LOSS_SAMPLES * backend.gemv_threads - 3)
    z, b, gb = (rng.standard_normal(n) for n in ((rows, cols), rows, rows))
    labels = rng.integers(0, rows, cols).astype(np.int32)
    Z, B, A, GB = (backend.upload(x) for x in (z, b, z, gb))
    L, H = backend.upload(np.zeros(cols)), backend.upload(np.zeros(cols))
    with held_to(monkeypatch, backend, "auto"):
        backend.bias_softmax_xent_grad(Z, B, A, L, H, backend.upload(labels), 0.5, 0.0, GB,
                                       backend.upload(np.ones(cols)))
        assert backend.routes[("bias_softmax_xent_grad", rows, cols)] in ("fused", "apart")
    a = activate("softmax", z + b[:, None])
    delta = a - np.eye(rows)[labels].T
    assert rel_err(backend.download(Z), delta) < F32
    assert rel_err(backend.download(L), -np.log(a[labels, np.arange(cols)])) < F32
    assert rel_err(backend.download(GB), 0.5 * delta.sum(axis=1),
                   gemm_scale(0.5, delta, np.ones(cols), 0.0, gb)) < F32


@pytest.mark.parametrize("rows,m", [(7, 1), (29, 77)])
@pytest.mark.parametrize("real_targets", [False, True])
def test_gather_batch(bk, rng, rows, m, real_targets):
    """A shuffled batch gathered from a set kept on the device, samples-first: inputs
    (rows, m) <- x[idx].T and targets (labels y[idx], or (outputs, m) <- y[idx].T), by
    gather alone and by gather_batch (one launch for labels), at odd offsets."""
    n = 101
    x = real(bk, rng.standard_normal((n, rows)))
    y = real(bk, rng.standard_normal((n, 3))) if real_targets else rng.integers(
        0, 10, n).astype(np.int32)
    idx = rng.permutation(n)[:m].astype(np.int32)
    (X,), _, _ = packed(bk, x)
    Y = bk.upload(y)
    for call in ("gather", "gather_batch"):
        XO = bk.view(poisoned(bk, (rows * m + 2,)), (rows, m), 2)
        YO = bk.view(poisoned(bk, (3 * m + 1,)), (3, m), 1) if real_targets else bk.view(
            bk.upload(np.full(m + 1, -1, np.int32)), (m,), 1)
        I = bk.upload(idx)
        if call == "gather":
            bk.gather(XO, X, I)
            bk.gather(YO, Y, I)
        else:
            bk.gather_batch(XO, X, YO, Y, I)
        assert np.array_equal(bk.download(XO), x[idx].T)
        assert np.array_equal(bk.download(YO), y[idx].T if real_targets else y[idx])


@pytest.mark.parametrize("rows,cols", [(1, 1), (1, 70), (70, 1), (33, 65), (200, 96)])
def test_transpose(bk, rng, rows, cols, monkeypatch):
    """out <- x^T through tiles, exactly, at odd offsets between NaN; with the row tiles
    shared by two groups (as a matrix of more than 65535 tiles' rows shares them)."""
    monkeypatch.setattr(blas_ops, "MAX_GROUPS_1", 2)
    x = real(bk, rng.standard_normal((rows, cols)))
    (X, OUT), big, _ = packed(bk, x, np.full((cols, rows), np.nan))
    bk.transpose(X, OUT)
    whole = bk.download(big)
    assert np.array_equal(bk.download(OUT), x.T)
    assert np.array_equal(whole[3:3 + x.size], x.ravel()), "transpose wrote into x"
    assert np.isnan(np.delete(whole, np.r_[3:3 + x.size, 6 + x.size:6 + 2 * x.size])).all()
    with pytest.raises(ShapeError, match=rf"transpose: out \({cols}, {rows + 1}\)"):
        bk.transpose(X, bk.empty((cols, rows + 1)))


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
    w = backend.view(X, (4,), np.int64(30))                # an offset NumPy computed
    assert np.array_equal(backend.download(w), x[30:34])
    backend.write(v, np.zeros((3, 5)))
    expect = x.copy()
    expect[10:25] = 0
    assert np.array_equal(backend.download(X), expect)


@pytest.mark.parametrize("m,shape", [(1, (1,)), (7, (3, 5, 2)), (130, (33,)), (64, (1, 28, 28))])
@pytest.mark.parametrize("room", [None, 1, 3, 1000])
@pytest.mark.parametrize("lane", ["plain", "lane", "mixed"])
def test_write_samples(bk, rng, m, shape, room, lane, monkeypatch):
    """A samples-first batch lands features-first in the columns of dst, through a staging
    buffer of room whole samples (None: all of them; 1 and 3 send the batch in parts, in
    turn through the halves of staging where it holds two samples or more; 1000 is more
    than the batch) or none (the host lays it out), on views at offsets; two batches with no
    wait between, so that each part waits for the device to have read the one before it
    in its half. Parts go by plain writes, by the copy lane, or mixed: parts of two
    samples or more by the lane, smaller ones plain."""
    simulated(bk, m * int(np.prod(shape)))
    if bk.simulator and m > 7:
        pytest.skip("on the simulator a sample a part (room 1): 7 samples show the turns; "
                    "larger batches take it 10-20 s each and run on the real devices")
    n = int(np.prod(shape))
    if lane != "plain" and (not bk.stages_samples or room not in (None, 3)):
        pytest.skip("no staging here: the host lays batches out" if not bk.stages_samples
                    else "the lane's turns are seen with room for the batch and for 3")
    from portanet.backends import gpu
    monkeypatch.setattr(gpu, "LANE_BYTES", {"plain": 2**62, "lane": 0,
                                            "mixed": 2 * n * bk.dtype.itemsize}[lane])
    base = poisoned(bk, (n * m + 5,))
    dsts = [bk.view(base, (n, m), 5), poisoned(bk, (n, m))]
    staging = None
    if bk.stages_samples and room is not None:
        at = 3
        staging = bk.view(poisoned(bk, (n * min(room, m) + at,)), (n * min(room, m),), at)
    xs = [rng.standard_normal((m, *shape)) for _ in dsts]
    for x, dst in zip(xs, dsts):            # no wait between: the parts take turns
        bk.write_samples(dst, x, staging)
    for x, dst in zip(xs, dsts):
        assert np.array_equal(bk.download(dst), x.reshape(m, n).T.astype(bk.dtype))
    assert np.all(np.isnan(bk.download(bk.view(base, (5,)))))      # nothing before dst


def test_write_samples_finds_nan_and_inf(backend, rng):
    """Where asked, the least index (first + sample) of a sample holding NaN or inf goes
    into bad, kept over calls; a clean batch leaves it as it was."""
    m, n = 37, 19
    bad = backend.upload(np.array([2**31 - 1], np.int32))
    dst = backend.empty((n, m))
    # parts of 4 in turn through two halves
    staging = backend.empty((8 * n,)) if backend.stages_samples else None
    x = rng.standard_normal((m, n))
    backend.write_samples(dst, x, staging, bad, first=100)
    assert backend.download(bad)[0] == 2**31 - 1
    x[30, 3], x[21, 18], x[35, 0] = np.inf, np.nan, -np.inf
    backend.write_samples(dst, x, staging, bad, first=100)
    assert backend.download(bad)[0] == 121
    x[21, 18] = 0.0
    backend.write_samples(dst, x, staging, bad, first=0)
    assert backend.download(bad)[0] == 30
    backend.write_samples(dst, x, staging, bad, first=50)       # 80: not less than 30
    assert backend.download(bad)[0] == 30
    assert np.array_equal(backend.download(dst), x.T.astype(backend.dtype))


@pytest.mark.parametrize("fresh", ["filled", "freed"])
def test_the_copy_lane_waits_for_what_the_device_was_given(backend, rng, monkeypatch, fresh):
    """The lane's first send into a staging buffer waits for the work before it on the
    backend's own stream or queue: fills of that buffer given just before (filled), or of a
    new buffer that took a freed one's place and its id, after batches through both halves
    of the freed one (freed: the lane's events speak for the old buffer). The lane is made
    and its pinned buffers filled first, so that nothing slow stands between the fills and
    the send. A send that went at once raced them (on the H100 a sample of one element came
    out NaN, what a write had put there just before)."""
    if not backend.stages_samples or backend.simulator:
        pytest.skip("no copy lane here: the host lays batches out" if not
                    backend.stages_samples else "the simulator runs each queue in turn")
    from portanet.backends import gpu
    monkeypatch.setattr(gpu, "LANE_BYTES", 0)
    n = (1 << 24) if backend.is_gpu else (1 << 16)      # fills the device takes a while over
    dst, x = backend.empty((1, 3)), rng.standard_normal((3, 1))
    backend.write_samples(dst, x, backend.empty((n,)))
    staging = backend.empty((n,))
    if fresh == "freed":
        wide = rng.standard_normal((n // 2 + 1, 1))          # both halves, every pinned buffer
        for _ in range(2):
            backend.write_samples(backend.empty((1, len(wide))), wide, staging)
        for _ in range(20):                                  # until a new one takes its id
            old = id(staging.buf)
            backend.free(staging)
            del staging
            staging = backend.empty((n,))
            if id(staging.buf) == old:
                break
        else:
            pytest.skip("no new buffer took the freed one's id in 20 tries")
    for _ in range(16 if backend.is_gpu else 64):
        backend.fill(staging, np.nan)
    backend.write_samples(dst, x, staging)
    assert np.array_equal(backend.download(dst), x.T.astype(backend.dtype))


def test_write_samples_refuses_a_wrong_size(backend, rng):
    dst = backend.empty((6, 4))
    staging = backend.empty((24,)) if backend.stages_samples else None
    with pytest.raises(ShapeError, match="write_samples"):
        backend.write_samples(dst, rng.standard_normal((4, 5)), staging)


def test_background_writes_and_downloads(backend, rng):
    """write(wait=False) and download_into follow the queue's order, and are whole after
    synchronize: each download sees the write before it, not the one after."""
    x = backend.empty((1000,))
    outs = [backend.host_empty((10, 100)) for _ in range(4)]
    values = [rng.standard_normal(1000).astype(backend.dtype) for _ in outs]
    for host, out in zip(values, outs):
        backend.write(x, host.copy(), wait=False)
        backend.download_into(x, out)
    backend.synchronize()
    for host, out in zip(values, outs):
        assert np.array_equal(out.ravel(), host)
    with pytest.raises(ShapeError, match="download_into"):
        backend.download_into(x, np.empty(999, backend.dtype))


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


TRANSPOSES = [(False, False), (False, True), (True, False), (True, True)]


def check_every_transpose(backend, rng, m, n, k, transposes=TRANSPOSES):
    """c <- 0.5 op(a) op(b) - c on backend, for each of the four transposes (or those
    given), against NumPy."""
    for trans_a, trans_b in transposes:
        a = rng.standard_normal((k, m) if trans_a else (m, k))
        b = rng.standard_normal((n, k) if trans_b else (k, n))
        c = rng.standard_normal((m, n))
        C = backend.upload(c)
        backend.gemm(0.5, backend.upload(a), backend.upload(b), -1.0, C, trans_a, trans_b)
        op_a, op_b = (a.T if trans_a else a), (b.T if trans_b else b)
        ref = 0.5 * op_a @ op_b - c
        assert rel_err(backend.download(C), ref,
                       gemm_scale(0.5, op_a, op_b, -1, c)) < F32, (m, n, k, trans_a, trans_b)


@pytest.mark.parametrize("tiling", [
    dict(TSM=32, TSN=16, TSK=8, WPTM=4, WPTN=2, MICRO=0, PAD=1),
    dict(TSM=32, TSN=32, TSK=8, WPTM=4, WPTN=4, MICRO=1, PAD=4),
    # 4-wide loads, double-buffered slabs, registers capped for two groups per unit
    dict(TSM=32, TSN=32, TSK=8, WPTM=8, WPTN=4, MICRO=2, PAD=4, VW=4, DB=1, MIN_GROUPS=2),
    dict(TSM=32, TSN=64, TSK=16, WPTM=4, WPTN=4, MICRO=2, PAD=4, VW=4, SUBGROUP=32),
    dict(TSM=16, TSN=32, TSK=16, WPTM=4, WPTN=8, MICRO=2, PAD=0, VW=4, DB=0),
    # cuBLAS's mid-size tile (64 x 64 of 8 x 4, 128 work-items), 32 deep
    dict(TSM=64, TSN=64, TSK=32, WPTM=8, WPTN=4, MICRO=2, PAD=4, VW=4),
    # tiles handed out in bands of 4 tile rows, the last band short
    dict(TSM=16, TSN=16, TSK=8, WPTM=2, WPTN=2, SWIZZLE=4)])
def test_own_gemm_tilings(backend, rng, tiling):
    """Our kernel is right for other tilings than the device's default (set_gemm_params):
    ragged in every tile, and (second shape) with whole tiles whose rows are 16-byte aligned,
    which VW = 4 loads as vectors; c read through beta."""
    if backend.kind == "cpu":
        pytest.skip("the reference backend has no GEMM kernel")
    assert backend.gemm_fits(tiling)
    saved_params = backend.gemm_params
    backend.set_gemm_params(tiling)
    shapes = [(35, 21, 19), (32, 36, 40)] if backend.simulator else [(67, 45, 131),
                                                                      (68, 72, 136)]
    try:
        with backend.pinned(gemm="own"):
            for m, n, k in shapes:
                check_every_transpose(backend, rng, m, n, k)
    finally:
        backend.set_gemm_params(saved_params)


class _Labels:
    """A stand-in for the profiler's Trace: the label of every launch, each run."""
    def __init__(self):
        self.labels = []

    def record(self, backend, label, call):
        self.labels.append(label)
        call()


@pytest.fixture
def own_gemm(backend, monkeypatch):
    """The backend on our GEMM kernel, with the labels of its launches kept (trace), and
    its tilings put back after the test."""
    if backend.kind == "cpu":
        pytest.skip("the reference backend has no GEMM kernel")
    saved = backend.gemm_params, backend.gemm_sizes
    monkeypatch.setattr(backend, "trace", _Labels())
    with backend.pinned(gemm="own"):
        yield backend
    backend.set_gemm_params(*saved)


def gemm_labels(backend, rng, m, n, k):
    """The products NN and TT (each operand read both ways: the choice of a tiling does not
    look at the transposes, and each new tiling is a build per transpose) on backend,
    checked, and the labels of their GEMMs."""
    backend.trace.labels.clear()
    check_every_transpose(backend, rng, m, n, k, [(False, False), (True, True)])
    return [x for x in backend.trace.labels if x.startswith("gemm ")]


def test_own_gemm_size_classes(own_gemm, rng, monkeypatch):
    """A device tuned per size class (set_gemm_params(params, sizes)): each output takes the
    tiling of the class nearest its size, run as it was tuned (one group per tile, K
    unsplit) where it makes as many tiles as at the class's size, else as any tiling (here
    split in K); every product right."""
    backend = own_gemm
    large = dict(TSM=32, TSN=32, TSK=8, WPTM=4, WPTN=4, SWIZZLE=4)
    small = dict(TSM=16, TSN=16, TSK=8, WPTM=2, WPTN=2)
    backend.set_gemm_params(large, sizes={96: large, 32: small})
    monkeypatch.setattr(backend, "compute_units", 64)
    assert [backend._size_class(m, n) for m, n in [(100, 90), (60, 60), (50, 50), (1, 1)]
            ] == [96, 96, 32, 32]
    for (m, n, k), ran in [((100, 90, 300), " own 32x32"), ((33, 30, 300), " own 16x16"),
                           ((12, 12, 3001), " own 16x16 split-K")]:
        if backend.simulator and m * n * k > 50000:
            continue
        gemms = gemm_labels(backend, rng, m, n, k)
        assert len(gemms) == 2 and all(x.endswith(ran) or ran.endswith("split-K") and
                                       ran in x for x in gemms), gemms


def test_own_gemm_thin_outputs(own_gemm, rng, monkeypatch):
    """An output that fills at most half of a tile's rows (columns) runs in tiles that
    many times shorter, down to 16: the work per item halved first, then the work-items."""
    backend = own_gemm
    backend.set_gemm_params(dict(TSM=64, TSN=64, TSK=8, WPTM=8, WPTN=8))
    monkeypatch.setattr(backend, "compute_units", 1)
    cases = [((5, 300, 40), " own 16x64"), ((300, 20, 40), " own 64x32"),
             ((40, 40, 40), " own 64x64")]
    for (m, n, k), ran in cases[:2] if backend.simulator else cases:   # 64x64 runs elsewhere
        gemms = gemm_labels(backend, rng, m, n, k)
        assert len(gemms) == 2 and all(x.endswith(ran) for x in gemms), gemms


@pytest.mark.parametrize("m,n,k", [(5, 7, 3001), (32, 144, 4099), (1, 1, 1000),
                                   (130, 200, 3000)])
def test_own_gemm_split_k(backend, rng, m, n, k, monkeypatch):
    """Few output tiles and a long K: the sum is split over work-groups and added up, in
    the device's tiles or, for outputs smaller than one, in SMALL_TILES."""
    if backend.kind == "cpu":
        pytest.skip("the reference backend has no GEMM kernel")
    simulated(backend, m * n * k)
    from portanet.backends.gemm.tiling import split_k
    with held_to(monkeypatch, backend, "own"):
        assert split_k(1, k, backend.gemm_params["TSK"], 64)[0] > 1
        check_every_transpose(backend, rng, m, n, k)


@pytest.mark.parametrize("parts", [2, 3, 16])
def test_split_k_added_up_by_its_last_part(bk, rng, parts, monkeypatch):
    """Where the device orders memory for it (finishes_splits), a split K of at most
    FINISH_PARTS parts is one launch: each part writes its partial product and counts
    itself done, and the tile's last adds them up with the epilogue (alpha, beta c, or a
    layer's bias and activation). Launch after launch (the counts go back to 0), on
    ragged tiles and every transpose, no gemm_split_sum."""
    if bk.kind == "cpu" or not bk.finishes_splits:
        pytest.skip(f"{bk.name} adds split K's parts in gemm_split_sum")
    from portanet.backends.gemm.tiling import SMALL_TILES, k_parts
    tiling = dict(SMALL_TILES, TSK=8)
    m, n, k = 37, 21, 40 * parts - 5
    count, chunk = k_parts(k, parts, tiling["TSK"])
    assert count == parts
    with held_to(monkeypatch, bk, "own"):
        monkeypatch.setattr(bk, "_split_sum", None)         # never called
        for trans_a in (False, True):
            for trans_b in (False, True):
                a = real(bk, rng.standard_normal((k, m) if trans_a else (m, k)))
                b = real(bk, rng.standard_normal((n, k) if trans_b else (k, n)))
                c = real(bk, rng.standard_normal((m, n)))
                (A, B, C), _, _ = packed(bk, a, b, c)
                op_a, op_b = (a.T if trans_a else a), (b.T if trans_b else b)
                for _ in range(3):
                    bk.write(C, c)
                    bk._gemm_own(0.5, A, B, -1.0, C, trans_a, trans_b, m, n, k,
                                 tiling=(tiling, count, chunk))
                    assert rel_err(bk.download(C), 0.5 * op_a @ op_b - c) < TOL[bk.dtype]
        w, x, bias = (real(bk, rng.standard_normal(s)) for s in ((m, k), (k, n), m))
        (W, X, BIAS), _, _ = packed(bk, w, x, bias)
        Z, ACT_ = poisoned(bk, (m, n)), poisoned(bk, (m, n))
        assert bk._gemm_own(1.0, W, X, 0.0, Z, False, False, m, n, k, then=("tanh", BIAS, ACT_),
                            tiling=(tiling, count, chunk))
        z = w @ x + bias[:, None]
        assert rel_err(bk.download(Z), z) < TOL[bk.dtype]
        assert rel_err(bk.download(ACT_), np.tanh(z)) < TOL[bk.dtype]
        assert not bk.download(bk._split_done).any()        # every count back to 0


@pytest.mark.parametrize("n,count", [(1, 1), (7, 2), (13, 40), (144, 338), (1001, 33),
                                     (300, 512)])
@pytest.mark.parametrize("beta", [0.0, 0.9])
def test_gemm_split_sum(bk, rng, n, count, beta):
    """A split K's parts added into c (c <- alpha sum_p parts[p] + beta c), one lane per
    output where they are few, and up to split_lanes of a work-group where they are many (a
    conv layer's weight gradient: 144 outputs, 338 parts), at odd offsets."""
    if bk.kind == "cpu":
        pytest.skip("the reference backend has no split-K sum")
    simulated(bk, n * count)
    from portanet.backends.gemm.tiling import split_lanes
    parts, c = real(bk, rng.standard_normal((count, n))), real(bk, rng.standard_normal(n))
    (parts_d, c_d), _, _ = packed(bk, parts, c)
    assert count < 33 or split_lanes(count, bk.gemv_threads) > 1
    bk._split_sum(-0.7, parts_d, beta, c_d, n, count)
    want = -0.7 * parts.sum(axis=0) + beta * c
    assert rel_err(bk.download(c_d), want) < TOL[bk.dtype]


# -- optimizer updates: a layer's flat parameter vector, weights first, odd sizes --------

N_PARAMS, N_DECAY = 1001, 693
STEPS = 3


def _state(bk, rng, *scales):
    """Host vectors of N_PARAMS in bk's precision, normal of each scale (a negative scale:
    uniform in (0, -scale), for second moments)."""
    return [real(bk, s * rng.standard_normal(N_PARAMS) if s > 0 else -s * rng.random(N_PARAMS))
            for s in scales]


def _check_steps(bk, rng, call, host, grad=1, scalars=None):
    """STEPS calls of call(backend, arrays, scalars) on bk and on the reference, from the
    same host arrays, with a fresh gradient (arrays[grad], unless None) each step; every
    array compared after each step. scalars(t): Adam's device scalars at step t."""
    views, _, write = packed(bk, *host)
    want = [x.copy() for x in host]
    for t in range(1, STEPS + 1):
        if grad is not None:
            want[grad] = real(bk, rng.standard_normal(N_PARAMS))
            write(grad, want[grad])
        s = None if scalars is None else real(bk, scalars(t))
        call(REF, want, s)
        call(bk, views, None if s is None else bk.upload(s))
        for i, (got, ref) in enumerate(zip(views, want)):
            assert rel_err(bk.download(got), ref) < TOL[bk.dtype], f"step {t}, array {i}"


def adam_scalars(lr, beta1, beta2, t, shrink=0.0):
    """Adam's device scalars at step t: [lr / (1 - beta1^t), sqrt(1 - beta2^t), 1 - shrink
    (AdamW's decay, shrink = lr wd), lr]."""
    return np.array([lr / (1 - beta1 ** t), math.sqrt(1 - beta2 ** t), 1 - shrink, lr])


@pytest.fixture(params=["fused", "per_layer"])
def updates(request, bk, monkeypatch):
    """Both ways of SGD's momentum update on every device: momentum_updates' layers in one
    launch (GPUs' way) and momentum_update's launch a layer (CPUs')."""
    if hasattr(bk, "fused_updates"):
        monkeypatch.setattr(bk, "fused_updates", request.param == "fused")
    elif request.param == "fused":
        pytest.skip("the reference has one way")
    return request.param


@pytest.mark.parametrize("decay", [0.0, 3e-3])
def test_momentum_update(bk, rng, decay, updates):
    _check_steps(bk, rng, lambda b, x, _: b.momentum_update(*x, decay, N_DECAY),
                 _state(bk, rng, 1.0, 0.1), grad=None)


@pytest.mark.parametrize("layers", [1, 3, 6])
def test_momentum_updates_of_several_layers(bk, rng, layers, updates):
    """momentum_updates on several layers' vectors of odd sizes at odd offsets in one
    buffer (more layers than a launch takes: two launches), each as momentum_update would
    have updated it alone."""
    sizes = [int(n) for n in rng.integers(1, 700, layers)]
    decays = [int(rng.integers(0, n + 1)) for n in sizes]
    host = [real(bk, s * rng.standard_normal(n)) for n in sizes for s in (1.0, 0.1)]
    views, _, _ = packed(bk, *host)
    simulated(bk, sum(sizes))
    for _ in range(2):
        for i, d in enumerate(decays):
            REF.momentum_update(host[2 * i], host[2 * i + 1], 3e-3, d)
        bk.momentum_updates([(views[2 * i], views[2 * i + 1], d) for i, d in enumerate(decays)],
                            3e-3)
    for got, want in zip(views, host):
        assert rel_err(bk.download(got), want) < TOL[bk.dtype]


@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("weight_decay", [0.0, 1e-2])
def test_sgd_update(bk, rng, weight_decay, nesterov):
    _check_steps(bk, rng, lambda b, x, _: b.sgd_update(*x, 0.1, 0.9, weight_decay, N_DECAY,
                                                       nesterov),
                 _state(bk, rng, 1.0, 1.0, 0.1))


@pytest.mark.parametrize("l2,shrink", [(0.0, 0.0), (1e-2, 0.0), (0.0, 1e-4)])
def test_adam_update(bk, rng, l2, shrink):
    lr, beta1, beta2 = 1e-3, 0.9, 0.999
    _check_steps(bk, rng, lambda b, x, s: b.adam_update(*x, s, beta1, beta2, 1e-8, l2, N_DECAY),
                 _state(bk, rng, 1.0, 1.0, 0.1, -0.01),
                 scalars=lambda t: adam_scalars(lr, beta1, beta2, t, shrink))


@pytest.mark.parametrize("centered", [False, True])
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_rmsprop_update(bk, rng, centered, momentum):
    w, g, gavg, buf = _state(bk, rng, 1.0, 1.0, 0.1, 0.1)
    # v - gavg^2, the variance, is at least 0.01 (v >= gavg^2 stays so): where it is far
    # smaller, sqrt(v - gavg^2) cancels, and float32 results part by more than rounding
    v = real(bk, gavg ** 2 + 0.01 * (1 + rng.random(N_PARAMS)))

    def call(b, x, _):
        b.rmsprop_update(x[0], x[1], x[2], x[3] if momentum else None,
                         x[-1] if centered else None, 1e-2, 0.99, 1e-8, 1e-2, momentum, N_DECAY)
    _check_steps(bk, rng, call, [w, g, v] + [buf] * (momentum > 0) + [gavg] * centered)


def _flag(bk, value):
    """A device int32 flag (an update's skip, loss scaling's found)."""
    return bk.upload(np.array([value], np.int32))


def _updates():
    """Each update kernel, as (name, call(backend, [w, g, v, second moment], scalars,
    skip))."""
    return [("momentum_updates", lambda b, x, _, k: b.momentum_updates(
                [(x[0], x[2], N_DECAY)], 3e-3, k)),
            ("sgd_update", lambda b, x, _, k: b.sgd_update(x[0], x[1], x[2], 0.1, 0.9, 1e-2,
                                                           N_DECAY, False, k)),
            ("nesterov", lambda b, x, _, k: b.sgd_update(x[0], x[1], x[2], 0.1, 0.9, 1e-2,
                                                         N_DECAY, True, k)),
            ("adam_update", lambda b, x, sc, k: b.adam_update(x[0], x[1], x[2], x[3], sc, 0.9,
                                                              0.999, 1e-8, 1e-2, N_DECAY, k)),
            ("rmsprop_update", lambda b, x, _, k: b.rmsprop_update(
                x[0], x[1], x[3], x[2], None, 1e-2, 0.99, 1e-8, 1e-2, 0.9, N_DECAY, k))]


@pytest.mark.parametrize("skip", [0, -1])
def test_updates_obey_their_skip_flag(bk, rng, skip, updates):
    """Every update kernel changes nothing where its skip flag is set (a loss-scaled step
    that overflowed), and updates as the reference does where it is 0."""
    host = _state(bk, rng, 1.0, 1.0, 0.1, -0.01)
    scalars = real(bk, adam_scalars(1e-3, 0.9, 0.999, 1))
    for name, call in _updates():
        views, _, _ = packed(bk, *host)
        want = [x.copy() for x in host]
        if not skip:
            call(REF, want, scalars, None)
        call(bk, views, bk.upload(scalars), _flag(bk, skip))
        for i, (got, ref) in enumerate(zip(views, want)):
            if skip:
                assert np.array_equal(bk.download(got), ref), (name, i)
            else:
                assert rel_err(bk.download(got), ref) < TOL[bk.dtype], (name, i)


def loss_scale_state(bk, scale, clean=0, skipped=0):
    """Loss scaling's device numbers, [scale, 1 / scale, clean steps, skipped steps]."""
    return real(bk, [scale, 1 / scale, clean, skipped])


@pytest.mark.parametrize("bad", [None, "inf", "nan", "overflow"])
def test_unscale_check_divides_exactly_and_finds_inf_and_nan(bk, rng, bad):
    """g / scale bit for bit (the scale is a power of two), and the found flag -1 where an
    element is or becomes inf or NaN; scale_by's product exact likewise."""
    scale = 2.0 ** -24 if bad == "overflow" else 2.0 ** 11
    g = real(bk, rng.standard_normal(N_PARAMS) * 2.0 ** 9)
    where = rng.integers(N_PARAMS, size=3)
    g[where] = {None: g[where], "inf": [np.inf, -np.inf, 1.0], "nan": np.nan,
                "overflow": np.finfo(bk.dtype).max / 4}[bad]
    s = loss_scale_state(bk, scale)
    views, _, _ = packed(bk, g, s)
    found = _flag(bk, 0)
    bk.unscale_check(views[0], views[1], found)
    want, want_found = g.astype(bk.dtype), np.zeros(1, np.int32)    # overflows in its type
    REF.unscale_check(want, s.astype(bk.dtype), want_found)
    assert np.array_equal(bk.download(views[0]), want, equal_nan=True)
    assert bk.download(found)[0] == want_found[0] == (0 if bad is None else -1)
    if bad is None:
        bk.scale_by(views[0], views[1])
        assert np.array_equal(bk.download(views[0]), g.astype(bk.dtype))


@pytest.mark.parametrize("bound", [0.5, 1e6])
def test_clip_norm_scales_to_the_bound_only_above_it(bk, rng, bound):
    """squares[0] the sum of squares of g, and g scaled to the bound's norm where its norm
    is above it (the factor torch's clip_grad_norm_ takes), left bit for bit below it."""
    g = real(bk, rng.standard_normal(N_PARAMS + 1000))
    views, _, _ = packed(bk, g, real(bk, [7.0]))
    bk.clip_norm(views[0], views[1], bound)
    want, squares = g.astype(bk.dtype), np.zeros(1, bk.dtype)
    REF.clip_norm(want, squares, bound)
    norm = np.linalg.norm(g.astype(np.float64))
    assert rel_err(bk.download(views[1]), [norm ** 2]) < TOL[bk.dtype]
    if bound > norm:
        assert np.array_equal(bk.download(views[0]), g.astype(bk.dtype))
    else:
        assert rel_err(bk.download(views[0]), want) < TOL[bk.dtype]
        assert np.linalg.norm(bk.download(views[0]).astype(np.float64)) == pytest.approx(
            bound, rel=1e-5)


def test_update_loss_scale_halves_on_overflow_and_grows_after_clean_steps(bk, rng):
    """The device's scale over a run of steps, found or clean, as the reference moves it:
    halved (and counted) on each overflow, doubled after growth_interval clean steps in a
    row, within its bounds; found back to 0 after each."""
    low, high, interval = 2.0 ** -3, 2.0 ** 4, 3
    s = loss_scale_state(bk, 2.0 ** 2)
    views, _, _ = packed(bk, s)
    found = _flag(bk, 0)
    want = s.copy()
    steps = [0, 0, 0, -1, 0, -1, -1, -1, -1, -1, -1] + [0] * 27
    for step, overflowed in enumerate(steps):
        bk.write(found, np.array([overflowed], np.int32))
        want_found = np.array([overflowed], np.int32)
        bk.update_loss_scale(views[0], found, interval, low, high)
        REF.update_loss_scale(want, want_found, interval, low, high)
        assert np.array_equal(bk.download(views[0]), want.astype(bk.dtype)), step
        assert bk.download(found)[0] == want_found[0] == 0
    assert want[0] == high and want[3] == 7     # it met both bounds, skipped 7 steps


@pytest.mark.parametrize("found", [0, -1])
def test_adam_scalars_count_only_the_steps_taken(bk, found):
    """A loss-scaled Adam's step numbers, formed on the device from its own count: moved
    on where the step is taken, as the host forms them (adam_scalars of the reference and
    Adam.step_scalars in double), left as they were where it is skipped."""
    lr, beta1, beta2 = 1e-3, 0.9, 0.999
    s, t = real(bk, [7.0, 7.0, 1.0, lr]), real(bk, [41.0])
    views, _, _ = packed(bk, s, t)
    bk.adam_scalars(views[0], views[1], _flag(bk, found), beta1, beta2)
    if found:
        assert np.array_equal(bk.download(views[0]), s.astype(bk.dtype))
        assert bk.download(views[1])[0] == 41
        return
    assert bk.download(views[1])[0] == 42
    want = Adam(lr, (beta1, beta2)).step_scalars(42)
    assert rel_err(bk.download(views[0]), want) < TOL[bk.dtype]


def test_updates_refuse_mismatched_sizes(backend):
    w, short = backend.zeros((10,)), backend.zeros((9,))
    with pytest.raises(ShapeError, match="adam_update"):
        backend.adam_update(w, w, short, w, backend.zeros((4,)), 0.9, 0.999, 1e-8, 0, 5)
    with pytest.raises(ShapeError, match="n_decay"):
        backend.momentum_update(w, w, 0.1, 11)


# The reference against PyTorch's torch.optim formulas, transcribed from its single-tensor
# steps (SGD, Adam/AdamW, RMSprop): the weights with weight decay, the biases in a second
# parameter group without, from PyTorch's zero state, steps t = 1..5, in float64.

def torch_sgd(w, grads, lr, momentum, wd, nesterov):
    buf = None
    for g in grads:
        d = g + wd * w if wd else g
        buf = d.copy() if buf is None else momentum * buf + d
        w = w - lr * (d + momentum * buf if nesterov else buf)
        yield w, buf


def torch_adam(w, grads, lr, beta1, beta2, eps, wd, decoupled):
    m, v = np.zeros_like(w), np.zeros_like(w)
    for t, g in enumerate(grads, 1):
        if wd and decoupled:
            w = w * (1 - lr * wd)
        elif wd:
            g = g + wd * w
        m = m + (1 - beta1) * (g - m)                   # exp_avg.lerp_(grad, 1 - beta1)
        v = beta2 * v + (1 - beta2) * g * g
        denom = np.sqrt(v) / math.sqrt(1 - beta2 ** t) + eps
        w = w - lr / (1 - beta1 ** t) * m / denom
        yield w, m, v


def torch_rmsprop(w, grads, lr, alpha, eps, wd, momentum, centered):
    v, buf, gavg = np.zeros_like(w), np.zeros_like(w), np.zeros_like(w)
    for g in grads:
        if wd:
            g = g + wd * w
        v = alpha * v + (1 - alpha) * g * g
        if centered:
            gavg = gavg + (1 - alpha) * (g - gavg)      # grad_avg.lerp_(grad, 1 - alpha)
            avg = np.sqrt(v - gavg * gavg) + eps
        else:
            avg = np.sqrt(v) + eps
        if momentum > 0:
            buf = momentum * buf + g / avg
            w = w - lr * buf
        else:
            w = w - lr * g / avg
        yield w, v, buf, gavg


def torch_groups(optimizer, w, grads, wd, **settings):
    """optimizer's steps of the weights w[:N_DECAY] (weight decay wd) and of the biases (0),
    joined: per step, each of its outputs for the whole vector."""
    weights = optimizer(w[:N_DECAY], [g[:N_DECAY] for g in grads], wd=wd, **settings)
    biases = optimizer(w[N_DECAY:], [g[N_DECAY:] for g in grads], wd=0.0, **settings)
    for a, b in zip(weights, biases):
        yield [np.concatenate(pair) for pair in zip(a, b)]


TORCH_STEPS = 5


@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("wd", [0.0, 1e-2])
def test_reference_sgd_is_torch(rng, nesterov, wd):
    lr, mu = 0.1, 0.9
    w0 = rng.standard_normal(N_PARAMS)
    grads = [rng.standard_normal(N_PARAMS) for _ in range(TORCH_STEPS)]
    w, v = w0.copy(), np.zeros(N_PARAMS)
    steps = torch_groups(torch_sgd, w0, grads, wd, lr=lr, momentum=mu, nesterov=nesterov)
    w2, v2 = w0.copy(), np.zeros(N_PARAMS)        # the gradient given (a scaled step's)
    for g, (w_torch, buf) in zip(grads, steps):
        if nesterov:
            REF.sgd_update(w, g, v, lr, mu, wd, N_DECAY, nesterov=True)
        else:
            v[...] = mu * v - lr * g                # what the layer's gemm writes into v
            REF.momentum_update(w, v, lr * wd, N_DECAY)
        REF.sgd_update(w2, g, v2, lr, mu, wd, N_DECAY, nesterov)
        for got, got_v in ((w, v), (w2, v2)):
            assert rel_err(got, w_torch) < F64
            assert rel_err(got_v, -lr * buf) < F64


@pytest.mark.parametrize("decoupled", [False, True])
def test_reference_adam_is_torch(rng, decoupled):
    lr, beta1, beta2, eps, wd = 1e-2, 0.9, 0.999, 1e-8, 0.05
    w0 = rng.standard_normal(N_PARAMS)
    grads = [rng.standard_normal(N_PARAMS) for _ in range(TORCH_STEPS)]
    w, m, v = w0.copy(), np.zeros(N_PARAMS), np.zeros(N_PARAMS)
    l2, shrink = (0.0, lr * wd) if decoupled else (wd, 0.0)
    steps = torch_groups(torch_adam, w0, grads, wd, lr=lr, beta1=beta1, beta2=beta2, eps=eps,
                         decoupled=decoupled)
    for t, (g, want) in enumerate(zip(grads, steps), 1):
        REF.adam_update(w, g, m, v, adam_scalars(lr, beta1, beta2, t, shrink), beta1, beta2,
                        eps, l2, N_DECAY)
        for got, ref in zip((w, m, v), want):
            assert rel_err(got, ref) < F64, t


@pytest.mark.parametrize("centered", [False, True])
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_reference_rmsprop_is_torch(rng, centered, momentum):
    lr, alpha, eps, wd = 1e-2, 0.99, 1e-8, 0.05
    w0 = rng.standard_normal(N_PARAMS)
    grads = [rng.standard_normal(N_PARAMS) for _ in range(TORCH_STEPS)]
    w, v, buf, gavg = w0.copy(), np.zeros(N_PARAMS), np.zeros(N_PARAMS), np.zeros(N_PARAMS)
    steps = torch_groups(torch_rmsprop, w0, grads, wd, lr=lr, alpha=alpha, eps=eps,
                         momentum=momentum, centered=centered)
    for t, (g, want) in enumerate(zip(grads, steps), 1):
        REF.rmsprop_update(w, g, v, buf if momentum else None, gavg if centered else None, lr,
                           alpha, eps, wd, momentum, N_DECAY)
        pairs = [(w, want[0]), (v, want[1])] + [(buf, want[2])] * (momentum > 0) \
            + [(gavg, want[3])] * centered
        for got, ref in pairs:
            assert rel_err(got, ref) < F64, t


# -- average pooling -----------------------------------------------------------------------

# (C, H, W, N, pool, stride): windows = strides with a ragged edge, overlapping windows,
# rectangular ones, gaps between windows (stride > pool), a global pool, the identity
POOL_SHAPES = [(3, 7, 9, 5, (2, 2), (2, 2)), (2, 8, 7, 3, (3, 2), (2, 1)),
               (3, 9, 9, 2, (3, 3), (1, 1)), (5, 6, 9, 4, (2, 3), (3, 2)),
               (4, 7, 5, 3, (7, 5), (7, 5)), (1, 5, 5, 1, (1, 1), (1, 1)),
               (16, 33, 31, 17, (3, 3), (2, 2))]


def _pooled_shape(x_shape, pool, stride):
    C, H, W, N = x_shape
    return C, conv_out(H, pool[0], stride[0], 0), conv_out(W, pool[1], stride[1], 0), N


@pytest.mark.parametrize("C,H,W,N,pool,stride", POOL_SHAPES[:-1])
def test_reference_avgpool_is_window_means(rng, C, H, W, N, pool, stride):
    (ph, pw), (sh, sw) = pool, stride
    x = rng.standard_normal((C, H, W, N))
    _, Ho, Wo, _ = _pooled_shape(x.shape, pool, stride)
    a, da = np.empty((C, Ho, Wo, N)), rng.standard_normal((C, Ho, Wo, N))
    REF.avgpool(a, x, pool, stride)
    dx = np.full(x.shape, np.nan)
    REF.avgpool_grad(dx, da, pool, stride)
    want = np.zeros_like(x)
    for oh in range(Ho):
        for ow in range(Wo):
            window = (slice(None), slice(oh * sh, oh * sh + ph), slice(ow * sw, ow * sw + pw))
            assert rel_err(a[:, oh, ow], x[window].mean(axis=(1, 2))) < F64
            want[window] += da[:, oh, ow, None, None] / (ph * pw)
    assert rel_err(dx, want) < F64


@pytest.mark.parametrize("C,H,W,N,pool,stride", POOL_SHAPES)
def test_avgpool(bk, rng, C, H, W, N, pool, stride):
    simulated(bk, C * H * W * N * pool[0] * pool[1])
    x = real(bk, rng.standard_normal((C, H, W, N)))
    shape = _pooled_shape(x.shape, pool, stride)
    da = real(bk, rng.standard_normal(shape))
    a, dx = np.empty(shape), np.empty(x.shape)
    REF.avgpool(a, x, pool, stride)
    REF.avgpool_grad(dx, da, pool, stride)
    (X, DA), _, _ = packed(bk, x, da)
    A, DX = poisoned(bk, shape), poisoned(bk, x.shape)
    bk.avgpool(A, X, pool, stride)
    bk.avgpool_grad(DX, DA, pool, stride)
    assert rel_err(bk.download(A), a) < TOL[bk.dtype]
    assert rel_err(bk.download(DX), dx) < TOL[bk.dtype]


@pytest.mark.parametrize("C,H,W,N,pool,stride", POOL_SHAPES[:-1])
def test_avgpool_grad_is_the_adjoint(bk64, rng, C, H, W, N, pool, stride):
    """avgpool_grad is avgpool's adjoint, <avgpool(x), da> = <x, avgpool_grad(da)>, and the
    gradient of L(x) = <avgpool(x), da>: central differences along a random direction u
    give <avgpool_grad(da), u> (avgpool is linear: the differences are exact but for
    rounding)."""
    x, u = rng.standard_normal((C, H, W, N)), rng.standard_normal((C, H, W, N))
    shape = _pooled_shape(x.shape, pool, stride)
    da = rng.standard_normal(shape)

    def loss(x):
        A = bk64.empty(shape)
        bk64.avgpool(A, bk64.upload(x), pool, stride)
        return np.sum(bk64.download(A) * da)
    DX = bk64.empty(x.shape)
    bk64.avgpool_grad(DX, bk64.upload(da), pool, stride)
    dx = bk64.download(DX)
    assert loss(x) == pytest.approx(np.sum(x * dx), rel=F64)
    h = 1e-3
    assert (loss(x + h * u) - loss(x - h * u)) / (2 * h) == pytest.approx(np.sum(dx * u),
                                                                          rel=F64_GRAD)


def test_avgpool_refuses_wrong_shapes(backend):
    x = backend.upload(np.zeros((2, 5, 6, 3)))
    with pytest.raises(ShapeError, match="avgpool"):
        backend.avgpool(backend.zeros((2, 2, 2, 3)), x, (2, 2), (2, 2))     # (2, 2, 3, 3)
    with pytest.raises(ShapeError, match="avgpool_grad"):
        backend.avgpool_grad(x, backend.zeros((2, 1, 1, 3)), (6, 6), (1, 1))  # larger than H
    a = poisoned(backend, (2, 1, 1, 3))
    backend.avgpool(a, x, (5, 6), (5, 6))                   # a global pool: fits
    assert np.all(backend.download(a) == 0)


@pytest.mark.parametrize("kind", sorted(OF_OUTPUT))
def test_a_derivative_from_the_output_is_the_derivative_at_z(bk, rng, kind):
    """OF_OUTPUT's kinds read a = f(z) where the others read z: activation_grad and
    activation_bias_grad given a with them give f'(z) da, as given z with the activation's
    own kind."""
    z = 3 * rng.standard_normal((13, 67))
    a, da = real(bk, activate(kind, z)), real(bk, rng.standard_normal((13, 67)))
    want = activate_grad(kind, z) * da
    A = bk.upload(a)
    bk.activation_grad(OF_OUTPUT[kind], A, bk.upload(da))
    assert rel_err(bk.download(A), want) < 4 * TOL[bk.dtype]
    A, GB = bk.upload(a), bk.upload(np.zeros(13))
    bk.activation_bias_grad(OF_OUTPUT[kind], A, bk.upload(da), 1.0, 0.0, GB,
                            bk.upload(np.ones(67)))
    assert rel_err(bk.download(A), want) < 4 * TOL[bk.dtype]
    assert rel_err(bk.download(GB), want.sum(axis=1), np.abs(want).sum()) < 4 * TOL[bk.dtype]


def test_a_derivative_from_the_output_is_no_activation():
    with pytest.raises(InputError, match="unknown activation"):
        pn.Dense(3, "tanh_of_a")
    with pytest.raises(InputError, match="unknown activation"):
        pn.device("cpu").bias_activation("tanh_of_a", np.zeros((2, 2)), np.zeros(2),
                                         np.zeros((2, 2)))
