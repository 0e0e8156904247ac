"""The layers of a feed-forward network: Dense and Conv2D (one GEMM over the batch each),
the pools, Dropout and Flatten."""
import math

import numpy as np

from ..backends.arrays import OF_OUTPUT
from ..backends.base import ACTIVATIONS, CONV_WORKSPACE_BYTES, conv_out
from ..errors import InputError, ShapeError
from ..memory import elements
from .base import DELTA_AND_BIAS, Layer, Masks, Tokens, _count, _output_dtype, _rate

# activations whose derivative follows from the sign of z alone, which a = f(z) keeps
SIGN_ONLY = ("relu", "leaky_relu")


def from_output(layer):
    """Whether a layer in 16-bit storage (where dL/da arrives in a products buffer, not
    over a) keeps a alone, its f' read from a: to the bit where it follows from z's sign
    (SIGN_ONLY: a 16-bit z rounds to 0 where f(z) does), from a's value for sigmoid and
    tanh (OF_OUTPUT, as PyTorch's backward takes them from the output); not where a
    Residual block makes its sum over the output (`output_summed`), where z must stay."""
    return (layer.half_out and not layer.output_summed
            and (layer.activation in SIGN_ONLY or layer.activation in OF_OUTPUT))


def grad_kind(layer):
    """The kind a layer's derivative kernels take: its activation's, or OF_OUTPUT's where
    it keeps a alone and f' is read from a's value."""
    if layer.one_buffer and layer.activation in OF_OUTPUT:
        return OF_OUTPUT[layer.activation]
    return layer.activation

class Dense(Layer):
    """Fully connected: z = w a_prev + b, a = f(z). Inputs of any per-sample shape are
    taken flattened, (prod(in_shape), batch), which is a free view; but a sequence,
    (features, T) a sample, is taken a token at a time, as PyTorch's Linear takes the last
    dimension of (N, T, features): its output is (units, T), and its product one GEMM over
    the T x batch tokens."""
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
        return Tokens((self.units, in_shape[1])) if self.tokens_of(in_shape) else (self.units,)

    @staticmethod
    def tokens_of(in_shape):
        """Whether inputs of in_shape are sequences (Tokens: (features, T)), taken a token at
        a time."""
        return isinstance(in_shape, Tokens)

    @property
    def tokens(self):
        """Columns a sample takes: its T tokens for a sequence, else 1."""
        return self.in_shape[1] if self.tokens_of(self.in_shape) else 1

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
        return in_shape[0] if self.tokens_of(in_shape) else elements(in_shape)

    def batch_buffers(self, m):
        """z and a, or one buffer that z and then a are written to (`one_buffer`)."""
        dtype = _output_dtype(self)
        if self.one_buffer:
            return {"_z": (self.n_out * m, dtype)}
        return {"_z": (self.n_out * m, dtype), "_a": (self.n_out * m, dtype)}

    @property
    def one_buffer(self):
        """Whether z and a share a buffer (z written, then a over it): where the layer is
        linear (a = z, and its backward reads neither: f' is 1), or keeps a alone
        (`from_output`)."""
        return self.activation == "linear" or from_output(self)

    @property
    def _out(self):
        """The buffer a lives in: its own, or z's (`one_buffer`)."""
        return self._z if self.one_buffer else self._a

    def shared_sizes(self, m):
        return self.columns(m), 0

    def products(self, m):
        cols = self.columns(m)
        w, x, dz = self.units * self.n_in, self.n_in * cols, self.units * cols
        return [(w, x, dz), (dz, x, w), (w, dz, x)]     # z = w x, dw = dz x^T, dx = w^T dz

    def columns(self, m):
        """Columns of z and a for a batch of m: a column a sample, or a token (Conv2D: a
        position)."""
        return self.tokens * m

    def input_view(self, m):
        """The shape this layer reads its input in: (n_in, columns) (Conv2D: images)."""
        return (self.n_in, self.columns(m))

    def bind(self, a_prev, m, shared):
        super().bind(self.backend.view(a_prev, self.input_view(m)), m, shared)
        columns = self.columns(m)
        self.z = self.backend.view(self._z, (self.units, columns))
        self.a = self.backend.view(self._out, (self.units, columns))
        self.ones = self.backend.view(shared.ones, (columns,))
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
        cols = self.columns(m)
        return [n for n, half in ((self.n_in * cols, self.half_in),
                                  (self.units * cols, self.half_out)) if not half]

    def backward(self, train, first, delta_in_z=False, add=False):
        """As Layer.backward; with add, dL/da_prev is added to what da_prev holds (a
        Residual block's projection, whose part of dL/dx joins the inner layers')."""
        bk = self.backend
        g, alpha, beta = train.gradient(self)
        bk.keep_operands(self.z)    # the delta, which the products below read: kept before
        self.delta_and_bias_grad(g, alpha, beta, delta_in_z)   # (1) dz; gb <- alpha dz 1 + beta gb
        # (2) gw <- alpha dz a_prev^T + beta gw: before a_prev is overwritten (the river
        # crossing); for SGD, gw is the velocity, alpha = -eta/m and beta = mu
        bk.gemm(alpha, self.z, self.a_prev, beta, g["w"], trans_b=True)
        bk.drop_operands(self.a_prev)
        if not first:
            self.input_grad(add)                                 # (3) da_prev <- w^T dz
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
            self.backend.activation_bias_grad(grad_kind(self), self.z, self.da, alpha, beta,
                                              g["b"], self.ones)

    def input_grad(self, add=False):
        self.backend.gemm(1.0, self.w, self.z, 1.0 if add else 0.0, self.da_prev, trans_a=True)


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
        positions = self.columns(m)
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

    def columns(self, m):
        """Output positions of the whole batch: z and a are (filters, Ho.Wo.N)."""
        return self.out_shape[1] * self.out_shape[2] * m

    def input_view(self, m):
        return (*self.in_shape, m)

    def forward(self, training=True):
        # (16-bit z and a: the sums in float32 where dL/da will arrive, z + b stored in z)
        left = self.backend.conv(self.activation, self.w, self.a_prev, self.b, self.zf,
                                 self.a, self.k, self.stride, self.pad, self.shared.workspace,
                                 stored=self.z if self.half_out else None)
        self.shared.workspace_holds = id(self) if left else None

    def backward(self, train, first, delta_in_z=False, add=False):
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
            self.input_grad(add)                                 # (3) da_prev <- w^T * dz
        train.update(self)                                       # (4) the optimizer's kernel

    def input_grad(self, add=False):
        self.backend.conv_input_grad(self.da_prev, self.w, self.z, self.k, self.stride,
                                     self.pad, self.shared.workspace, add=add)


