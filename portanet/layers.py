"""Layers, written once against the Backend interface.

Activations are (features, batch): a column per sample. A trainable layer owns w (out x in),
b (out,), the momentum buffers v (like w) and vb (like b), and views z, a of its batch buffers; its input
a_prev is a view of the previous layer's a. Backward overwrites activations with gradients,
so a training step allocates nothing.
"""
import math

import numpy as np

from .backends.base import ACTIVATIONS, conv_out
from .errors import InputError, ShapeError, check_count
from .memory import elements
from .rng import mix32


class Layer:
    trainable = False
    capturable = True           # its step launches the same work every time (see _train_step)

    def config(self):
        """The constructor arguments, for save files."""
        return {}

    def configure(self, backend, in_shape):
        """Shapes for inputs of per-sample shape `in_shape`; returns the output's. Nothing
        is allocated: the network plans memory from what the layer declares (parameters,
        state, batch_buffers, shared_sizes) and then allocates it."""
        self.backend = backend
        self.in_shape = tuple(in_shape)
        self.out_shape = self.output_shape(self.in_shape)
        return self.out_shape

    def output_shape(self, in_shape):
        return in_shape

    def parameters(self):
        """{name: shape} of the parameters, saved and loaded with the network."""
        return {}

    def state(self):
        """{name: shape} of the optimizer's state (SGD: the momentum buffers)."""
        return {}

    def initial(self, rng):
        """{name: host array} of initial parameter values (missing names start at zero)."""
        return {}

    def batch_buffers(self, m):
        """{attribute: (elements, dtype or None for the real type)}: the layer's own batch
        buffers for up to m samples."""
        return {}

    def shared_sizes(self, m):
        """(ones, workspace) elements this layer needs from the network's shared buffers
        for a batch of m: the ones vector of bias gradients, the im2col workspace."""
        return 0, 0

    def bind(self, a_prev, m, shared):
        """Views for a batch of m samples: a_prev is the previous layer's output; shared
        holds the network's ones vector and workspace."""
        self.a_prev = a_prev
        self.m = m
        self.shared = shared

    def params(self):
        """{name: device array} saved and loaded with the network."""
        return {name: getattr(self, name) for name in self.parameters()}

    def forward(self, training=True):
        raise NotImplementedError

    def backward(self, opt, first, delta_in_z=False):
        """On entry self.a holds dL/da (or self.z the delta, if delta_in_z); on exit
        a_prev holds dL/da_prev (unless first) and the parameters are updated."""
        raise NotImplementedError

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.config().items())
        return f"{type(self).__name__}({args})"


def _count(name, value, low, layer):
    """An integer argument of a layer; an activation given in its place gets a hint."""
    if isinstance(value, str) and value in ACTIVATIONS:
        raise InputError(f"{layer}: {name} must be a whole number, got {value!r}: an "
                         f"activation is passed as activation={value!r}")
    return check_count(f"{layer}: {name}", value, low)


