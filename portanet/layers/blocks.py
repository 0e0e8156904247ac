"""Layers that normalize or hold other layers: BatchNorm, LayerNorm and Residual blocks."""
import math

import numpy as np

from ..backends.base import ACTIVATIONS, conv_out
from ..errors import InputError, ShapeError
from ..memory import elements
from .base import MAX_NESTING, Layer, Tokens, _output_dtype, nesting_error, walk
from .dense import Conv2D, Dense, Flatten, from_output, grad_kind

class _Normalization(Layer):
    """What BatchNorm and LayerNorm share: inputs viewed (rows, n), a row per feature (of a
    vector or a sequence's token) or per channel (of an image), and a scale and a shift
    (gamma, beta) per row."""
    trainable = True

    def output_shape(self, in_shape):
        if len(in_shape) not in (1, 3) and not isinstance(in_shape, Tokens):
            raise ShapeError(f"{self} takes features (F,), sequences (F, T) or images "
                             f"(C, H, W), got inputs of shape {in_shape}")
        return in_shape

    @property
    def rows(self):
        return self.in_shape[0]

    def parameters(self):
        return {"gamma": (self.rows,), "beta": (self.rows,)}


class BatchNorm(_Normalization):
    """Batch normalization (Ioffe and Szegedy), then an activation: per feature after a
    Dense layer (over the batch, and a sequence's tokens), per channel (over the batch and
    the image) after a Conv2D. Training
    normalizes with the batch's mean and variance and keeps running averages of them
    (momentum as PyTorch's: new = (1 - momentum) old + momentum batch; the variance's
    unbiased); inference normalizes with the running ones. Both are saved with the network.
    Inputs viewed (rows, n): (features, batch) or (channels, H.W.batch), as stored. In
    16-bit storage its input and output are 16-bit; its delta, float32, goes into the
    products buffer grad_slot, where dL/dx then replaces it.

    It keeps its output alone, not z = gamma xhat + beta: the backward makes z again from
    its input and the batch's statistics where the activation's derivative needs it
    (batchnorm_delta), and writes the delta where dL/da arrived; but where a Residual
    block makes its sum over our output in real storage and we activate, the block reads
    that gradient again after our backward, and the delta has a buffer of its own
    (`delta_apart`)."""
    half_storage = True
    half_alike = True

    def __init__(self, activation="linear", momentum=0.1, eps=1e-5):
        if activation not in ACTIVATIONS or activation == "softmax":
            raise InputError(f"BatchNorm: activation must be one of "
                             f"{', '.join(a for a in ACTIVATIONS if a != 'softmax')}, "
                             f"got {activation!r}")
        self.activation = activation
        for name, value, low_open in (("momentum", momentum, False), ("eps", eps, True)):
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) \
                and math.isfinite(value) and (0 < value if low_open else 0 <= value) and value <= 1
            if not ok:
                raise InputError(f"BatchNorm: {name} must be a number in "
                                 f"{'(' if low_open else '['}0, 1], got {value!r}")
        self.momentum, self.eps = float(momentum), float(eps)

    def config(self):
        return {"activation": self.activation, "momentum": self.momentum, "eps": self.eps}

    def buffers(self):
        return {"running_mean": (self.rows,), "running_var": (self.rows,)}

    def initial(self, rng):
        return {"gamma": np.ones(self.rows), "running_var": np.ones(self.rows)}

    @property
    def delta_apart(self):
        """Whether the delta needs a buffer of its own (see the class)."""
        return self.output_summed and not self.half_out and self.activation != "linear"

    def batch_buffers(self, m):
        """The output a (z is not kept: see the class), the delta's own buffer where it
        needs one, the batch's mean and 1/std."""
        n, dtype = elements(self.in_shape) * m, _output_dtype(self)
        out = {"_a": (n, dtype), "_mean": (self.rows, None), "_inv_std": (self.rows, None)}
        if self.delta_apart:
            out["_z"] = (n, dtype)
        return out

    def grad_size(self, m):
        return elements(self.in_shape) * m if self.half_out else 0

    def bind(self, a_prev, m, shared):
        cols = elements(self.in_shape) // self.rows * m
        bk = self.backend
        super().bind(bk.view(a_prev, (self.rows, cols)), m, shared)
        self.a = bk.view(self._a, (self.rows, cols))
        # z: written by the forward, never read; the delta's buffer in real storage
        self.z = bk.view(self._z, (self.rows, cols)) if self.delta_apart else self.a
        self.mean, self.inv_std = self._mean, self._inv_std
        # where dL/da arrives (a), and where the delta goes (z), then dL/dx (over x); in 16
        # bits, where its input reads 16 bits too (half_grad), the products buffers
        # half_slot and grad_slot, the delta and dL/dx where dL/da_prev goes
        self.da, self.delta = self.half_views(shared, self.a, self.z)

    def forward(self, training=True):
        bk = self.backend
        if training:
            bk.batchnorm_train(self.activation, self.z, self.a, self.mean, self.inv_std,
                               self.a_prev, self.gamma, self.beta, self.running_mean,
                               self.running_var, self.eps, self.momentum)
        else:
            bk.batchnorm_infer(self.activation, self.z, self.a, self.a_prev, self.gamma,
                               self.beta, self.running_mean, self.running_var, self.eps)

    def backward(self, train, first, delta_in_z=False):
        bk = self.backend
        # the delta f'(z) dL/da, z made again from the input (batchnorm_delta), in dL/da's
        # place; in 16 bits into grad_slot, where that is dL/da's buffer linear's delta is
        # dL/da as it lies
        if self.half_out and (self.activation != "linear" or self.half_slot != self.grad_slot) \
                or not self.half_out and not delta_in_z and self.activation != "linear":
            bk.batchnorm_delta(self.activation, self.delta, self.da, self.a_prev, self.gamma,
                               self.beta, self.mean, self.inv_std)
        g, alpha, beta = train.gradient(self)
        # dgamma, dbeta and (in place of the input, or of the 16-bit layers' delta) dx in
        # one pass over the batch
        dx = self.delta if self.half_out else self.a_prev
        bk.batchnorm_grad(None if first else dx, g["gamma"], g["beta"], self.delta,
                          self.a_prev, self.gamma, self.mean, self.inv_std, alpha, beta)
        train.update(self)


