"""The NumPy reference backend: plain, obviously right, and the oracle of every test."""
import functools
import math
import os

import numpy as np

from ..precision import from_storage, round_to, to_storage
from ..rng import dropout_mask
from .base import ACC_K, CONV_WORKSPACE_BYTES, Backend, conv_out, features_first
from .checks import (check_activation, check_activation_grad, check_adam, check_add_activation,
                     check_alike, check_conv, check_found, check_gather, check_gemm,
                     check_loss_scale, check_norm_grad, check_norm_kind, check_pool, check_rows,
                     check_skip, check_stored, check_transpose, check_update, log_beta)


def _skipped(op, skip):
    """Whether an update's skip flag (checked) says to change nothing (a loss-scaled step
    whose gradients overflowed)."""
    check_skip(op, skip)
    return skip is not None and skip[0] != 0


def _quiet(method):
    """Arithmetic as a GPU does it: overflow gives inf, inf - inf NaN, without NumPy's
    warnings; a diverged run is reported once, by fit's DivergedError."""
    @functools.wraps(method)
    def quiet(*args, **kwargs):
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            return method(*args, **kwargs)
    return quiet


EMULATED = ("tf32", "bf16", "fp16")     # the precisions below float32 it emulates


class NumpyBackend(Backend):
    kind = "cpu"

    def __init__(self, name="cpu", dtype=np.float32, precision=None):
        super().__init__(name, dtype, precision)
        self.check_precision()

    @property
    def precisions(self):
        """EMULATED's too: each product's inputs rounded as a tensor core rounds them."""
        return super().precisions + (EMULATED if self.dtype == np.float32 else ())

    def _product(self, a, b, out=None):
        """a @ b as the device's matrix products compute it in this precision: inputs
        rounded to it (round_to: fp32 and fp64 as they are), products and sums in the dtype."""
        return np.matmul(round_to(self._value(a), self.precision),
                         round_to(self._value(b), self.precision), out=out)

    def _value(self, x):
        """x's float32 values: x itself, or what its 16-bit storage holds."""
        return from_storage(x, self.precision) if self._stored(x) else x

    def _store(self, dst, values):
        """dst <- values, rounded as the kernels store them where dst is 16-bit storage
        (values of its own dtype are stored values already: a download written back)."""
        stored = self._stored(dst) and np.asarray(values).dtype != dst.dtype
        dst[...] = to_storage(values, self.precision) if stored else values

    # -- memory: device arrays are NumPy arrays ------------------------------------------

    def empty(self, shape, dtype=None, label="buffer"):
        x = np.empty(shape, dtype=dtype or self.dtype)
        return self._track(x, x.nbytes)

    def write(self, dst, host, wait=True):
        self._store(dst, np.asarray(host).reshape(dst.shape))

    def write_samples(self, dst, host, staging=None, bad=None, first=0):
        if self._stored(dst):
            self._store(dst, features_first(host, self.dtype))
        else:
            features_first(host, dst.dtype, out=dst)
        if bad is not None:
            self._flag_nonfinite(bad, host, first)

    def download(self, x):
        return np.array(x)

    def dlpack_view(self, x):
        """x itself: a NumPy array speaks DLPack."""
        return x

    def view(self, x, shape, offset=0):
        n = int(np.prod(shape))
        return x.reshape(-1)[offset:offset + n].reshape(shape)

    def fill(self, x, value):
        self._store(x, np.full(x.shape, value, self.dtype))

    def copy(self, src, dst):
        check_alike("copy", src=src, dst=dst)
        dst[...] = src.reshape(dst.shape)

    def transpose(self, x, out):
        check_transpose(x, out)
        out[...] = x.T

    def memory_info(self):
        """The host's available memory (what can be allocated without swapping) and its
        total."""
        return _host_memory()

    # -- BLAS ----------------------------------------------------------------------------

    @_quiet
    def gemm(self, alpha, a, b, beta, c, trans_a=False, trans_b=False):
        check_gemm(a, b, c, trans_a, trans_b)
        product = self._product(a.T if trans_a else a, b.T if trans_b else b)
        _scale(beta, c)
        c += alpha * product

    @_quiet
    def gemv(self, alpha, a, x, beta, y, trans_a=False):
        """In pieces of ACC_K terms, as the kernels sum: BLAS's gemv runs a transposed
        product's whole K in one float sum (5e-6 off float64 at K = 150000)."""
        op = a.T if trans_a else a
        k = op.shape[1]
        product = np.zeros(op.shape[0], y.dtype)
        for k0 in range(0, k, ACC_K):
            product += op[:, k0:k0 + ACC_K] @ x[k0:k0 + ACC_K]
        _scale(beta, y)
        y += alpha * product

    @_quiet
    def ger(self, alpha, x, y, a):
        a += alpha * np.outer(x, y)

    @_quiet
    def axpy(self, alpha, x, y):
        y += alpha * x

    @_quiet
    def scal(self, alpha, x):
        x *= alpha

    def gather(self, out, x, idx):
        check_gather(out, x, idx)
        self._store(out, x[idx].T)

    @_quiet
    def momentum_update(self, w, v, decay, n_decay, skip=None):
        check_update("momentum_update", n_decay, w, v)
        if _skipped("momentum_update", skip):
            return
        if decay != 0:
            v[:n_decay] -= decay * w[:n_decay]
        w += v

    @_quiet
    def sgd_update(self, w, g, v, lr, momentum, weight_decay, n_decay, nesterov, skip=None):
        check_update("sgd_update", n_decay, w, g, v)
        if _skipped("sgd_update", skip):
            return
        d = _decayed(g, weight_decay, w, n_decay)
        v[...] = momentum * v - lr * d
        w += momentum * v - lr * d if nesterov else v

    @_quiet
    def adam_update(self, w, g, m, v, scalars, beta1, beta2, eps, l2, shrink, n_decay,
                    skip=None):
        check_adam(scalars, n_decay, w, g, m, v)
        if _skipped("adam_update", skip):
            return
        d = _decayed(g, l2, w, n_decay)
        beta1, beta2 = float(beta1), float(beta2)
        w[:n_decay] *= 1 - float(shrink)
        m[...] = beta1 * m + (1 - beta1) * d
        v[...] = beta2 * v + (1 - beta2) * (d * d)
        w -= scalars[0] * (m / (np.sqrt(v) / scalars[1] + eps))

    @_quiet
    def rmsprop_update(self, w, g, v, buf, gavg, lr, alpha, eps, l2, momentum, n_decay,
                       skip=None):
        check_update("rmsprop_update", n_decay, w, g, v, buf, gavg)
        if _skipped("rmsprop_update", skip):
            return
        d = _decayed(g, l2, w, n_decay)
        alpha = float(alpha)
        v[...] = alpha * v + (1 - alpha) * (d * d)
        if gavg is None:
            den = np.sqrt(v) + eps
        else:
            gavg[...] = alpha * gavg + (1 - alpha) * d
            den = np.sqrt(v - gavg * gavg) + eps
        if buf is None:
            w -= lr * (d / den)
        else:
            buf[...] = momentum * buf + d / den
            w -= lr * buf

    # -- dynamic loss scaling -----------------------------------------------------------

    @_quiet
    def scale_by(self, x, s):
        check_loss_scale("scale_by", s)
        x *= s[0]

    @_quiet
    def unscale_check(self, g, s, found):
        check_loss_scale("unscale_check", s)
        check_found("unscale_check", found)
        g *= s[1]
        if not np.isfinite(g).all():
            found[0] = -1

    @_quiet
    def adam_scalars(self, s, t, found, lr, beta1, beta2):
        check_found("adam_scalars", found)
        if found[0] != 0:
            return
        real = s.dtype.type
        t[0] += 1
        s[0] = real(lr) / -np.expm1(t[0] * real(log_beta(beta1)))
        s[1] = np.sqrt(-np.expm1(t[0] * real(log_beta(beta2))))

    def update_loss_scale(self, s, found, growth_interval, low, high):
        check_loss_scale("update_loss_scale", s)
        check_found("update_loss_scale", found)
        if found[0] != 0:
            found[0] = 0
            s[2] = 0
            s[3] += 1
            if s[0] > low:
                s[0] *= 0.5
                s[1] *= 2
        else:
            s[2] += 1
            if s[2] >= growth_interval:
                s[2] = 0
                if s[0] < high:
                    s[0] *= 2
                    s[1] *= 0.5

    # -- NN ------------------------------------------------------------------------------

    @_quiet
    def bias_activation(self, kind, z, b, a, stored=None):
        check_activation(kind)
        if stored is not None or self._stored(a):
            check_stored(self, z, a, stored)
            biased = z + b[:, None]
            self._store(stored, biased)
            self._store(a, activate(kind, biased))
            return
        z += b[:, None]
        a[...] = activate(kind, z)

    @_quiet
    def activation_bias_grad(self, kind, z, da, alpha, beta, gb, ones):
        if not self._stored(z):
            super().activation_bias_grad(kind, z, da, alpha, beta, gb, ones)
            return
        check_activation(kind)
        delta = (activate_grad(kind, self._value(z)) * da).astype(self.dtype)
        self.gemv(alpha, delta, ones, beta, gb)     # summed before the delta rounds
        self._store(z, delta)

    @_quiet
    def activation_grad(self, kind, z, da, delta=None):
        check_activation_grad(self, kind, z, da, delta)
        (z if delta is None else delta)[...] = activate_grad(kind, self._value(z)) * da

    @_quiet
    def add_activation(self, kind, z, x, a):
        check_add_activation(kind, z, x, a)
        total = self._value(z) + self._value(x)
        self._store(z, total)
        self._store(a, activate(kind, total))

    @_quiet
    def softmax_xent(self, delta, loss, hit, a, labels):
        m = a.shape[1]
        cols = np.arange(m)
        delta[...] = a
        delta[labels, cols] -= 1
        loss -= np.log(np.maximum(a[labels, cols], np.finfo(a.dtype).tiny))
        hit += np.argmax(a, axis=0) == labels

    @_quiet
    def sigmoid_bce(self, delta, loss, hit, a, y):
        tiny = np.finfo(a.dtype).tiny
        delta[...] = a - y
        loss -= np.sum(y * np.log(np.maximum(a, tiny))
                       + (1 - y) * np.log(np.maximum(1 - a, tiny)), axis=0)
        hit += np.all((a > 0.5) == (y > 0.5), axis=0)

    @_quiet
    def mse(self, delta, loss, hit, a, y):
        n = a.shape[0]                       # delta may alias a: read a first
        loss += np.mean((a - y) ** 2, axis=0)
        if n > 1:
            hit += np.argmax(a, axis=0) == np.argmax(y, axis=0)
        else:
            hit += np.abs(a - y)[0] < 0.5
        delta[...] = (2.0 / n) * (a - y)

    def argmax(self, out, a):
        out[...] = np.argmax(a, axis=0)

    def im2col(self, cols, x, k, stride, pad):
        C, H, W, N = x.shape
        Ho, Wo = conv_out(H, k, stride, pad), conv_out(W, k, stride, pad)
        xp = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
        out = cols.reshape(C, k, k, Ho, Wo, N)
        for ki in range(k):
            for kj in range(k):
                out[:, ki, kj] = xp[:, ki:ki + stride * Ho:stride, kj:kj + stride * Wo:stride]

    @_quiet
    def col2im(self, x, cols, k, stride, pad):
        C, H, W, N = x.shape
        Ho, Wo = conv_out(H, k, stride, pad), conv_out(W, k, stride, pad)
        xp = np.zeros((C, H + 2 * pad, W + 2 * pad, N), x.dtype)
        patches = cols.reshape(C, k, k, Ho, Wo, N)
        for ki in range(k):
            for kj in range(k):
                xp[:, ki:ki + stride * Ho:stride, kj:kj + stride * Wo:stride] += patches[:, ki, kj]
        x[...] = xp[:, pad:pad + H, pad:pad + W]

    # convolution as im2col and a matrix product, chunk by chunk where the workspace does
    # not hold the whole patch matrix (chunks of whole columns, (oh, ow, n) in order)

    @_quiet
    def conv(self, kind, w, x, b, z, a, k, stride, pad, workspace=None, stored=None):
        g = check_conv("conv", x, k, stride, pad, w=w, b=b, z=z, a=a)
        zf = z.reshape(g.F, g.positions)
        if stored is not None or self._stored(a):     # (before z is written)
            stored = None if stored is None else stored.reshape(zf.shape)
            check_stored(self, zf, a.reshape(zf.shape), stored, "conv")
        chunks = self._patch_chunks(g, workspace)
        xv = self._value(x)
        for j0, j1, cols in chunks:
            self._patches(cols, xv, g, j0, j1)
            self._product(w, cols, out=zf[:, j0:j1])
        self.bias_activation(kind, zf, b, a.reshape(zf.shape), stored=stored)
        return workspace is not None and len(chunks) == 1

    @_quiet
    def conv_weight_grad(self, alpha, dz, x, beta, gw, k, stride, pad, workspace=None,
                         patches=False):
        g = check_conv("conv_weight_grad", x, k, stride, pad, gw=gw, dz=dz)
        dzf = dz.reshape(g.F, g.positions)
        _scale(beta, gw)
        chunks = self._patch_chunks(g, workspace)
        reuse = patches and workspace is not None and len(chunks) == 1   # as conv left it
        xv = x if reuse else self._value(x)
        for j0, j1, cols in chunks:
            if not reuse:
                self._patches(cols, xv, g, j0, j1)
            gw += alpha * self._product(dzf[:, j0:j1], cols.T)

    @_quiet
    def conv_input_grad(self, dx, w, dz, k, stride, pad, workspace=None):
        g = check_conv("conv_input_grad", dx, k, stride, pad, w=w, dz=dz)
        dzf = dz.reshape(g.F, g.positions)
        chunks = self._patch_chunks(g, workspace)
        if len(chunks) == 1:                          # the whole patch matrix: col2im
            self._product(w.T, dzf, out=chunks[0][2])
            self.col2im(dx, chunks[0][2], k, stride, pad)
            return
        dx[...] = 0
        for j0, j1, dcols in chunks:
            self._product(w.T, dzf[:, j0:j1], out=dcols)
            _add_patches(dx, dcols, g, j0, j1)

    def _patch_chunks(self, g, workspace):
        """[(j0, j1, cols)]: the patch matrix's columns in chunks that the workspace (or,
        without one, a buffer of at most CONV_WORKSPACE_BYTES) holds, cols a view of it
        (C.k.k, j1 - j0)."""
        room = (workspace.size if workspace is not None
                else CONV_WORKSPACE_BYTES // self.dtype.itemsize) // g.rows
        row = g.Wo * g.N                   # whole output rows where they fit: slices
        step = max(1, min(room if room < row else room // row * row, g.positions))
        if workspace is None or workspace.size < g.rows * step:
            workspace = np.empty(g.rows * step, self.dtype)
        return [(j0, min(j0 + step, g.positions),
                 workspace[:g.rows * (min(j0 + step, g.positions) - j0)].reshape(g.rows, -1))
                for j0 in range(0, g.positions, step)]

    def _patches(self, cols, x, g, j0, j1):
        """cols <- columns j0 .. j1 of im2col(x)."""
        row = g.Wo * g.N
        if j0 % row == 0 and j1 % row == 0:
            out = cols.reshape(g.C, g.k, g.k, (j1 - j0) // row, g.Wo, g.N)
            for ki, kj, inside, window in _row_windows(g, j0 // row, j1 // row):
                out[:, ki, kj][inside] = x[window]
                _zero_outside(out[:, ki, kj], inside)
            return
        out = cols.reshape(g.C, g.k, g.k, j1 - j0)
        for ki, kj, h, w, n, inside in _patch_pixels(g, j0, j1):
            out[:, ki, kj] = np.where(inside, x[:, np.clip(h, 0, g.H - 1),
                                                np.clip(w, 0, g.W - 1), n], 0)

    def maxpool(self, a, idx, x, pool, stride):
        """(16-bit storage: on x's values, a stored after: the same bits as x's)"""
        check_alike("maxpool", a=a, x=x)
        if self._stored(x):
            values = np.empty(a.shape, self.dtype)
            self.maxpool(values, idx, self._value(x), pool, stride)
            self._store(a, values)
            return
        _, Ho, Wo, _ = a.shape
        flat = np.arange(x.size).reshape(x.shape)
        a[...] = x[:, :stride * Ho:stride, :stride * Wo:stride]
        idx[...] = flat[:, :stride * Ho:stride, :stride * Wo:stride]
        for pi in range(pool):                      # scan order of the kernels: first max wins
            for pj in range(pool):
                window = (slice(None), slice(pi, pi + stride * Ho, stride),
                          slice(pj, pj + stride * Wo, stride))
                # a NaN in the window is its maximum, the first NaN its argmax, as in
                # np.max and np.argmax (comparing alone kept a NaN only where it came first)
                better = (x[window] > a) | (np.isnan(x[window]) & ~np.isnan(a))
                a[better] = x[window][better]
                idx[better] = flat[window][better]

    @_quiet
    def maxpool_grad(self, dx, da, idx, pool, stride):
        flat = np.zeros(dx.size, dx.dtype)
        np.add.at(flat, idx.ravel(), da.ravel())
        dx[...] = flat.reshape(dx.shape)

    @_quiet
    def avgpool(self, a, x, pool, stride):
        check_alike("avgpool", a=a, x=x)
        if self._stored(x):                 # on x's values, the mean rounded as stored
            values = np.empty(a.shape, self.dtype)
            self.avgpool(values, self._value(x), pool, stride)
            self._store(a, values)
            return
        _, _, _, _, ph, pw, sh, sw, Ho, Wo = check_pool("avgpool", a, x, pool, stride)
        total = np.zeros(a.shape, a.dtype)
        for pi in range(ph):                # the kernel's order of summation
            for pj in range(pw):
                total += x[:, pi:pi + sh * Ho:sh, pj:pj + sw * Wo:sw]
        a[...] = total / (ph * pw)

    @_quiet
    def avgpool_grad(self, dx, da, pool, stride):
        _, _, _, _, ph, pw, sh, sw, Ho, Wo = check_pool("avgpool_grad", da, dx, pool, stride)
        total = np.zeros(dx.shape, dx.dtype)
        for pi in range(ph):                # the kernel's order of summation
            for pj in range(pw):
                total[:, pi:pi + sh * Ho:sh, pj:pj + sw * Wo:sw] += da
        dx[...] = total / (ph * pw)

    @_quiet
    def dropout(self, out, x, key, rate):
        check_alike("dropout", out=out, x=x)
        key = int(key.reshape(-1)[0]) & 0xFFFFFFFF
        mask = dropout_mask(x.size, key, rate).reshape(x.shape).astype(self.dtype)
        self._store(out, self._value(x) * mask / (1 - rate))

    @_quiet
    def batchnorm_train(self, kind, z, a, mean, inv_std, x, gamma, beta, running_mean,
                        running_var, eps, momentum):
        check_norm_kind(kind)
        rows, n = check_rows("batchnorm_train", x, {"z": z, "a": a},
                             {"mean": mean, "inv_std": inv_std, "gamma": gamma, "beta": beta,
                              "running_mean": running_mean, "running_var": running_var})
        check_alike("batchnorm_train", z=z, a=a, x=x)
        xs = self._value(x).reshape(rows, n)
        mu = xs.mean(axis=1)
        d = xs - mu[:, None]
        var = (d * d).mean(axis=1)                   # two passes, not E[x^2] - E[x]^2
        s = 1 / np.sqrt(var + eps)
        zs = (gamma[:, None] * (d * s[:, None]) + beta[:, None]).reshape(z.shape)
        self._store(z, zs)                           # x is read: z may be x
        self._store(a, activate(kind, zs))
        mean[...] = mu
        inv_std[...] = s
        unbiased = var * (n / (n - 1)) if n > 1 else var
        running_mean[...] = (1 - momentum) * running_mean + momentum * mu
        running_var[...] = (1 - momentum) * running_var + momentum * unbiased

    @_quiet
    def batchnorm_infer(self, kind, z, a, x, gamma, beta, running_mean, running_var, eps):
        check_norm_kind(kind)
        rows, n = check_rows("batchnorm_infer", x, {"z": z, "a": a},
                             {"gamma": gamma, "beta": beta, "running_mean": running_mean,
                              "running_var": running_var})
        check_alike("batchnorm_infer", z=z, a=a, x=x)
        s = 1 / np.sqrt(running_var + eps)
        zs = (gamma * s)[:, None] * (self._value(x).reshape(rows, n) - running_mean[:, None]) \
            + beta[:, None]
        self._store(z, zs.reshape(z.shape))
        self._store(a, activate(kind, zs.reshape(z.shape)))

    @_quiet
    def batchnorm_grad(self, dx, dgamma, dbeta, dz, x, gamma, mean, inv_std, alpha, beta):
        rows, n = check_rows("batchnorm_grad", x, {"dx": dx, "dz": dz},
                             {"dgamma": dgamma, "dbeta": dbeta, "gamma": gamma, "mean": mean,
                              "inv_std": inv_std})
        check_norm_grad(self, dx, dz)
        dzs = dz.reshape(rows, n)
        xhat = (self._value(x).reshape(rows, n) - mean[:, None]) * inv_std[:, None]
        sum_dz = dzs.sum(axis=1)
        sum_dz_xhat = (dzs * xhat).sum(axis=1)
        if dx is not None:
            g = (gamma * inv_std)[:, None] * (dzs - sum_dz[:, None] / n
                                              - xhat * (sum_dz_xhat[:, None] / n))
            dx[...] = g.reshape(dx.shape)
        dbeta[...] = alpha * sum_dz + (beta * dbeta if beta != 0 else 0)
        dgamma[...] = alpha * sum_dz_xhat + (beta * dgamma if beta != 0 else 0)

    def info(self):
        return {"name": "NumPy reference on the host CPU", "vendor": "numpy " + np.__version__,
                "memory_bytes": _host_memory()[1], "compute_units": os.cpu_count()}


def _scale(beta, c):
    """c <- beta c, where beta = 0 means c is not read (BLAS: it may hold garbage or NaN)."""
    if beta == 0:
        c[...] = 0
    else:
        c *= beta


# leaky_relu's slope for z <= 0 (PyTorch's default); 1 / sqrt 2 and 1 / sqrt(2 pi) for gelu
LEAKY_SLOPE = 0.01
SQRT1_2 = 0.70710678118654752440
INV_SQRT_2PI = 0.39894228040143267794


def activate(kind, z):
    """f(z) of an activation, in the kernels' order of operations, so that inf and NaN come
    out where theirs do: gelu(-inf) and silu(-inf) are NaN (-inf . 0), as in PyTorch."""
    if kind == "linear":
        return z
    if kind == "relu":
        return np.maximum(z, 0)
    if kind == "tanh":
        return _tanh(z)
    if kind == "softmax":
        e = np.exp(z - z.max(axis=0, keepdims=True))    # softmax over features, per sample
        return e / e.sum(axis=0, keepdims=True)
    with np.errstate(over="ignore", invalid="ignore"):  # the branch np.where drops
        if kind == "sigmoid":
            return 1 / (1 + np.exp(-z))
        if kind == "leaky_relu":
            return np.where(z > 0, z, LEAKY_SLOPE * z)
        if kind == "elu":
            return np.where(z > 0, z, np.expm1(z))
        if kind == "gelu":                  # 0.5 z (1 + erf(z / sqrt 2)) without cancelling
            return 0.5 * z * _erfc(-z * SQRT1_2)
        if kind == "silu":
            return z / (1 + np.exp(-z))
    raise ValueError(f"unknown activation {kind!r}")


def activate_grad(kind, z):
    """f'(z), the formula as written: NaN where it multiplies inf by 0 (tanh' at inf is
    exactly 0, gelu' and silu' at +-inf are NaN), NaN from NaN but for linear, relu and
    leaky_relu, whose comparison z > 0 sends NaN to the other branch's constant (PyTorch's
    elu' tests z <= 0 and gives 1 there; ours gives exp(NaN))."""
    one = z.dtype.type(1)
    if kind in ("linear", "softmax"):      # softmax is only used fused with cross-entropy
        return np.ones_like(z)
    if kind == "relu":
        return (z > 0).astype(z.dtype)
    if kind == "tanh":
        return 1 - _tanh(z) ** 2
    with np.errstate(over="ignore", invalid="ignore"):
        if kind == "sigmoid":
            s = activate("sigmoid", z)
            return s * (1 - s)
        if kind == "leaky_relu":
            return np.where(z > 0, one, z.dtype.type(LEAKY_SLOPE))
        if kind == "elu":
            return np.where(z > 0, one, np.exp(z))
        if kind == "gelu":                  # Phi(z) + z phi(z)
            return 0.5 * _erfc(-z * SQRT1_2) + z * np.exp(-0.5 * z * z) * INV_SQRT_2PI
        if kind == "silu":                  # s (1 + z (1 - s)), s = sigmoid(z)
            s = activate("sigmoid", z)
            return s * (1 + z * (1 - s))
    raise ValueError(f"unknown activation {kind!r}")


_ERFC = np.frompyfunc(math.erfc, 1, 1)


def _erfc(x):
    """erfc elementwise in x's dtype: Python's math.erfc in double (NumPy has none), rounded
    once to float32 where x is float32. About 0.1 s a million elements, 150 times np.exp's
    time: a GELU network's cpu steps pay it twice per layer."""
    x = np.asarray(x)
    return _ERFC(x).astype(x.dtype)


def _decayed(g, decay, w, n_decay):
    """d = g + decay w on the first n_decay elements (the weights), g on the rest; a decay
    of 0 is no term at all, as in PyTorch (0 w would make an infinite weight's d NaN)."""
    d = g.copy()
    if decay != 0:
        d[:n_decay] += decay * w[:n_decay]
    return d


# |z| from which tanh rounds to +-1 (1 - tanh z under half an ulp of 1): ln(2^26 - 1) / 2 in
# float32, ln(2^55 - 1) / 2 in float64, as in the kernels (elementwise.cl)
TANH_ONE = {np.dtype(np.float32): 9.0109134, np.dtype(np.float64): 19.061547465}


def _tanh(z):
    """tanh, exactly +-1 from TANH_ONE on: libraries differ by an ulp there (NumPy's float32
    tanh reaches 1 only near 9.6, PoCL's never, not even at inf), and 1 - tanh^2 made of that
    ulp a derivative of 1.2e-7 or 0, so that an inf gradient gave inf or NaN."""
    one = TANH_ONE.get(np.asarray(z).dtype)
    return np.tanh(z) if one is None else np.where(np.abs(z) > one, np.sign(z), np.tanh(z))


def _host_memory():
    """(available, total) bytes of host memory. Linux's MemAvailable counts the page cache
    the kernel would give up, sysconf's free pages do not: they are the fallback (macOS
    has neither; then all of it is taken as available and NumPy's MemoryError decides)."""
    total = _sysconf_bytes("SC_PHYS_PAGES")
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, total        # given in kB
    except (OSError, ValueError, IndexError):
        pass
    return _sysconf_bytes("SC_AVPHYS_PAGES") or total, total


def _sysconf_bytes(pages):
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf(pages)
    except (ValueError, OSError, AttributeError):       # unknown name, or not POSIX
        return 0


def _patch_pixels(g, j0, j1):
    """For each window offset (ki, kj): the pixel (h, w, n) that columns j0 .. j1 of the
    patch matrix take from the images there (as index arrays), and whether it is inside
    the image (else padding)."""
    q, n = np.divmod(np.arange(j0, j1), g.N)
    oh, ow = np.divmod(q, g.Wo)
    for ki in range(g.k):
        h = oh * g.stride - g.pad + ki
        for kj in range(g.k):
            w = ow * g.stride - g.pad + kj
            yield ki, kj, h, w, n, (h >= 0) & (h < g.H) & (w >= 0) & (w < g.W)


def _row_windows(g, oh0, oh1):
    """For each window offset (ki, kj) and output rows oh0 .. oh1: (ki, kj, inside,
    window), slices of the (C, rows, Wo, N) patches that come from inside the image and of
    the image they come from (every stride-th pixel)."""
    def inside(first, last, offset, size):      # outputs o with 0 <= o s - p + offset < size
        lo = max(first, -(-(g.pad - offset) // g.stride))
        return lo, max(lo, min(last, (size - 1 + g.pad - offset) // g.stride + 1))

    def pixels(lo, hi, offset):                 # the image's pixels of outputs lo .. hi
        start = lo * g.stride - g.pad + offset
        return slice(start, start + (hi - lo - 1) * g.stride + 1, g.stride) if hi > lo \
            else slice(0, 0)
    for ki in range(g.k):
        h0, h1 = inside(oh0, oh1, ki, g.H)
        for kj in range(g.k):
            w0, w1 = inside(0, g.Wo, kj, g.W)
            yield (ki, kj, (slice(None), slice(h0 - oh0, h1 - oh0), slice(w0, w1)),
                   (slice(None), pixels(h0, h1, ki), pixels(w0, w1, kj)))


def _zero_outside(patches, inside):
    """patches (C, rows, Wo, N) <- 0 outside the rows and columns of `inside`."""
    rows, cols = inside[1], inside[2]
    patches[:, :rows.start] = 0
    patches[:, rows.stop:] = 0
    patches[:, :, :cols.start] = 0
    patches[:, :, cols.stop:] = 0


def _add_patches(x, cols, g, j0, j1):
    """x += col2im of columns j0 .. j1 of a patch matrix (the pixels of one window offset
    are distinct, so a fancy-indexed += adds each once)."""
    row = g.Wo * g.N
    if j0 % row == 0 and j1 % row == 0:
        patches = cols.reshape(g.C, g.k, g.k, (j1 - j0) // row, g.Wo, g.N)
        for ki, kj, inside, window in _row_windows(g, j0 // row, j1 // row):
            x[window] += patches[:, ki, kj][inside]
        return
    patches = cols.reshape(g.C, g.k, g.k, j1 - j0)
    for ki, kj, h, w, n, inside in _patch_pixels(g, j0, j1):
        x[:, h[inside], w[inside], n[inside]] += patches[:, ki, kj][:, inside]