class Dense(Layer):
    """Fully connected: z = w a_prev + b, a = f(z). Inputs of any per-sample shape are
    taken flattened, (prod(in_shape), batch), which is a free view."""
    trainable = True

    def __init__(self, units, activation="linear"):
        self.units = _count("units", units, 1, type(self).__name__)
        if activation not in ACTIVATIONS:
            raise InputError(f"{type(self).__name__}: unknown activation {activation!r}; use "
                             f"one of {', '.join(ACTIVATIONS)}")
        self.activation = activation

    def config(self):
        return {"units": self.units, "activation": self.activation}

    def output_shape(self, in_shape):
        return (self.units,)

    def configure(self, backend, in_shape):
        out = super().configure(backend, in_shape)
        self.n_in = self.fan_in(in_shape)
        self.n_out = elements(out)           # outputs per sample
        return out

    def parameters(self):
        return {"w": (self.units, self.n_in), "b": (self.units,)}

    def state(self):
        return {"v": (self.units, self.n_in), "vb": (self.units,)}

    def initial(self, rng):
        # He for relu, Glorot otherwise; drawn on the host so every backend starts equal
        fan = self.n_in if self.activation == "relu" else (self.n_in + self.units) / 2
        limit = math.sqrt(3.0 / fan)
        return {"w": rng.uniform(-limit, limit, (self.units, self.n_in))}

    def fan_in(self, in_shape):
        return elements(in_shape)

    def batch_buffers(self, m):
        return {"_z": (self.n_out * m, None), "_a": (self.n_out * m, None)}

    def shared_sizes(self, m):
        return m, 0

    def bind(self, a_prev, m, shared):
        super().bind(self.backend.view(a_prev, (self.n_in, m)), m, shared)
        self.z = self.backend.view(self._z, (self.units, m))
        self.a = self.backend.view(self._a, (self.units, m))
        self.ones = self.backend.view(shared.ones, (m,))
        self.inputs = self.a_prev           # what w multiplies: a_prev here, im2col's cols in Conv2D

    def forward(self, training=True):
        bk = self.backend
        bk.gemm(1.0, self.w, self.inputs, 0.0, self.z)          # z <- w a_prev
        bk.bias_activation(self.activation, self.z, self.b, self.a)  # z <- z + b 1^T; a <- f(z)

    def backward(self, opt, first, delta_in_z=False):
        bk, eta_m = self.backend, opt.lr / self.m
        if not delta_in_z:
            bk.activation_grad(self.activation, self.z, self.a)  # (1) dz <- f'(z) . da
        # (2) v <- mu v - eta/m dz a_prev^T: before a_prev is overwritten (the river crossing)
        bk.gemm(-eta_m, self.z, self.inputs, opt.momentum, self.v, trans_b=True)
        if opt.weight_decay:
            bk.axpy(-opt.lr * opt.weight_decay, self.w, self.v)  # ... - eta lambda w
        if not first:
            self.input_grad()                                    # (3) da_prev <- w^T dz
        bk.gemv(-eta_m, self.z, self.ones, opt.momentum, self.vb)  # (4) vb <- mu vb - eta/m dz 1
        bk.apply_update(self.w, self.v, self.b, self.vb)         # (5) w <- w + v, b <- b + vb

    def input_grad(self):
        self.backend.gemm(1.0, self.w, self.z, 0.0, self.a_prev, trans_a=True)


class Conv2D(Dense):
    """2-D convolution lowered to one GEMM over the whole batch: with images stored
    (C, H, W, N), w (filters x C.k.k) . cols (C.k.k x Ho.Wo.N) is the output, already in
    (filters, Ho, Wo, N) order. cols lives in the network's shared workspace; the update
    is Dense's with cols in place of a_prev."""

    def __init__(self, filters, kernel_size, stride=1, padding=0, activation="linear"):
        super().__init__(_count("filters", filters, 1, "Conv2D"), activation)
        self.k = _count("kernel_size", kernel_size, 1, "Conv2D")
        self.stride = _count("stride", stride, 1, "Conv2D")
        self.pad = _count("padding", padding, 0, "Conv2D")

    def config(self):
        return {"filters": self.units, "kernel_size": self.k, "stride": self.stride,
                "padding": self.pad, "activation": self.activation}

    def output_shape(self, in_shape):
        if len(in_shape) != 3:
            raise ShapeError(f"{self} takes images (C, H, W), got inputs of shape {in_shape}")
        c, h, w = in_shape
        ho, wo = conv_out(h, self.k, self.stride, self.pad), conv_out(w, self.k, self.stride, self.pad)
        if ho < 1 or wo < 1:
            raise ShapeError(f"{self}: a {self.k}x{self.k} kernel does not fit {h}x{w} images "
                             f"with padding {self.pad}")
        return (self.units, ho, wo)

    def fan_in(self, in_shape):
        return in_shape[0] * self.k * self.k

    def shared_sizes(self, m):
        positions = self.out_shape[1] * self.out_shape[2] * m
        return positions, self.n_in * positions

    def bind(self, a_prev, m, shared):
        Layer.bind(self, self.backend.view(a_prev, (*self.in_shape, m)), m, shared)
        positions = self.out_shape[1] * self.out_shape[2] * m
        self.z = self.backend.view(self._z, (self.units, positions))
        self.a = self.backend.view(self._a, (self.units, positions))
        self.ones = self.backend.view(shared.ones, (positions,))
        self.inputs = self.backend.view(shared.workspace, (self.n_in, positions))

    def forward(self, training=True):
        self.backend.im2col(self.inputs, self.a_prev, self.k, self.stride, self.pad)
        self.shared.workspace_holds = id(self)
        super().forward(training)

    def backward(self, opt, first, delta_in_z=False):
        if self.shared.workspace_holds != id(self):     # a later conv layer used it since
            self.backend.im2col(self.inputs, self.a_prev, self.k, self.stride, self.pad)
        super().backward(opt, first, delta_in_z)
        self.shared.workspace_holds = None

    def input_grad(self):
        bk = self.backend
        bk.gemm(1.0, self.w, self.z, 0.0, self.inputs, trans_a=True)   # dcols <- w^T dz
        bk.col2im(self.a_prev, self.inputs, self.k, self.stride, self.pad)  # da_prev <- col2im
        self.shared.workspace_holds = None


