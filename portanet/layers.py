"""Layers, written once against the Backend interface.

Activations are (features, batch): a column per sample. A trainable layer's parameters
(Dense: w (out x in), b (out,)) are views of one flat vector the network allocates (`flat`),
and the optimizer's state (`state`) is laid out alike; it has views z, a of its batch
buffers, and its input a_prev is a view of the previous layer's a. Backward overwrites
activations with gradients and writes the gradient products where the optimizer says, so
a training step allocates nothing.
"""
import functools
import math
import reprlib

import numpy as np

from . import distributed
from .backends.base import ACTIVATIONS, CONV_WORKSPACE_BYTES, conv_out
from .errors import InputError, ShapeError, check_count
from .memory import elements
from .rng import key_array, mix32

# How deep Residual blocks may nest, one inside another (a ResNet's are 1 deep): far above
# any real network, and low enough that everything that walks a network recursively (its
# description, its saved architecture, configure, walk) stays within Python's recursion and
# its file's JSON within files.MAX_JSON_DEPTH (3 levels a block).
MAX_NESTING = 16

# backward's delta_in_z where the loss kernel left the last layer's delta in its z and also
# formed its bias gradient (SoftmaxCrossEntropy.forward in losses.py); true, so other layers take it as True
DELTA_AND_BIAS = "delta and bias"


