"""A layer's activations: the bias and activation after a product, their gradient, a
residual block's sum and activation, and dropout (elementwise.cl, conv.cl's dropout); with
the reference's activation functions, in the kernels' order of operations."""
import math

import numpy as np

from ...rng import dropout_mask
from ..arrays import ACT, STEPS
from ..checks import (check_activation, check_activation_grad, check_add_activation,
                      check_alike, check_stored)
from ..shadows import _kept_key
from .reference import quiet


class ActivationOps:
    """The family's interface: what each op does, whatever runs it."""

    def bias_activation(self, kind, z, b, a, stored=None):
        """z <- z + b 1^T; a <- f(z). z, a: (features, batch); b: (features,). With stored,
        a layer's 16-bit storage (bf16, fp16: precision.STORAGE): z is a product's float32
        sum, and stored <- z + b 1^T, a <- f(z + b 1^T) are written in 16 bits, z as it
        was."""
        raise NotImplementedError

    def activation_grad(self, kind, z, da, delta=None):
        """z <- f'(z) * da, the layer's delta, in place in z; given delta, delta <- f'(z) * da
        instead, z unchanged: z may then be in 16-bit storage (a BatchNorm's or a Residual
        block's, storage_dtype), da and delta are real, and delta may be da."""
        raise NotImplementedError

    def add_activation(self, kind, z, x, a):
        """z <- z + x; a <- f(z), elementwise (a residual block's sum and its activation).
        kind is any activation but softmax; z, x, a have the same shape (any rank) and are
        stored alike: all real, or all 16-bit (z and a each rounded from the real sum)."""
        raise NotImplementedError

    def dropout(self, out, x, key, rate):
        """out <- x . mask / (1 - rate); mask from a counter-based hash of (key, index), the
        same on every backend. key: a one-element int32 device array holding the key's 32
        bits (rng.key_array), read by the kernel, so that a recorded step's replays read
        each step's key. The backward is the same call on the gradients."""
        raise NotImplementedError


class ActivationReference(ActivationOps):
    """NumPy's: device arrays are NumPy arrays."""

    @quiet
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

    @quiet
    def activation_grad(self, kind, z, da, delta=None):
        check_activation_grad(self, kind, z, da, delta)
        (z if delta is None else delta)[...] = activate_grad(kind, self._value(z)) * da

    @quiet
    def add_activation(self, kind, z, x, a):
        check_add_activation(kind, z, x, a)
        total = self._value(z) + self._value(x)
        self._store(z, total)
        self._store(a, activate(kind, total))

    @quiet
    def dropout(self, out, x, key, rate):
        check_alike("dropout", out=out, x=x)
        key = int(key.reshape(-1)[0]) & 0xFFFFFFFF
        mask = dropout_mask(x.size, key, rate).reshape(x.shape).astype(self.dtype)
        self._store(out, self._value(x) * mask / (1 - rate))


class ActivationKernels(ActivationOps):
    """KernelBackend's: launches of elementwise.cl's kernels and conv.cl's dropout."""

    def bias_activation(self, kind, z, b, a, stored=None):
        check_activation(kind)
        rows, cols = z.shape
        if stored is not None or self._stored(a):
            check_stored(self, z, a, stored)
            self._run("bias_activation_stored", (cols, -(-rows // STEPS)), a, stored, z, b,
                      ACT[kind], rows, cols, stored=True)
            return
        if kind == "softmax":
            self._fresh.discard(_kept_key(a))
            self._run("bias_softmax", (cols,), a, z, b, rows, cols)
        else:
            self._run("bias_activation", (cols, -(-rows // STEPS)), a, z, b,
                      *self._copy_beside(a), ACT[kind], rows, cols)

    def activation_grad(self, kind, z, da, delta=None):
        check_activation_grad(self, kind, z, da, delta)
        if delta is not None:
            self._run("activation_delta", (z.size,), delta, z, da, ACT[kind], z.size,
                      stored=self._stored(z))
            return
        self._run("activation_grad", (z.size,), z, da, *self._copy_beside(z), ACT[kind],
                  z.size)

    def add_activation(self, kind, z, x, a):
        check_add_activation(kind, z, x, a)
        self._run("add_activation", (z.size,), a, z, x, ACT[kind], z.size,
                  stored=self._stored(z))

    def dropout(self, out, x, key, rate):
        check_alike("dropout", out=out, x=x)
        self._run("dropout", (out.size,), out, x, key, float(rate), 1.0 / (1.0 - rate),
                  out.size, stored=self._stored(x))


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
    if kind == "sigmoid_of_a":             # z holds a (arrays.OF_OUTPUT)
        return z * (one - z)
    if kind == "tanh_of_a":
        return one - z * z
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


# |z| from which tanh rounds to +-1 (1 - tanh z under half an ulp of 1): ln(2^26 - 1) / 2 in
# float32, ln(2^55 - 1) / 2 in float64, as in the kernels (elementwise.cl)
TANH_ONE = {np.dtype(np.float32): 9.0109134, np.dtype(np.float64): 19.061547465}


def _tanh(z):
    """tanh, exactly +-1 from TANH_ONE on: libraries differ by an ulp there (NumPy's float32
    tanh reaches 1 only near 9.6, PoCL's never, not even at inf), and 1 - tanh^2 made of that
    ulp a derivative of 1.2e-7 or 0, so that an inf gradient gave inf or NaN."""
    one = TANH_ONE.get(np.asarray(z).dtype)
    return np.tanh(z) if one is None else np.where(np.abs(z) > one, np.sign(z), np.tanh(z))