class MaxPool2D(Layer):
    """Max pooling over pool x pool windows; keeps the argmax indices for the backward."""
    def __init__(self, pool=2, stride=None):
        self.pool = _count("pool", pool, 1, "MaxPool2D")
        self.stride = _count("stride", pool if stride is None else stride, 1, "MaxPool2D")

    def config(self):
        return {"pool": self.pool, "stride": self.stride}

    def output_shape(self, in_shape):
        if len(in_shape) != 3 or min(in_shape[1:]) < self.pool:
            raise ShapeError(f"{self} takes images (C, H, W) of at least {self.pool}x{self.pool},"
                             f" got inputs of shape {in_shape}")
        c, h, w = in_shape
        return (c, conv_out(h, self.pool, self.stride, 0), conv_out(w, self.pool, self.stride, 0))

    def batch_buffers(self, m):
        n = elements(self.out_shape) * m
        return {"_a": (n, None), "_idx": (n, np.int32)}

    def bind(self, a_prev, m, shared):
        super().bind(self.backend.view(a_prev, (*self.in_shape, m)), m, shared)
        self.a = self.backend.view(self._a, (*self.out_shape, m))
        self.idx = self.backend.view(self._idx, (*self.out_shape, m))

    def forward(self, training=True):
        self.backend.maxpool(self.a, self.idx, self.a_prev, self.pool, self.stride)

    def backward(self, opt, first, delta_in_z=False):
        if not first:
            self.backend.maxpool_grad(self.a_prev, self.a, self.idx, self.pool, self.stride)



class Dropout(Layer):
    """Zeroes each input with probability `rate` while training and scales the rest by
    1 / (1 - rate); the identity in inference. The mask is not stored: a counter-based hash
    of (seed, step, element) recomputes it for the backward, the same on every backend."""
    capturable = False          # a new mask key every step

    def __init__(self, rate=0.5, seed=0):
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate < 1:
            raise InputError(f"Dropout: rate must be a number in [0, 1), got {rate!r}")
        self.rate, self.seed = float(rate), _count("seed", seed, 0, "Dropout")
        self.step = 0

    def config(self):
        return {"rate": self.rate, "seed": self.seed}

    def batch_buffers(self, m):
        return {"_a": (elements(self.in_shape) * m, None)}

    def bind(self, a_prev, m, shared):
        super().bind(a_prev, m, shared)
        self.a = self.backend.view(self._a, a_prev.shape)

    def forward(self, training=True):
        if training:
            self.step += 1
            self.key = mix32(self.seed * 0x9E3779B1 + mix32(self.step))
            self.backend.dropout(self.a, self.a_prev, self.key, self.rate)
        else:
            self.backend.copy(self.a_prev, self.a)

    def backward(self, opt, first, delta_in_z=False):
        if not first:
            self.backend.dropout(self.a_prev, self.a, self.key, self.rate)




class Flatten(Layer):
    """(C, H, W) per sample -> (C.H.W,): with batch-innermost storage, a free view."""

    def output_shape(self, in_shape):
        return (elements(in_shape),)

    def bind(self, a_prev, m, shared):
        super().bind(a_prev, m, shared)
        self.a = self.backend.view(a_prev, (self.out_shape[0], m))

    def forward(self, training=True):
        pass

    def backward(self, opt, first, delta_in_z=False):
        pass                                                     # the gradient is the same view


LAYERS = {"Dense": Dense, "Flatten": Flatten, "Conv2D": Conv2D, "MaxPool2D": MaxPool2D,
          "Dropout": Dropout}


def from_config(name, config):
    """The layer saved as (name, config), or an InputError saying what is wrong."""
    if name not in LAYERS:
        raise InputError(f"unknown layer type {name!r}; portanet has {', '.join(LAYERS)}")
    if not isinstance(config, dict) or not all(isinstance(k, str) for k in config):
        raise InputError(f"{name}: its configuration must be a mapping of argument names, "
                         f"got {config!r}")
    try:
        return LAYERS[name](**config)
    except TypeError as e:           # a missing or unknown argument
        raise InputError(f"{name}({', '.join(config)}): {e}") from e

