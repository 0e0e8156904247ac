"""The same numbers on every device where naive kernels part ways: NaN, +-inf, magnitudes
that overflow exp or a product, log of 0, ties and NaN in argmax and max pooling.

The oracle is the NumPy reference run in the device's dtype (float32), so that overflow
happens at the same place: a device must give NaN exactly where it does, inf of the same
sign exactly where it does, and finite values within F32 of it, relative to the result or,
where terms cancel (1 - tanh^2, a loss summed from terms of both signs), to the size of
the terms (as gemm_scale does for GEMM). The absolute slack of the smallest normal float
admits devices that flush subnormal results to zero (sigmoid(-88) is 6e-39)."""
import numpy as np
import pytest

import math

from portanet.backends.base import conv_out
from portanet.backends.numpy import NumpyBackend, activate
from portanet.rng import key_array
from conftest import F32

REF = NumpyBackend("cpu", np.float32)
ELEMENTWISE = ["linear", "relu", "sigmoid", "tanh", "leaky_relu", "elu", "gelu", "silu"]
TINY = np.finfo(np.float32).tiny
# 88 and 100 sit either side of float32's exp overflow (88.72); 1e30 and 3e38 overflow a
# square, a sum or a product; 1e-30 underflows one
SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e30, -1e30, 3e38, -3e38, 1000, -1000,
                     100, -100, 88, -88, 1e-30, -1e-30], np.float32)