class Layer:
    trainable = False
    capturable = True           # its step launches the same work every time (see train_step)
    keeps_input = False         # its products read a_prev, kept (keep_operands) until read
    output_kept = False         # the next layer keeps our output so (set by its network)
    half_storage = False        # its z and a may be 16-bit, and it reads a 16-bit a_prev
    #                             (Dense, Conv2D, BatchNorm, Residual blocks of these:
    #                             docs/storage16.md)
    half_alike = False          # and it stores its output as it reads its input (BatchNorm,
    #                             Residual): 16 bits only where both are
    half_out = False            # its z and a are 16-bit (set by its network: bf16 or fp16,
    #                             and the next layer reads them so)
    half_in = False             # its a_prev is 16-bit (the previous layer's, or the batch)
    half_grad = False           # and the previous layer's: dL/da_prev goes to one of the
    #                             network's float32 products buffers, where that layer reads it
    half_slot = 0               # which of the two holds our sums and dL/da (half_out),
    grad_slot = 0               # and which our dL/da_prev (half_grad; set by the network)
    grad_in_place = True        # we read dL/da before we write dL/da_prev, so the two may
    #                             share a buffer (a pool reads one while it writes the other)
    passes_storage = False      # our output is stored as our input is (Flatten, the pools,
    #                             Dropout): a 16-bit input gives a 16-bit output
    is_view = False             # our output is a view of our input (Flatten)
    nesting = 0                 # Residual blocks this layer is, or holds, one inside another
    decayed = ()                # parameters that weight decay applies to (listed first)

    def config(self):
        """The constructor arguments, for save files."""
        return {}

    def configure(self, backend, in_shape):
        """Shapes for inputs of per-sample shape `in_shape`; returns the output's. Nothing
        is allocated: the network plans memory from what the layer declares (parameters,
        buffers, batch_buffers, shared_sizes) and then allocates it."""
        self.backend = backend
        self.in_shape = tuple(in_shape)
        self.out_shape = self.output_shape(self.in_shape)
        return self.out_shape

    def output_shape(self, in_shape):
        return in_shape

    def parameters(self):
        """{name: shape} of the trained parameters, the `decayed` ones first. The network
        keeps them in one flat vector per layer (`flat`), each name a view of it, so that
        an optimizer updates a layer in one launch."""
        return {}

    def buffers(self):
        """{name: shape} of state that is saved with the network but not trained
        (BatchNorm's running statistics)."""
        return {}

    def initial(self, rng):
        """{name: host array} of initial parameter and buffer values (missing names start
        at zero)."""
        return {}

    def batch_buffers(self, m):
        """{attribute: (elements, dtype or None for the real type)}: the layer's own batch
        buffers for up to m samples."""
        return {}

    def shared_sizes(self, m):
        """(ones, workspace) elements this layer needs from the network's shared buffers
        for a batch of m: the ones vector of bias gradients, the conv workspace."""
        return 0, 0

    def product_size(self, m):
        """Elements of the network's float32 products buffer half_slot this layer uses
        (half_out: its sums, dL/da): its output's, which a layer that stores its output
        in 16 bits takes there."""
        return elements(self.out_shape) * m if self.half_out and not self.is_view else 0

    def grad_size(self, m):
        """Elements of the network's float32 products buffer grad_slot this layer writes
        before dL/da_prev (BatchNorm's delta): the layer before sizes that buffer for
        dL/da_prev, but inside a Residual block the buffer may be the one the block's input
        gradient takes, of the block's input's size."""
        return 0

    def half_views(self, shared, da, da_prev):
        """(da, da_prev): where dL/da arrives and dL/da_prev goes, given as the arrays they
        take in real storage (a and a_prev, as the layer views them); where the layer
        stores 16 bits, views of the same shapes in the network's products buffers
        instead (half_out: buffer half_slot; half_grad: buffer grad_slot)."""
        products = shared.products
        if self.half_out:
            da = self.backend.view(products[self.half_slot], da.shape)
        if self.half_grad:
            da_prev = self.backend.view(products[self.grad_slot], da_prev.shape)
        return da, da_prev

    def products(self, m):
        """[(elements of a, of b, of c)] of the matrix products c = op(a) op(b) a vendor
        GEMM may make for this layer in a training step of m samples (at most): what a
        backend that copies their inputs (16-bit, or a transposed) needs room for
        (Backend.operand_bytes)."""
        return []

    def kept_operands(self, m):
        """Elements of each array the layer keeps (Backend.keep_operands) in a training
        step of m samples."""
        return []

    def sublayers(self):
        """[(name, layer)] of the layers inside this one (Residual's), in order."""
        return []

    def plan_half(self):
        """Where the layers inside this one store (half_in, half_out, half_grad) and which
        products buffers they use, once the network has set this one's."""

    def begin_step(self):
        """Host work before each training step, outside what a recorded step replays
        (Dropout writes its new key to the device)."""

    def bind(self, a_prev, m, shared):
        """Views for a batch of m samples: a_prev is the previous layer's output; shared
        holds the network's ones vector and workspace."""
        self.a_prev = a_prev
        self.m = m
        self.shared = shared

    def params(self):
        """{name: device array} of the parameters and buffers saved with the network."""
        return {name: getattr(self, name) for name in (*self.parameters(), *self.buffers())}

    def weights(self):
        """{name: view} of the parameters and saved buffers (BatchNorm's running statistics),
        lent to other libraries without a copy through DLPack: NumPy arrays on cpu, DLPack
        views on cuda (torch.from_dlpack(layer.weights()["w"]) is the layer's memory: a
        write there is the layer's). OpenCL cannot lend them: a DeviceError says so."""
        names = (*self.parameters(), *self.buffers()) if hasattr(self, "backend") else None
        arrays = {name: getattr(self, name, None) for name in names or ()}
        # the parameters are views of `flat`, which free() lets go of
        if names is None or any(x is None for x in arrays.values()) or (
                self.parameters() and getattr(self, "flat", None) is None):
            raise InputError(f"{self} holds no parameters now: weights() lends those of a "
                             f"layer in a Sequential, which has not been freed")
        return {name: self.backend.dlpack_view(x) for name, x in arrays.items()}

    @functools.cached_property
    def n_decay(self):
        """Elements of the flat parameter vector that weight decay applies to."""
        shapes = self.parameters()
        return sum(elements(shapes[name]) for name in self.decayed)

    def forward(self, training=True):
        raise NotImplementedError

    def backward(self, train, first, delta_in_z=False):
        """On entry self.a holds dL/da (or self.z the delta, if delta_in_z: True, or
        DELTA_AND_BIAS where the loss kernel formed the bias gradient as well); on exit
        a_prev holds dL/da_prev (unless first) and the parameters are updated: the layer
        writes its gradient products where train.gradient(self) says, and train.update(self)
        applies the optimizer (training.Step)."""
        raise NotImplementedError

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.config().items())
        return f"{type(self).__name__}({args})"


def _output_dtype(layer):
    """The dtype of a layer's output buffer: its backend's 16-bit storage where the network
    stores it so (half_out), else None (the real type)."""
    return layer.backend.storage_dtype if layer.half_out else None


def parameter_views(layer, flat):
    """{name: view} of a flat vector laid out as the layer's parameters (in the order of
    parameters(): the decayed ones first): the parameters themselves, or the optimizer's
    state and gradient alike."""
    views, offset = {}, 0
    for name, shape in layer.parameters().items():
        views[name] = layer.backend.view(flat, shape, offset)
        offset += elements(shape)
    return views


