"""Layers, written once against the Backend interface.

Activations are (features, batch): a column per sample. A trainable layer owns w (out x in),
b (out,), the momentum buffers v (like w) and vb (like b), and views z, a of its batch buffers; its input
a_prev is a view of the previous layer's a. Backward overwrites activations with gradients,
so a training step allocates nothing.
"""
import math

import numpy as np

from .backends.base import ACTIVATIONS
from .errors import InputError, ShapeError


class Layer:
    trainable = False

    def config(self):
        """The constructor arguments, for save files."""
        return {}

    def build(self, backend, in_shape, rng):
        """Allocate parameters for inputs of per-sample shape `in_shape`; return the output's."""
        self.backend = backend
        self.in_shape = tuple(in_shape)
        self.out_shape = self.output_shape(self.in_shape)
        return self.out_shape

    def output_shape(self, in_shape):
        return in_shape

    def allocate(self, capacity):
        """Batch buffers for up to `capacity` samples (called when the batch grows)."""

    def bind(self, a_prev, m):
        """Views for a batch of m samples: a_prev is the previous layer's output."""
        self.a_prev = a_prev
        self.m = m

    def params(self):
        """{name: device array} saved and loaded with the network."""
        return {}

    def forward(self):
        raise NotImplementedError

    def backward(self, opt, ones, first, delta_in_z=False):
        """On entry self.a holds dL/da (or self.z the delta, if delta_in_z); on exit
        a_prev holds dL/da_prev (unless first) and the parameters are updated."""
        raise NotImplementedError

    def free(self):
        pass

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.config().items())
        return f"{type(self).__name__}({args})"


class Dense(Layer):
    """Fully connected: z = w a_prev + b, a = f(z). Inputs of any per-sample shape are
    taken flattened, (prod(in_shape), batch), which is a free view."""
    trainable = True

    def __init__(self, units, activation="linear"):
        if int(units) != units or units < 1:
            raise InputError(f"Dense: units must be a positive integer, got {units!r}")
        if activation not in ACTIVATIONS:
            raise InputError(f"Dense: unknown activation {activation!r}; use one of "
                             f"{', '.join(ACTIVATIONS)}")
        self.units = int(units)
        self.activation = activation
        self._z = self._a = None

    def config(self):
        return {"units": self.units, "activation": self.activation}

    def output_shape(self, in_shape):
        return (self.units,)

    def build(self, backend, in_shape, rng):
        out = super().build(backend, in_shape, rng)
        self.n_in = int(np.prod(in_shape))
        # He for relu, Glorot otherwise; drawn on the host so every backend starts equal
        fan = self.n_in if self.activation == "relu" else (self.n_in + self.units) / 2
        limit = math.sqrt(3.0 / fan)
        w = rng.uniform(-limit, limit, (self.units, self.n_in))
        self.w = backend.upload(w.astype(backend.dtype), label=f"{self} w")
        self.b = backend.zeros((self.units,), label=f"{self} b")
        self.v = backend.zeros((self.units, self.n_in), label=f"{self} v")
        self.vb = backend.zeros((self.units,), label=f"{self} vb")
        return out

    def allocate(self, capacity):
        self.free()
        self._z = self.backend.empty((self.units * capacity,), label=f"{self} z")
        self._a = self.backend.empty((self.units * capacity,), label=f"{self} a")

    def bind(self, a_prev, m):
        super().bind(self.backend.view(a_prev, (self.n_in, m)), m)
        self.z = self.backend.view(self._z, (self.units, m))
        self.a = self.backend.view(self._a, (self.units, m))

    def params(self):
        return {"w": self.w, "b": self.b}

    def forward(self):
        bk = self.backend
        bk.gemm(1.0, self.w, self.a_prev, 0.0, self.z)          # z <- w a_prev
        bk.bias_activation(self.activation, self.z, self.b, self.a)  # z <- z + b 1^T; a <- f(z)

    def backward(self, opt, ones, first, delta_in_z=False):
        bk, eta_m = self.backend, opt.lr / self.m
        if not delta_in_z:
            bk.activation_grad(self.activation, self.z, self.a)  # (1) dz <- f'(z) . da
        # (2) v <- mu v - eta/m dz a_prev^T: before a_prev is overwritten (the river crossing)
        bk.gemm(-eta_m, self.z, self.a_prev, opt.momentum, self.v, trans_b=True)
        if opt.weight_decay:
            bk.axpy(-opt.lr * opt.weight_decay, self.w, self.v)  # ... - eta lambda w
        if not first:
            bk.gemm(1.0, self.w, self.z, 0.0, self.a_prev, trans_a=True)  # (3) da_prev <- w^T dz
        bk.gemv(-eta_m, self.z, ones, opt.momentum, self.vb)     # (4) vb <- mu vb - eta/m dz 1
        bk.axpy(1.0, self.v, self.w)                             # (5) w <- w + v
        bk.axpy(1.0, self.vb, self.b)                            #     b <- b + vb

    def free(self):
        for x in (self._z, self._a):
            if x is not None:
                self.backend.free(x)
        self._z = self._a = None


class Flatten(Layer):
    """(C, H, W) per sample -> (C.H.W,): with batch-innermost storage, a free view."""

    def output_shape(self, in_shape):
        return (int(np.prod(in_shape)),)

    def bind(self, a_prev, m):
        super().bind(a_prev, m)
        self.a = self.backend.view(a_prev, (self.out_shape[0], m))

    def forward(self):
        pass

    def backward(self, opt, ones, first, delta_in_z=False):
        pass                                                     # the gradient is the same view


LAYERS = {"Dense": Dense, "Flatten": Flatten}


def from_config(name, config):
    if name not in LAYERS:
        raise ShapeError(f"unknown layer type {name!r} in the model description")
    return LAYERS[name](**config)