def mixed(rng, shape, fraction=0.3):
    """float32 values of every scale from 1e-3 to 1e3, each sign, with a `fraction` of them
    SPECIALS (each of which appears at least once where there is room)."""
    x = rng.standard_normal(shape) * 10.0 ** rng.uniform(-3, 3, shape)
    flat = x.reshape(-1)
    picks = np.flatnonzero(rng.random(flat.size) < fraction)
    flat[picks] = rng.choice(SPECIALS, picks.size)
    first = rng.permutation(flat.size)[:min(flat.size // 3, SPECIALS.size)]
    flat[first] = SPECIALS[:first.size]
    return x.astype(np.float32)


def assert_same(got, want, what, scale=None):
    """NaN where want has NaN, inf of the same sign where it has inf, finite values within
    F32 relative to `scale` (default |want|) plus TINY."""
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    assert got.shape == want.shape, what
    scale = np.abs(want) if scale is None else np.broadcast_to(np.asarray(scale, np.float64),
                                                                want.shape)
    fin = np.isfinite(want)
    bad = np.isnan(got) != np.isnan(want)
    bad |= np.isinf(want) & (got != want)
    bad[fin] |= ~(np.abs(got[fin] - want[fin]) <= F32 * scale[fin] + TINY)
    where = list(zip(*np.nonzero(bad)))[:5]
    assert not bad.any(), (f"{what}: {bad.sum()} of {bad.size} differ from the reference, "
                           f"e.g. " + ", ".join(f"at {tuple(map(int, i))} got {got[i]!r}, "
                                                f"want {want[i]!r}" for i in where))


def poisoned(bk, shape, dtype=None):
    x = bk.empty(shape, dtype)
    bk.write(x, np.full(shape, np.nan, dtype or bk.dtype))
    return x


def test_reference_semantics():
    """The oracle's own choices, stated once: NaN passes through relu, max and argmax (the
    first NaN wins), through dropout (a product with the mask) and into the losses, whose
    log is clamped at the smallest normal float; sigmoid and softmax of finite inputs
    saturate without NaN, and tanh is exactly +-1 from where it rounds there. The
    activations and derivatives are their formulas as written, as in PyTorch: where one
    multiplies an infinity by 0 it gives NaN (gelu and silu of -inf, their derivatives at
    +-inf); NaN goes to the z <= 0 branch of a comparison (relu' and leaky_relu' of NaN
    are 0 and 0.01, elu' of it exp(NaN))."""
    nan, inf = np.float32(np.nan), np.float32(np.inf)
    z = np.array([[nan, -1, 2, -inf, inf, -1000, 1000]], np.float32)
    a = np.empty_like(z)
    REF.bias_activation("relu", z.copy(), np.zeros(1, np.float32), a)
    assert np.array_equal(a, [[nan, 0, 2, 0, inf, 0, 1000]], equal_nan=True)
    REF.bias_activation("sigmoid", z.copy(), np.zeros(1, np.float32), a)
    assert np.isnan(a[0, 0]) and a[0, 3:].tolist() == [0, 1, 0, 1]
    REF.bias_activation("tanh", z.copy(), np.zeros(1, np.float32), a)
    assert np.isnan(a[0, 0]) and a[0, 3:].tolist() == [-1, 1, -1, 1]
    grad = np.array([9.5, -20, inf], np.float32)
    REF.activation_grad("tanh", grad, np.full(3, inf, np.float32))
    assert np.isnan(grad).all()                             # 0 . inf: tanh' is 0 there
    want = {"leaky_relu": [nan, -0.01, 2, -inf, inf, -10, 1000],
            "elu": [nan, math.expm1(-1), 2, -1, inf, -1, 1000],
            "gelu": [nan, -0.15865525, 1.9544997, nan, inf, 0, 1000],
            "silu": [nan, -0.26894142, 1.7615941, nan, inf, 0, 1000]}
    for kind, values in want.items():
        REF.bias_activation(kind, z.copy(), np.zeros(1, np.float32), a)
        assert np.allclose(a[0], values, rtol=F32, equal_nan=True), kind
    z_grad = np.array([nan, -inf, inf, -1000, 1000, 0], np.float32)
    want = {"leaky_relu": [0.01, 0.01, 1, 0.01, 1, 0.01], "elu": [nan, 0, 1, 0, 1, 1],
            "gelu": [nan, nan, nan, 0, 1, 0.5], "silu": [nan, nan, nan, 0, 1, 0.5]}
    for kind, values in want.items():
        grad = z_grad.copy()
        REF.activation_grad(kind, grad, np.ones(6, np.float32))
        assert np.allclose(grad, values, rtol=F32, equal_nan=True), kind
    logits = np.array([[1e30, 0, nan, inf, -inf], [1e30, -1e30, 0, 0, -inf]], np.float32)
    p = np.empty_like(logits)
    REF.bias_activation("softmax", logits, np.zeros(2, np.float32), p)
    assert np.array_equal(p, [[.5, 1, nan, nan, nan], [.5, 0, nan, nan, nan]], equal_nan=True)
    out = np.empty(4, np.int32)
    REF.argmax(out, np.array([[1, nan, 1, -inf], [3, 2, nan, -inf], [3, nan, 5, -inf]], np.float32))
    assert out.tolist() == [1, 0, 1, 0]
    x = np.array([1, nan, 3, nan, -inf, -inf, 5, 2], np.float32).reshape(1, 4, 2, 1)
    pooled, idx = np.empty((1, 2, 1, 1), np.float32), np.empty((1, 2, 1, 1), np.int32)
    REF.maxpool(pooled, idx, x, 2, 2)
    assert np.array_equal(pooled.ravel(), [nan, 5], equal_nan=True)
    assert idx.ravel().tolist() == [1, 6]
    dropped = np.empty(3, np.float32)
    REF.dropout(dropped, np.array([nan, inf, -inf], np.float32), key_array(0), 0.99999)
    assert np.isnan(dropped).all()
    loss, hit = np.zeros(3, np.float32), np.zeros(3, np.float32)
    probs = np.array([[0, 1, nan], [1, 0, 0]], np.float32)
    REF.softmax_xent(np.empty_like(probs), loss, hit, probs, np.zeros(3, np.int32))
    assert loss[0] == -np.log(TINY) and loss[1] == 0 and np.isnan(loss[2])
    assert hit.tolist() == [0, 1, 1]


@pytest.mark.parametrize("kind", ELEMENTWISE + ["softmax"])
def test_bias_activation(backend, rng, kind):
    rows, cols = 6, 300
    z = mixed(rng, (rows, cols), 0.05 if kind == "softmax" else 0.3)
    if kind == "softmax":       # columns of huge, tied, infinite and NaN logits
        z[:, :6] = np.array([[1e30, 1e30, 1000, -np.inf, np.inf, np.nan]] * rows, np.float32)
        z[1:, :3] = [[0, -1e30, 990]] * (rows - 1)
        b = np.zeros(rows, np.float32)
    else:                       # z + b overflows where z is 3e38
        b = rng.standard_normal(rows).astype(np.float32)
        b[:2] = [3e38, -1e30]
    want_z, want_a = z.copy(), np.empty_like(z)
    REF.bias_activation(kind, want_z, b, want_a)
    Z, A = backend.upload(z), poisoned(backend, (rows, cols))
    backend.bias_activation(kind, Z, backend.upload(b), A)
    assert_same(backend.download(Z), want_z, f"{kind}: z + b")
    assert_same(backend.download(A), want_a, f"{kind}: a")


def grad_terms(kind, z):
    """|the terms| of f'(z) that cancel in float32 on every device, in float64 (None where
    nothing cancels): 1 - tanh^2, s (1 - s), Phi(z) + z phi(z), s (1 + z (1 - s))."""
    z = z.astype(np.float64)
    f = activate(kind if kind != "silu" else "sigmoid", z)
    with np.errstate(invalid="ignore", over="ignore"):
        if kind == "tanh":
            return 1 + f * f
        if kind in ("sigmoid", "silu"):
            return f * (1 + f) if kind == "sigmoid" else f * (1 + np.abs(z) * (1 - f))
        if kind == "gelu":
            phi = np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
            return np.array([0.5 * math.erfc(-x / math.sqrt(2)) for x in z.ravel()]).reshape(
                z.shape) + np.abs(z) * phi
    return None


@pytest.mark.parametrize("kind", ELEMENTWISE)
def test_activation_grad(backend, rng, kind):
    z, da = mixed(rng, (7, 200)), mixed(rng, (7, 200), 0.1)
    z[:, :4], da[:, :4] = [20, -1000, np.inf, -np.inf], np.inf     # f' is 0: da inf gives NaN
    want = z.copy()
    REF.activation_grad(kind, want, da)
    terms = grad_terms(kind, z)
    with np.errstate(invalid="ignore"):             # inf . 0 where the result is NaN anyway
        scale = None if terms is None else terms * np.abs(da)
    Z = backend.upload(z)
    backend.activation_grad(kind, Z, backend.upload(da))
    assert_same(backend.download(Z), want, f"{kind}'(z) da", scale)


@pytest.mark.parametrize("kind", ELEMENTWISE)
def test_add_activation(backend, rng, kind):
    z, x = mixed(rng, (5, 7, 9)), mixed(rng, (5, 7, 9))
    # overflow, inf - inf, cancellation to 0 and to -0
    z.reshape(-1)[:4], x.reshape(-1)[:4] = [3e38, np.inf, -1e30, -0.0], [3e38, -np.inf, 1e30, -0.0]
    want_z, want_a = z.copy(), np.empty_like(z)
    REF.add_activation(kind, want_z, x, want_a)
    Z, A = backend.upload(z), poisoned(backend, z.shape)
    backend.add_activation(kind, Z, backend.upload(x), A)
    assert_same(backend.download(Z), want_z, f"{kind}: z + x")
    assert_same(backend.download(A), want_a, f"{kind}: a")


def _losses(backend, kernel, a, target, rows, cols, rng):
    """(device, reference) results of a loss kernel: delta, loss, hit, with earlier sums in
    loss and hit."""
    l0 = rng.random(cols).astype(np.float32)
    h0 = rng.integers(0, 5, cols).astype(np.float32)
    want = [np.empty((rows, cols), np.float32), l0.copy(), h0.copy()]
    getattr(REF, kernel)(*want, a, target)
    got = [poisoned(backend, (rows, cols)), backend.upload(l0), backend.upload(h0)]
    getattr(backend, kernel)(*got, backend.upload(a), backend.upload(target))
    return [backend.download(x) for x in got], want, l0


def test_softmax_xent(backend, rng):
    rows, cols = 5, 300
    a = mixed(rng, (rows, cols))
    a[:, :4] = [[0, np.nan, 1, 2]] * rows      # log 0 clamped; NaN ties; the first max wins
    a[2, :4] = [1, 0.5, 1, np.nan]
    labels = rng.integers(0, rows, cols).astype(np.int32)
    got, want, l0 = _losses(backend, "softmax_xent", a, labels, rows, cols, rng)
    assert_same(got[0], want[0], "delta")
    log_a = np.log(np.maximum(a[labels, np.arange(cols)].astype(np.float64), TINY))
    assert_same(got[1], want[1], "loss", np.abs(l0) + np.abs(log_a))
    assert_same(got[2], want[2], "hit")


def test_sigmoid_bce(backend, rng):
    rows, cols = 4, 300
    a = mixed(rng, (rows, cols))
    a[:, :3] = [[0, 1, 0.5]] * rows                 # log 0 on either side
    a[:, 3:6] = rng.random((rows, 3))               # probabilities: most columns are finite
    y = rng.choice(np.array([0, 1, 0.25], np.float32), (rows, cols))
    got, want, l0 = _losses(backend, "sigmoid_bce", a, y, rows, cols, rng)
    assert_same(got[0], want[0], "delta")
    a64, y64 = a.astype(np.float64), y.astype(np.float64)
    with np.errstate(invalid="ignore"):
        terms = (np.abs(y64 * np.log(np.maximum(a64, TINY)))
                 + np.abs((1 - y64) * np.log(np.maximum(1 - a64, TINY))))
    assert_same(got[1], want[1], "loss", np.abs(l0) + terms.sum(0))
    assert_same(got[2], want[2], "hit")


@pytest.mark.parametrize("rows", [1, 5])
def test_mse(backend, rng, rows):
    cols = 300
    a, y = mixed(rng, (rows, cols)), mixed(rng, (rows, cols), 0.1)
    a[:, :3] = [[3e38, np.nan, 1]] * rows           # 2 (a - y) overflows, (a - y) / 2.5 not
    y[:, :3] = [[1e38, 0, np.nan]] * rows
    got, want, _ = _losses(backend, "mse", a, y, rows, cols, rng)
    assert_same(got[0], want[0], "delta")
    assert_same(got[1], want[1], "loss")
    assert_same(got[2], want[2], "hit")


def test_argmax(backend, rng):
    a = mixed(rng, (9, 300))
    a[:, :5] = [[1, np.nan, -np.inf, np.inf, 0]] * 9       # ties: the first wins
    a[4, :5] = [2, 1, np.nan, np.nan, -0.0]
    out = backend.empty((300,), np.int32)
    backend.argmax(out, backend.upload(a))
    want = np.empty(300, np.int32)
    REF.argmax(want, a)
    got = backend.download(out)
    assert np.array_equal(got, want), f"columns {np.flatnonzero(got != want)} differ"


@pytest.mark.parametrize("pool,stride", [(2, 2), (3, 2)])
def test_maxpool(backend, rng, pool, stride):
    C, H, W, N = 3, 7, 8, 5
    x = mixed(rng, (C, H, W, N), 0.2)
    Ho, Wo = conv_out(H, pool, stride, 0), conv_out(W, pool, stride, 0)
    a, idx = np.empty((C, Ho, Wo, N), np.float32), np.empty((C, Ho, Wo, N), np.int32)
    REF.maxpool(a, idx, x, pool, stride)
    A, I = poisoned(backend, a.shape), backend.empty(a.shape, np.int32)
    backend.maxpool(A, I, backend.upload(x), pool, stride)
    assert_same(backend.download(A), a, "maxpool")
    assert np.array_equal(backend.download(I), idx), "argmax of the windows"
    da = mixed(rng, a.shape, 0.2)
    dx = np.empty_like(x)
    REF.maxpool_grad(dx, da, idx, pool, stride)
    DX = poisoned(backend, x.shape)
    backend.maxpool_grad(DX, backend.upload(da), backend.upload(idx), pool, stride)
    scale = np.empty_like(x)
    REF.maxpool_grad(scale, np.abs(da), idx, pool, stride)    # sums: relative to |terms|
    assert_same(backend.download(DX), dx, "maxpool_grad", scale)


@pytest.mark.parametrize("pool,stride", [((2, 2), (2, 2)), ((3, 2), (2, 1)), ((7, 8), (7, 8))])
def test_avgpool(backend, rng, pool, stride):
    C, H, W, N = 3, 7, 8, 5
    x = mixed(rng, (C, H, W, N), 0.1)
    x[0, :2, :2, 0] = [[3e38, 3e38], [3e38, 3e38]]        # the window's sum overflows
    shape = (C, conv_out(H, pool[0], stride[0], 0), conv_out(W, pool[1], stride[1], 0), N)
    a, da = np.empty(shape, np.float32), mixed(rng, shape, 0.1)
    dx = np.empty_like(x)
    REF.avgpool(a, x, pool, stride)
    REF.avgpool_grad(dx, da, pool, stride)
    A, DX = poisoned(backend, shape), poisoned(backend, x.shape)
    backend.avgpool(A, backend.upload(x), pool, stride)
    backend.avgpool_grad(DX, backend.upload(da), pool, stride)
    scale, scale_dx = np.empty(shape, np.float32), np.empty_like(x)     # sums: |terms|
    REF.avgpool(scale, np.abs(x), pool, stride)
    REF.avgpool_grad(scale_dx, np.abs(da), pool, stride)
    assert_same(backend.download(A), a, "avgpool", scale)
    assert_same(backend.download(DX), dx, "avgpool_grad", scale_dx)


def test_im2col_col2im(backend, rng):
    C, H, W, N, k, s, p = 2, 6, 5, 3, 3, 2, 1
    Ho, Wo = conv_out(H, k, s, p), conv_out(W, k, s, p)
    x, c = mixed(rng, (C, H, W, N)), mixed(rng, (C * k * k, Ho * Wo * N), 0.1)
    cols, back = np.empty(c.shape, np.float32), np.empty(x.shape, np.float32)
    REF.im2col(cols, x, k, s, p)
    REF.col2im(back, c, k, s, p)
    COLS, BACK = poisoned(backend, c.shape), poisoned(backend, x.shape)
    backend.im2col(COLS, backend.upload(x), k, s, p)
    backend.col2im(BACK, backend.upload(c), k, s, p)
    assert_same(backend.download(COLS), cols, "im2col")
    scale = np.empty_like(back)
    REF.col2im(scale, np.abs(c), k, s, p)              # col2im sums: relative to |terms|
    assert_same(backend.download(BACK), back, "col2im", scale)


@pytest.mark.parametrize("rate", [0.0, 0.5])
def test_dropout(backend, rng, rate):
    x = mixed(rng, (3001,))
    key = 12345
    want = np.empty_like(x)
    REF.dropout(want, x, key_array(key), rate)
    out = poisoned(backend, x.shape)
    backend.dropout(out, backend.upload(x), backend.upload(key_array(key)), rate)
    assert_same(backend.download(out), want, f"dropout({rate})")


def test_blas1(backend, rng):
    """axpy, scal, copy and gemv^T propagate NaN and inf as NumPy does
    (alpha below 1 in size: a device may fuse alpha x + y, which must not matter)."""
    x, y = mixed(rng, (2000,)), mixed(rng, (2000,))
    Y = backend.upload(y)
    backend.axpy(-0.75, backend.upload(x), Y)
    want = y.copy()
    REF.axpy(-0.75, x, want)
    terms = 0.75 * np.abs(x.astype(np.float64)) + np.abs(y)
    assert_same(backend.download(Y), want, "axpy", terms)
    backend.scal(0.5, Y)
    REF.scal(0.5, want)
    assert_same(backend.download(Y), want, "scal", 0.5 * terms)
    C = poisoned(backend, x.shape)
    backend.copy(backend.upload(x), C)
    assert_same(backend.download(C), x, "copy")


def test_optimizer_updates(backend, rng):
    """NaN and inf in the weights and gradients (and overflowing squares) go where the
    reference's do through every update; finite values agree relative to the size of the
    terms (coefficients below 1: a device may fuse a product into a sum, which must not
    matter). The state is finite, v - gavg^2 at least 0.01 (it stays positive; where it is
    far smaller, sqrt(v - gavg^2) cancels and float32 results part by more than rounding)."""
    n, n_decay = 600, 350
    w, g = mixed(rng, (n,)), mixed(rng, (n,))
    m, buf, gavg = (0.1 * rng.standard_normal(n).astype(np.float32) for _ in range(3))
    v = (gavg.astype(np.float64) ** 2 + 0.01 * (1 + rng.random(n))).astype(np.float32)
    decayed = np.arange(n) < n_decay
    lr, mu, wd, beta1, beta2, alpha, eps = 0.1, 0.9, 0.01, 0.9, 0.999, 0.99, 1e-8
    scalars = np.array([lr / (1 - beta1 ** 3), math.sqrt(1 - beta2 ** 3), 1.0, lr], np.float32)
    decayed_scalars = scalars.copy()
    decayed_scalars[2] = 1 - lr * wd                    # AdamW's
    runs = {
        "momentum": (lambda b, x: b.momentum_update(x["w"], x["v"], lr * wd, n_decay),
                     ("w", "v")),
        "sgd": (lambda b, x: b.sgd_update(x["w"], x["g"], x["v"], lr, mu, wd, n_decay, False),
                ("w", "v")),
        "nesterov": (lambda b, x: b.sgd_update(x["w"], x["g"], x["v"], lr, mu, wd, n_decay, True),
                     ("w", "v")),
        "adam": (lambda b, x: b.adam_update(x["w"], x["g"], x["m"], x["v"], x["scalars"], beta1,
                                            beta2, eps, wd, n_decay), ("w", "m", "v")),
        "adamw": (lambda b, x: b.adam_update(x["w"], x["g"], x["m"], x["v"], x["decayed"],
                                             beta1, beta2, eps, 0.0, n_decay), ("w", "m", "v")),
        "rmsprop": (lambda b, x: b.rmsprop_update(x["w"], x["g"], x["v"], x["buf"], None, lr,
                                                  alpha, eps, wd, mu, n_decay), ("w", "v", "buf")),
        "rmsprop centered": (lambda b, x: b.rmsprop_update(x["w"], x["g"], x["v"], None,
                                                           x["gavg"], lr, alpha, eps, wd, 0.0,
                                                           n_decay), ("w", "v", "gavg")),
    }
    # centered RMSprop's v - gavg^2 is where a fused multiply-add turns the reference's
    # inf - inf (an overflowed second moment less an overflowing square) into inf: finite
    # gradients and weights stay below 1e18 there, whose squares do not overflow
    huge = np.isfinite(w) & (np.abs(w) > 1e18), np.isfinite(g) & (np.abs(g) > 1e18)
    tame = np.where(huge[0], np.sign(w) * 1e18, w), np.where(huge[1], np.sign(g) * 1e18, g)
    for name, (run, outputs) in runs.items():
        w_, g_ = tame if name == "rmsprop centered" else (w, g)
        host = {"w": w_, "g": g_, "m": m, "v": v, "buf": buf, "gavg": gavg, "scalars": scalars,
                "decayed": decayed_scalars}
        want = {k: x.copy() for k, x in host.items()}
        run(REF, want)
        got = {k: backend.upload(x) for k, x in host.items()}
        run(backend, got)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            scales = _update_terms(name, host, want, decayed, lr, mu, wd, beta1, alpha,
                                   scalars)
        for k in outputs:
            assert_same(backend.download(got[k]), want[k], f"{name}: {k}", scales.get(k))


def _update_terms(name, host, want, decayed, lr, mu, wd, beta1, alpha, scalars):
    """|the terms| each output of an update sums, in float64, from its inputs (None where
    all terms have one sign)."""
    x = {k: np.abs(a.astype(np.float64)) for k, a in host.items()}
    d_terms = x["g"] + np.where(decayed, wd * x["w"], 0)
    if name == "momentum":
        v = x["v"] + np.where(decayed, lr * wd * x["w"], 0)
        return {"v": v, "w": x["w"] + v}
    if name in ("sgd", "nesterov"):
        v = mu * x["v"] + lr * d_terms
        return {"v": v, "w": x["w"] + (mu * v + lr * d_terms if name == "nesterov" else v)}
    if name.startswith("adam"):
        d = d_terms if name == "adam" else x["g"]
        m = beta1 * x["m"] + (1 - beta1) * d
        den = np.sqrt(want["v"].astype(np.float64)) / scalars[1] + 1e-8
        return {"m": m, "w": x["w"] + scalars[0] * m / den}
    if name == "rmsprop":
        den = np.sqrt(want["v"].astype(np.float64)) + 1e-8
        buf = mu * x["buf"] + d_terms / den
        return {"buf": buf, "w": x["w"] + lr * buf}
    den = np.sqrt(np.abs(want["v"].astype(np.float64) - want["gavg"].astype(np.float64) ** 2))
    den += 1e-8
    return {"gavg": alpha * x["gavg"] + (1 - alpha) * d_terms, "w": x["w"] + lr * d_terms / den}