def walk(layers, prefix=""):
    """(name, layer) of every layer, those inside others included, parents first: the
    names of their parameters in save files ("0.w", "3.1.gamma", "3.proj.w")."""
    for i, layer in enumerate(layers):
        yield from walk_one(f"{prefix}{i}", layer)


def walk_one(name, layer):
    yield name, layer
    for sub, inner in layer.sublayers():
        yield from walk_one(f"{name}.{sub}", inner)


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
    keeps_input = True
    half_storage = True
    decayed = ("w",)

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

    def initial(self, rng):
        # He for relu, Glorot otherwise; drawn on the host so every backend starts equal
        fan = self.n_in if self.activation == "relu" else (self.n_in + self.units) / 2
        limit = math.sqrt(3.0 / fan)
        return {"w": rng.uniform(-limit, limit, (self.units, self.n_in))}

    def fan_in(self, in_shape):
        return elements(in_shape)

    def batch_buffers(self, m):
        dtype = _output_dtype(self)
        return {"_z": (self.n_out * m, dtype), "_a": (self.n_out * m, dtype)}

    def shared_sizes(self, m):
        return m, 0

    def products(self, m):
        w, x, dz = self.units * self.n_in, self.n_in * m, self.units * m
        return [(w, x, dz), (dz, x, w), (w, dz, x)]     # z = w x, dw = dz x^T, dx = w^T dz

    def bind(self, a_prev, m, shared):
        super().bind(self.backend.view(a_prev, (self.n_in, m)), m, shared)
        self.z = self.backend.view(self._z, (self.units, m))
        self.a = self.backend.view(self._a, (self.units, m))
        self.ones = self.backend.view(shared.ones, (m,))
        # where dL/da arrives, dL/da_prev goes (Residual's projection: apart), and the
        # product's sum goes (beside 16-bit z and a: float32, where dL/da will arrive)
        self.da, self.da_prev = self.half_views(shared, self.a, self.a_prev)
        self.zf = self.da if self.half_out else self.z

    def forward(self, training=True):
        # z <- w a_prev + b 1^T; a <- f(z). a_prev is not written until the weight gradient
        # has read it (the river crossing): a 16-bit copy of it serves both products. An
        # output the next layer keeps so is kept before it is written, so that the kernel
        # that writes it writes that copy too
        if training:
            self.backend.keep_operands(self.a_prev, *((self.a,) if self.output_kept else ()))
        if self.half_out:                   # the sum in float32, z and a stored in 16 bits
            self.backend.gemm(1.0, self.w, self.a_prev, 0.0, self.zf)
            self.backend.bias_activation(self.activation, self.zf, self.b, self.a,
                                         stored=self.z)
            return
        self.backend.dense(self.activation, self.w, self.a_prev, self.b, self.z, self.a)

    def forward_product(self, training=True):
        """z <- w a_prev only: the loss kernel adds the bias and activates (see
        losses.SoftmaxCrossEntropy.forward)."""
        if training:
            self.backend.keep_operands(self.a_prev)
        self.backend.gemm(1.0, self.w, self.a_prev, 0.0, self.z)

    def kept_operands(self, m):
        """Elements of the arrays this layer keeps for a training step of m samples
        (Backend.keep_operands): a_prev and the delta, where they are not 16-bit already."""
        return [n for n, half in ((self.n_in * m, self.half_in), (self.units * m, self.half_out))
                if not half]

    def backward(self, train, first, delta_in_z=False):
        bk = self.backend
        g, alpha, beta = train.gradient(self)
        bk.keep_operands(self.z)    # the delta, which the products below read: kept before
        self.delta_and_bias_grad(g, alpha, beta, delta_in_z)   # (1) dz; gb <- alpha dz 1 + beta gb
        # (2) gw <- alpha dz a_prev^T + beta gw: before a_prev is overwritten (the river
        # crossing); for SGD, gw is the velocity, alpha = -eta/m and beta = mu
        bk.gemm(alpha, self.z, self.a_prev, beta, g["w"], trans_b=True)
        bk.drop_operands(self.a_prev)
        if not first:
            self.input_grad()                                    # (3) da_prev <- w^T dz
        bk.drop_operands(self.z)
        train.update(self)                                       # (4) the optimizer's kernel

    def delta_and_bias_grad(self, g, alpha, beta, delta_in_z):
        """dz <- f'(z) . da in z (unless the loss left the delta there), and the bias
        gradient gb <- alpha dz 1 + beta gb, in one pass over z where the backend can."""
        if delta_in_z == DELTA_AND_BIAS:
            return
        if delta_in_z:
            self.backend.gemv(alpha, self.z, self.ones, beta, g["b"])
        else:
            self.backend.activation_bias_grad(self.activation, self.z, self.da, alpha, beta,
                                              g["b"], self.ones)

    def input_grad(self):
        self.backend.gemm(1.0, self.w, self.z, 0.0, self.da_prev, trans_a=True)