class LayerNorm(_Normalization):
    """Layer normalization (Ba, Kiros and Hinton): each sample's features, each token's of
    a sequence, or each image position's channels, normalized over them, then scaled and
    shifted per feature or channel (gamma, beta). The same in training and inference: no
    running statistics. PyTorch's LayerNorm(F) over the last dimension of (N, F) or
    (N, T, F); over the channels of (N, C, H, W) images, the channels-first LayerNorm of
    ConvNeXt. Inputs viewed (rows, n) as BatchNorm's, normalized per column. Stored in the network's real type: in a 16-bit
    network the layers around it store theirs in real.

    It keeps its output and the columns' mean and 1/std; its backward reads its input,
    which its dL/dx then replaces."""

    def __init__(self, eps=1e-5):
        ok = isinstance(eps, (int, float)) and not isinstance(eps, bool) \
            and math.isfinite(eps) and 0 < eps <= 1
        if not ok:
            raise InputError(f"LayerNorm: eps must be a number in (0, 1], got {eps!r}")
        self.eps = float(eps)

    def config(self):
        return {"eps": self.eps}

    def initial(self, rng):
        return {"gamma": np.ones(self.rows)}

    def _columns(self, m):
        return elements(self.in_shape) // self.rows * m

    def batch_buffers(self, m):
        """The output a, and each column's mean and 1/std."""
        cols = self._columns(m)
        return {"_a": (self.rows * cols, None), "_mean": (cols, None),
                "_inv_std": (cols, None)}

    def bind(self, a_prev, m, shared):
        bk, cols = self.backend, self._columns(m)
        super().bind(bk.view(a_prev, (self.rows, cols)), m, shared)
        self.a = bk.view(self._a, (self.rows, cols))
        self.mean, self.inv_std = bk.view(self._mean, (cols,)), bk.view(self._inv_std, (cols,))

    def forward(self, training=True):
        self.backend.layernorm(self.a, self.mean, self.inv_std, self.a_prev, self.gamma,
                               self.beta, self.eps)

    def backward(self, train, first, delta_in_z=False):
        # dL/da arrives in a; dgamma, dbeta, and dL/dx over the input, in one call
        g, alpha, beta = train.gradient(self)
        self.backend.layernorm_grad(None if first else self.a_prev, g["gamma"], g["beta"],
                                    self.a, self.a_prev, self.gamma, self.mean, self.inv_std,
                                    alpha, beta)
        train.update(self)