class Embedding(Layer):
    """Token ids to vectors, as PyTorch's Embedding: a sample's T ids (the network's input,
    (N, T) integers in [0, vocab)) become (dim, T), token t's column the table's row of its
    id; with positions, a learned vector per position is added (a GPT's token and position
    embeddings). Its output is a sequence: the layers after it take it a token at a time
    (Dense, LayerNorm), or whole after Flatten. It must come first. Both tables start
    normal with deviation 0.02 (GPT-2's) and take weight decay, as nanoGPT's do.

    Its gradient is a sum over the tokens of each id, made without atomics: the same bits
    on every run and device (embed.cl walks every token for each entry of the table)."""
    trainable = True
    takes_ids = True                # the network's input is token ids (inputs.check_x)

    def __init__(self, vocab, dim, positions=False):
        self.vocab = _count("vocab", vocab, 1, "Embedding")
        self.dim = _count("dim", dim, 1, "Embedding")
        if not isinstance(positions, bool):
            raise InputError(f"Embedding: positions must be True or False, got {positions!r}")
        self.positions = positions

    def config(self):
        return {"vocab": self.vocab, "dim": self.dim, "positions": self.positions}

    @property
    def decayed(self):
        return ("table", "pos") if self.positions else ("table",)

    def output_shape(self, in_shape):
        if len(in_shape) != 1:
            raise ShapeError(f"{self} takes a sequence of T token ids a sample, (T,), got "
                             f"inputs of shape {in_shape}")
        return Tokens((self.dim, in_shape[0]))

    def parameters(self):
        out = {"table": (self.vocab, self.dim)}
        if self.positions:
            out["pos"] = (self.in_shape[0], self.dim)
        return out

    def initial(self, rng):
        return {name: rng.normal(0.0, 0.02, shape) for name, shape in self.parameters().items()}

    def batch_buffers(self, m):
        return {"_a": (self.dim * self.in_shape[0] * m, None)}

    def bind(self, a_prev, m, shared):
        bk, t = self.backend, self.in_shape[0]
        super().bind(bk.view(a_prev, (t, m)), m, shared)
        self.a = bk.view(self._a, (self.dim, t * m))

    def forward(self, training=True):
        self.backend.embedding(self.a, self.table, self.pos if self.positions else None,
                               self.a_prev)

    def backward(self, train, first, delta_in_z=False):
        # (first always: the network refuses an Embedding anywhere else)
        g, alpha, beta = train.gradient(self)
        self.backend.embedding_grad(g["table"], g.get("pos"), self.a, self.a_prev, alpha, beta)
        train.update(self)

    def check_ids(self, x):
        """x, a host array of token ids (N, T), as the backend's reals: an InputError where
        an id is not a whole number in [0, vocab), or would not be one in that type."""
        exact = 2 ** (np.finfo(self.backend.dtype).nmant + 1)
        if self.vocab > exact:
            raise InputError(f"{self}: ids up to {self.vocab - 1} are not whole numbers in "
                             f"{self.backend.dtype}; use a vocabulary of at most {exact}")
        if not (np.issubdtype(x.dtype, np.integer) or np.issubdtype(x.dtype, np.floating)):
            raise InputError(f"{self}: token ids have dtype {x.dtype}; give integers")
        bad = ~np.isfinite(x) if np.issubdtype(x.dtype, np.floating) else np.zeros(x.shape, bool)
        with np.errstate(invalid="ignore"):
            bad |= (x < 0) | (x >= self.vocab) | (x != np.floor(x))
        if bad.any():
            at = np.argwhere(bad)[0]
            raise InputError(f"{self}: token id {x[tuple(at)].item()!r} at sample {at[0]}, position "
                             f"{at[1] if len(at) > 1 else 0} is not a whole number in "
                             f"[0, {self.vocab}): give ids of the vocabulary")
        return x.astype(self.backend.dtype)


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



class Dropout(Masks, Layer):
    """Zeroes each input with probability `rate` while training and scales the rest by
    1 / (1 - rate); the identity in inference. Its masks are drawn as Masks says. In
    16-bit storage its output is stored as its input is; the gradient, float32, is masked
    in place."""
    passes_storage = True

    def __init__(self, rate=0.5, seed=0):
        self.rate, self.seed = _rate("rate", rate, "Dropout"), _count("seed", seed, 0, "Dropout")

    def config(self):
        return {"rate": self.rate, "seed": self.seed}

    def batch_buffers(self, m):
        return {"_a": (elements(self.in_shape) * m, _output_dtype(self)), "_key": (1, np.int32)}

    def bind(self, a_prev, m, shared):
        super().bind(a_prev, m, shared)
        self.a = self.backend.view(self._a, a_prev.shape)
        self.da, self.da_prev = self.half_views(shared, self.a, self.a_prev)

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