class Conv2D(Dense):
    """2-D convolution over the whole batch: with images stored (C, H, W, N), the output
    w (filters x C.k.k) * x is already in (filters, Ho, Wo, N) order. The backend's conv,
    conv_weight_grad and conv_input_grad compute it (gathering patches inside their GEMM,
    or through patch matrices in the network's workspace, whose size is capped); the
    update is Dense's, its bias gradient summed over the output positions as the delta is
    formed (activation_bias_grad)."""
    keeps_input = False         # its products read patch matrices, or gather from a_prev

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
        """Output positions (the bias gradient's ones), and the patch-matrix workspace:
        the whole matrix, n_in x positions, or CONV_WORKSPACE_BYTES of it."""
        positions = self.out_shape[1] * self.out_shape[2] * m
        cap = CONV_WORKSPACE_BYTES // self.backend.dtype.itemsize
        return positions, min(self.n_in * positions, cap)

    def kept_operands(self, m):
        return []                       # its products copy patch matrices, chunk by chunk

    def products(self, m):
        """The patch-matrix path's: a chunk of the patch matrix (as many positions as the
        workspace holds) with w, or with dz, whose copy is whole whatever the chunk (the
        chunk's columns are a view of it)."""
        positions, workspace = self.shared_sizes(m)
        chunk = min(positions, max(1, workspace // self.n_in))
        w, cols, dz = self.units * self.n_in, self.n_in * chunk, self.units * positions
        return [(w, cols, self.units * chunk), (dz, cols, w), (w, dz, cols)]

    def bind(self, a_prev, m, shared):
        Layer.bind(self, self.backend.view(a_prev, (*self.in_shape, m)), m, shared)
        positions = self.out_shape[1] * self.out_shape[2] * m
        self.z = self.backend.view(self._z, (self.units, positions))
        self.a = self.backend.view(self._a, (self.units, positions))
        self.ones = self.backend.view(shared.ones, (positions,))
        self.da, self.da_prev = self.half_views(shared, self.a, self.a_prev)
        self.zf = self.da if self.half_out else self.z

    def forward(self, training=True):
        # (16-bit z and a: the sums in float32 where dL/da will arrive, z + b stored in z)
        left = self.backend.conv(self.activation, self.w, self.a_prev, self.b, self.zf,
                                 self.a, self.k, self.stride, self.pad, self.shared.workspace,
                                 stored=self.z if self.half_out else None)
        self.shared.workspace_holds = id(self) if left else None

    def backward(self, train, first, delta_in_z=False):
        bk = self.backend
        g, alpha, beta = train.gradient(self)
        self.delta_and_bias_grad(g, alpha, beta, delta_in_z)   # (1) dz; gb <- alpha dz 1 + beta gb
        # (2) gw <- alpha dz patches(a_prev)^T + beta gw, before a_prev is overwritten; the
        # patches our forward left in the workspace serve, if no later layer took it since
        bk.conv_weight_grad(alpha, self.z, self.a_prev, beta, g["w"], self.k, self.stride,
                            self.pad, self.shared.workspace,
                            patches=self.shared.workspace_holds == id(self))
        self.shared.workspace_holds = None
        if not first:
            self.input_grad()                                    # (3) da_prev <- w^T * dz
        train.update(self)                                       # (4) the optimizer's kernel

    def input_grad(self):
        self.backend.conv_input_grad(self.da_prev, self.w, self.z, self.k, self.stride,
                                     self.pad, self.shared.workspace)


class _Pool2D(Layer):
    """What the pooling layers share: pool x pool windows moved by stride, no padding. In
    16-bit storage their output is stored as their input is; the gradient, float32, goes
    from one of the network's products buffers into the other (grad_in_place False)."""
    passes_storage = True
    grad_in_place = False

    def __init__(self, pool=2, stride=None):
        name = type(self).__name__
        self.pool = _count("pool", pool, 1, name)
        self.stride = _count("stride", pool if stride is None else stride, 1, name)

    def config(self):
        return {"pool": self.pool, "stride": self.stride}

    def output_shape(self, in_shape):
        if len(in_shape) != 3 or min(in_shape[1:]) < self.pool:
            raise ShapeError(f"{self} takes images (C, H, W) of at least {self.pool}x{self.pool},"
                             f" got inputs of shape {in_shape}")
        c, h, w = in_shape
        return (c, conv_out(h, self.pool, self.stride, 0), conv_out(w, self.pool, self.stride, 0))


class MaxPool2D(_Pool2D):
    """Max pooling over pool x pool windows; keeps the argmax indices for the backward."""

    def batch_buffers(self, m):
        n = elements(self.out_shape) * m
        return {"_a": (n, _output_dtype(self)), "_idx": (n, np.int32)}

    def bind(self, a_prev, m, shared):
        super().bind(self.backend.view(a_prev, (*self.in_shape, m)), m, shared)
        self.a = self.backend.view(self._a, (*self.out_shape, m))
        self.idx = self.backend.view(self._idx, (*self.out_shape, m))
        self.da, self.da_prev = self.half_views(shared, self.a, self.a_prev)

    def forward(self, training=True):
        self.backend.maxpool(self.a, self.idx, self.a_prev, self.pool, self.stride)

    def backward(self, train, first, delta_in_z=False):
        if not first:
            self.backend.maxpool_grad(self.da_prev, self.da, self.idx, self.pool, self.stride)



class Dropout(Layer):
    """Zeroes each input with probability `rate` while training and scales the rest by
    1 / (1 - rate); the identity in inference. The mask is not stored: a counter-based hash
    of (seed, step, element) recomputes it for the backward, the same on every backend.
    Each step's key is written to the device before the step (begin_step), where the
    kernels read it: a recorded step stays valid. In 16-bit storage its output is stored as
    its input is; the gradient, float32, is masked in place."""
    passes_storage = True

    def __init__(self, rate=0.5, seed=0):
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate < 1:
            raise InputError(f"Dropout: rate must be a number in [0, 1), got {rate!r}")
        self.rate, self.seed = float(rate), _count("seed", seed, 0, "Dropout")
        self.step = 0

    def config(self):
        return {"rate": self.rate, "seed": self.seed}

    def batch_buffers(self, m):
        return {"_a": (elements(self.in_shape) * m, _output_dtype(self)), "_key": (1, np.int32)}

    def bind(self, a_prev, m, shared):
        super().bind(a_prev, m, shared)
        self.a = self.backend.view(self._a, a_prev.shape)
        self.da, self.da_prev = self.half_views(shared, self.a, self.a_prev)

    def begin_step(self):
        self.step += 1
        # in a distributed job each rank its own masks (rank 0's are one process's): with
        # one key, every rank would drop the same units of its j-th sample
        group = distributed.current()
        rank = group.rank if group else 0
        self.key = mix32(self.seed * 0x9E3779B1 + mix32(self.step) + rank * 0x85EBCA6B)
        self.backend.write(self._key, key_array(self.key))

    def forward(self, training=True):
        if training:
            self.backend.dropout(self.a, self.a_prev, self._key, self.rate)
        else:
            self.backend.copy(self.a_prev, self.a)

    def backward(self, train, first, delta_in_z=False):
        if not first:
            self.backend.dropout(self.da_prev, self.da, self._key, self.rate)




class AvgPool2D(_Pool2D):
    """Average pooling over pool x pool windows (no padding)."""

    def windows(self):
        """(pool, stride) as the backend takes them: (rows, columns) each."""
        return (self.pool, self.pool), (self.stride, self.stride)

    def batch_buffers(self, m):
        return {"_a": (elements(self.out_shape) * m, _output_dtype(self))}

    def bind(self, a_prev, m, shared):
        super().bind(self.backend.view(a_prev, (*self.in_shape, m)), m, shared)
        self._pooled = self.backend.view(self._a, (*self.pooled_shape(), m))
        self.a = self.backend.view(self._a, (*self.out_shape, m)) \
            if len(self.out_shape) == 3 else self.backend.view(self._a, (self.out_shape[0], m))
        self.da, self.da_prev = self.half_views(shared, self._pooled, self.a_prev)

    def pooled_shape(self):
        return self.out_shape

    def forward(self, training=True):
        self.backend.avgpool(self._pooled, self.a_prev, *self.windows())

    def backward(self, train, first, delta_in_z=False):
        if not first:
            self.backend.avgpool_grad(self.da_prev, self.da, *self.windows())


class GlobalAvgPool2D(AvgPool2D):
    """The mean of each channel over the whole image: (C, H, W) -> (C,)."""

    def __init__(self):
        pass

    def config(self):
        return {}

    def output_shape(self, in_shape):
        if len(in_shape) != 3:
            raise ShapeError(f"{self} takes images (C, H, W), got inputs of shape {in_shape}")
        return (in_shape[0],)

    def windows(self):
        _, h, w = self.in_shape
        return (h, w), (h, w)

    def pooled_shape(self):
        return (self.in_shape[0], 1, 1)


class BatchNorm(Layer):
    """Batch normalization (Ioffe and Szegedy), then an activation: per feature after a
    Dense layer, per channel (over the batch and the image) after a Conv2D. Training
    normalizes with the batch's mean and variance and keeps running averages of them
    (momentum as PyTorch's: new = (1 - momentum) old + momentum batch; the variance's
    unbiased); inference normalizes with the running ones. Both are saved with the network.
    Inputs viewed (rows, n): (features, batch) or (channels, H.W.batch), as stored. In
    16-bit storage its input, z and a are 16-bit; its delta, float32, goes into the products
    buffer grad_slot, where dL/dx then replaces it."""
    trainable = True
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

    def output_shape(self, in_shape):
        if len(in_shape) not in (1, 3):
            raise ShapeError(f"{self} takes features (F,) or images (C, H, W), got inputs of "
                             f"shape {in_shape}")
        return in_shape

    @property
    def rows(self):
        return self.in_shape[0]

    def parameters(self):
        return {"gamma": (self.rows,), "beta": (self.rows,)}

    def buffers(self):
        return {"running_mean": (self.rows,), "running_var": (self.rows,)}

    def initial(self, rng):
        return {"gamma": np.ones(self.rows), "running_var": np.ones(self.rows)}

    def batch_buffers(self, m):
        n, dtype = elements(self.in_shape) * m, _output_dtype(self)
        return {"_z": (n, dtype), "_a": (n, dtype), "_mean": (self.rows, None),
                "_inv_std": (self.rows, None)}

    def grad_size(self, m):
        return elements(self.in_shape) * m if self.half_out else 0

    def bind(self, a_prev, m, shared):
        cols = elements(self.in_shape) // self.rows * m
        bk = self.backend
        super().bind(bk.view(a_prev, (self.rows, cols)), m, shared)
        self.z = bk.view(self._z, (self.rows, cols))
        self.a = bk.view(self._a, (self.rows, cols))
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
        # in 16 bits the delta goes out of z's place, into grad_slot: where that is dL/da's
        # buffer, linear's delta is dL/da as it lies
        if self.half_out:
            if self.activation != "linear" or self.half_slot != self.grad_slot:
                bk.activation_grad(self.activation, self.z, self.da, self.delta)
        elif not delta_in_z:
            bk.activation_grad(self.activation, self.z, self.a)
        g, alpha, beta = train.gradient(self)
        # dgamma, dbeta and (in place of the input, or of the 16-bit layers' delta) dx in
        # one pass over the batch
        dx = self.delta if self.half_out else self.a_prev
        bk.batchnorm_grad(None if first else dx, g["gamma"], g["beta"], self.delta,
                          self.a_prev, self.gamma, self.mean, self.inv_std, alpha, beta)
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
        if self.projection:                 # its dL/dx goes to the block's own _dx
            self.projection.half_grad = False
            self.projection.half_slot = self.half_slot
        # the sum's gradient stays in half_slot, where the last layer reads it
        for layer in self.layers:
            layer.half_slot = layer.grad_slot = self.grad_slot
        self.layers[-1].half_slot = self.half_slot

    def configure(self, backend, in_shape):
        self.backend, self.in_shape = backend, tuple(in_shape)
        shape = self.in_shape
        for layer in self.layers:
            shape = layer.configure(backend, shape)
        self.out_shape = shape
        self.projection = None
        if shape != self.in_shape:
            self.projection = self._projection(shape)
            self.projection.configure(backend, self.in_shape)
        return shape

    def _projection(self, out):
        inp = self.in_shape
        if len(inp) == len(out) == 1:
            return Dense(out[0])
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

    def batch_buffers(self, m):
        out = {"_a": (elements(self.out_shape) * m, _output_dtype(self))}
        if self.projection:
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
        self.a = bk.view(self._a, (*self.out_shape, m))
        # where dL/da arrives, and the sum's gradient stays (real: in place in z), and where
        # dL/dx goes (real: in place of x)
        self.da, self.da_prev = self.half_views(shared, self.a, self.a_prev)
        self.dsum = self.da if self.half_out else self.z
        if self.projection:
            self.projection.bind(self.a_prev, m, shared)
            self.projection.da_prev = bk.view(self._dx, self.a_prev.shape)
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
                bk.activation_grad(self.activation, self.z, self.da, self.dsum)
        elif not delta_in_z:
            bk.activation_grad(self.activation, self.z, self.a)  # dL/d(sum), in z
        if self.projection:             # its delta is the sum's; its dL/dx goes to _dx
            proj = self.projection
            if self.half_out:           # (linear: f' is 1, its delta dL/d(sum) stored)
                proj.backward(train, first)
            else:
                bk.copy(self.z, proj.z)
                proj.backward(train, first, delta_in_z=True)
        for i in reversed(range(len(self.layers))):
            inner_first = first and not any(l.trainable for l in self.layers[:i])
            self.layers[i].backward(train, inner_first)
        if not first:                   # plus the shortcut's part of dL/dx
            bk.axpy(1.0, bk.view(self._dx, self.a_prev.shape) if self.projection else
                    bk.view(self.dsum, self.a_prev.shape), self.da_prev)


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


class Flatten(Layer):
    """(C, H, W) per sample -> (C.H.W,): with batch-innermost storage, a free view."""
    passes_storage = True
    is_view = True

    def output_shape(self, in_shape):
        return (elements(in_shape),)

    def bind(self, a_prev, m, shared):
        super().bind(a_prev, m, shared)
        self.a = self.backend.view(a_prev, (self.out_shape[0], m))

    def forward(self, training=True):
        pass

    def backward(self, train, first, delta_in_z=False):
        pass                                                     # the gradient is the same view


LAYERS = {"Dense": Dense, "Flatten": Flatten, "Conv2D": Conv2D, "MaxPool2D": MaxPool2D,
          "Dropout": Dropout, "AvgPool2D": AvgPool2D, "GlobalAvgPool2D": GlobalAvgPool2D,
          "BatchNorm": BatchNorm, "Residual": Residual}


def nesting_error(depth, what):
    return InputError(f"{what} nest {depth} deep, more than the {MAX_NESTING} portanet "
                      f"builds (layers.MAX_NESTING); make the network flatter: blocks one "
                      f"after another rather than one inside another")


def from_config(name, config, depth=0):
    """The layer saved as (name, config), or an InputError saying what is wrong. depth:
    the Residual blocks around it, which may nest MAX_NESTING deep (refused before
    the configuration inside is read)."""
    if name not in LAYERS:
        raise InputError(f"unknown layer type {name!r}; portanet has {', '.join(LAYERS)}")
    if not isinstance(config, dict) or not all(isinstance(k, str) for k in config):
        raise InputError(f"{name}: its configuration must be a mapping of argument names, "
                         f"got {_short(config)}")
    if name == "Residual" and isinstance(config.get("layers"), list):
        if depth >= MAX_NESTING:
            raise nesting_error(f"{depth + 1} or more", "the saved Residual blocks")
        config = dict(config, layers=[from_config(*_pair(l), depth + 1)
                                      for l in config["layers"]])
    try:
        return LAYERS[name](**config)
    except TypeError as e:           # a missing or unknown argument
        raise InputError(f"{name}({', '.join(config)}): {e}") from e


def _pair(saved):
    if not (isinstance(saved, (list, tuple)) and len(saved) == 2 and isinstance(saved[0], str)):
        raise InputError(f"Residual: each of its saved layers must be [name, configuration], "
                         f"got {_short(saved)}")
    return saved


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother = 4, 80, 80


def _short(value):
    """repr(value) of a few levels and items: a file's values may be long or deep."""
    return _SHORT.repr(value)