class Residual(Layer):
    """x -> f(inner(x) + shortcut(x)): the inner layers' output plus the block's input,
    then an activation. The shortcut is the input itself where the shapes agree, else a
    1x1 convolution with the stride that makes them agree (Dense for vectors), trained
    with the block. The sum is made in place of the last inner layer's output, which then
    holds the sum's gradient for the inner layers' backward.

    In 16-bit storage (a block of Dense, Conv2D and BatchNorm layers between 16-bit layers)
    every output in it is 16-bit, and the gradients float32 in the network's two products
    buffers: the sum's gradient arrives in the block's half_slot and stays there while the
    inner layers' gradients run in the other buffer (the last inner layer's grad_slot),
    which then takes the shortcut's part of dL/dx."""
    half_alike = True
    grad_in_place = False           # (in 16 bits; for a real block it is not asked)

    def __init__(self, layers, activation="linear"):
        self.layers = list(layers) if isinstance(layers, (list, tuple)) else None
        if not self.layers or not all(isinstance(l, Layer) for l in self.layers):
            raise InputError(f"Residual needs a non-empty list of layers, got {layers!r}")
        if all(isinstance(l, Flatten) for l in self.layers):
            raise InputError("Residual: its layers must compute something (not only Flatten)")
        if activation not in ACTIVATIONS or activation == "softmax":
            raise InputError(f"Residual: activation must be one of "
                             f"{', '.join(a for a in ACTIVATIONS if a != 'softmax')}, "
                             f"got {activation!r}")
        self.activation = activation
        self.projection = None
        self.nesting = 1 + max(l.nesting for l in self.layers)
        if self.nesting > MAX_NESTING:
            raise nesting_error(self.nesting, "Residual blocks")

    def config(self):
        return {"layers": [[type(l).__name__, l.config()] for l in self.layers],
                "activation": self.activation}

    @property
    def trainable(self):
        return True if self.projection else any(l.trainable for l in self.layers)

    @property
    def capturable(self):
        return all(l.capturable for l in self.layers)

    @property
    def half_storage(self):
        """Whether the block can be stored in 16 bits: its layers are Dense, Conv2D and
        BatchNorm (each reads a 16-bit input and stores 16 bits, its gradient in place)."""
        return all(l.half_storage and l.grad_in_place and not l.passes_storage
                   for l in self.layers)

    def plan_half(self):
        """Stored in 16 bits (half_out), so is every output inside the block, and their
        gradients go through the products buffers around the block's half_slot and
        grad_slot; else everything inside is real."""
        for _, layer in walk([sub for _, sub in self.sublayers()]):
            layer.half_in = layer.half_out = layer.half_grad = self.half_out
        if not self.half_out:
            return
        self.layers[0].half_grad = self.half_grad
        if self.projection:                 # its dL/dx is added where the block's goes
            self.projection.half_grad = self.half_grad
            self.projection.grad_slot = self.grad_slot
            self.projection.half_slot = self.half_slot
        # the sum's gradient stays in half_slot, where the last layer reads it
        for layer in self.layers:
            layer.half_slot = layer.grad_slot = self.grad_slot
        self.layers[-1].half_slot = self.half_slot

    def configure(self, backend, in_shape):
        self.backend = backend
        self.in_shape = in_shape if isinstance(in_shape, Tokens) else tuple(in_shape)
        shape = self.in_shape
        for layer in self.layers:
            shape = layer.configure(backend, shape)
        self.layers[-1].output_summed = True
        self.out_shape = shape
        self.projection = None
        if shape != self.in_shape:
            self.projection = self._projection(shape)
            self.projection.configure(backend, self.in_shape)
        return shape

    def _projection(self, out):
        inp = self.in_shape
        if len(inp) == len(out) == 1 or isinstance(inp, Tokens) and isinstance(out, Tokens) \
                and inp[1] == out[1]:
            return Dense(out[0])            # (a sequence's: a token at a time)
        if len(inp) == len(out) == 3:
            stride = _stride_to(inp[1:], out[1:])
            if stride is not None:
                return Conv2D(out[0], 1, stride=stride)
        raise ShapeError(f"{self}: its layers turn {inp} into {out}, which no 1x1 "
                         f"convolution (or Dense) of the input can match; keep the shapes "
                         f"or change them by a stride")

    def sublayers(self):
        return [(str(i), l) for i, l in enumerate(self.layers)] + \
            ([("proj", self.projection)] if self.projection else [])

    def backward_order(self):
        """The projection first in real storage, last in 16 bits (see backward); the
        layers from the last."""
        inner = [l for layer in reversed(self.layers) for l in layer.backward_order()]
        proj = [self.projection] if self.projection else []
        return [self] + (inner + proj if self.half_out else proj + inner)

    @property
    def one_buffer(self):
        """Whether the block's output a is written over its sum z (in the last inner
        layer's output), as Dense's `one_buffer` says: linear, or `from_output`."""
        return self.activation == "linear" or from_output(self)

    def batch_buffers(self, m):
        """The output a (but `one_buffer`), and in real storage the projection's dL/dx
        (`_dx`): there the inner layers write theirs over x, which its weight gradient
        reads, so it goes first and apart. In 16 bits x stays whole, and the projection's
        backward comes last, adding its dL/dx to theirs."""
        out = {} if self.one_buffer else {"_a": (elements(self.out_shape) * m,
                                                 _output_dtype(self))}
        if self.projection and not self.half_out:
            out["_dx"] = (elements(self.in_shape) * m, None)
        return out

    def shared_sizes(self, m):
        sizes = [l.shared_sizes(m) for _, l in self.sublayers()]
        return max(n for n, _ in sizes), max(w for _, w in sizes)

    def bind(self, a_prev, m, shared):
        bk = self.backend
        super().bind(bk.view(a_prev, (*self.in_shape, m)), m, shared)
        a = self.a_prev
        for layer in self.layers:
            layer.bind(a, m, shared)
            a = layer.a
        self.z = bk.view(a, (*self.out_shape, m))            # the sum, in place
        self.a = self.z if self.one_buffer else bk.view(self._a, (*self.out_shape, m))
        # where dL/da arrives, and the sum's gradient stays (real: in place in z), and where
        # dL/dx goes (real: in place of x)
        self.da, self.da_prev = self.half_views(shared, self.a, self.a_prev)
        self.dsum = self.da if self.half_out else self.z
        if self.projection:
            self.projection.bind(self.a_prev, m, shared)
            self.projection.da_prev = bk.view(self.da_prev if self.half_out else self._dx,
                                              self.projection.a_prev.shape)
            self.shortcut = bk.view(self.projection.a, self.z.shape)
        else:
            self.shortcut = self.a_prev

    def forward(self, training=True):
        for layer in self.layers:
            layer.forward(training)
        if self.projection:
            self.projection.forward(training)
        self.backend.add_activation(self.activation, self.z, self.shortcut, self.a)

    def backward(self, train, first, delta_in_z=False):
        bk = self.backend
        if self.half_out:               # dL/d(sum) in place of dL/da
            if self.activation != "linear":
                bk.activation_grad(grad_kind(self), self.z, self.da, self.dsum)
        elif not delta_in_z:
            bk.activation_grad(self.activation, self.z, self.a)  # dL/d(sum), in z
        # the projection's delta is the sum's gradient (linear: f' is 1); in real storage
        # its backward goes first, while x is whole, its dL/dx into _dx (batch_buffers)
        proj = self.projection
        if proj and not self.half_out:
            bk.copy(self.z, proj.z)
            proj.backward(train, first, delta_in_z=True)
        for i in reversed(range(len(self.layers))):
            inner_first = first and not any(l.trainable for l in self.layers[:i])
            self.layers[i].backward(train, inner_first)
        # plus the shortcut's part of dL/dx: in 16 bits the projection adds its own (its
        # delta stored from dL/d(sum), which stayed in half_slot); else _dx, or dL/d(sum)
        if proj and self.half_out:
            proj.backward(train, first, add=True)
        elif not first:
            bk.axpy(1.0, bk.view(self._dx if proj else self.dsum, self.a_prev.shape),
                    self.da_prev)


def _stride_to(sizes, outs):
    """The smallest stride s with which a 1x1 window over each of sizes gives the matching
    one of outs (conv_out(n, 1, s, 0) == o), or None: the strides that do are, for each
    size, an interval, (n-1) // o < s <= (n-1) // (o-1), and their intersection's least
    is the answer, found without trying strides one by one (an image 10**12 wide)."""
    low, high = 1, None
    for n, o in zip(sizes, outs):
        if not 1 <= o <= n:
            return None
        low = max(low, (n - 1) // o + 1)
        if o > 1:
            high = (n - 1) // (o - 1) if high is None else min(high, (n - 1) // (o - 1))
    if high is not None and low > high:
        return None
    assert all(conv_out(n, 1, low, 0) == o for n, o in zip(sizes, outs))
    return low
