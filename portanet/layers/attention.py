"""Multi-head self-attention over sequences."""
import math

import numpy as np

from ..backends.ops.attention import MAX_HEAD_DIM
from ..errors import InputError, ShapeError
from .base import Layer, Masks, Tokens, _count, _rate


class MultiHeadAttention(Masks, Layer):
    """Multi-head self-attention (Vaswani et al.) over a sequence, (dim, T) a sample, as a
    GPT's: q, k and v of every token from one product over the batch's tokens (w_qkv,
    (3 dim, dim), and b_qkv: PyTorch's in_proj and nanoGPT's c_attn), each of `heads` heads
    of dim / heads features attending over its sample's tokens (causal: each token those
    at or before it), the heads' outputs side by side, then projected (w_o, b_o: out_proj,
    c_proj). The attention itself is one fused kernel family (attention.cl): each head's
    softmax is made online, so no T x T matrix is ever in memory, and the backward makes
    the scores again.

    dropout: while training, each attention probability is zeroed with this probability
    after the softmax and the rest scaled by 1 / (1 - dropout), as nanoGPT's attn_dropout
    and torch's scaled_dot_product_attention(dropout_p) do; its masks are drawn as
    Dropout's (layers.Masks: a hash of seed, step and element, never stored).

    It keeps q, k and v, the heads' outputs and each query's log softmax denominator for
    the backward; the gradients of q, k, v and the heads' outputs live in the network's
    shared workspace, only while its backward runs; its dL/dx replaces its input, as every
    layer's."""
    trainable = True
    decayed = ("w_qkv", "w_o")

    def __init__(self, heads, causal=True, dropout=0.0, seed=0):
        self.heads = _count("heads", heads, 1, "MultiHeadAttention")
        if not isinstance(causal, bool):
            raise InputError(f"MultiHeadAttention: causal must be True or False, got "
                             f"{causal!r}")
        self.causal = causal
        self.dropout = _rate("dropout", dropout, "MultiHeadAttention")
        self.seed = _count("seed", seed, 0, "MultiHeadAttention")

    @property
    def draws_masks(self):
        return self.dropout > 0

    def config(self):
        out = {"heads": self.heads, "causal": self.causal}
        if self.dropout:
            out.update(dropout=self.dropout, seed=self.seed)
        return out

    def output_shape(self, in_shape):
        if not isinstance(in_shape, Tokens):
            raise ShapeError(f"{self} takes a sequence (features, T) a sample, as Embedding "
                             f"gives, got inputs of shape {in_shape}")
        dim = in_shape[0]
        if dim % self.heads:
            raise ShapeError(f"{self}: {dim} features do not split into {self.heads} heads: "
                             f"give a multiple of heads")
        if dim // self.heads > MAX_HEAD_DIM:
            raise ShapeError(f"{self}: heads of {dim // self.heads} features; at most "
                             f"{MAX_HEAD_DIM} a head: give more heads")
        return in_shape

    @property
    def dim(self):
        return self.in_shape[0]

    @property
    def tokens(self):
        return self.in_shape[1]

    def parameters(self):
        d = self.dim
        return {"w_qkv": (3 * d, d), "w_o": (d, d), "b_qkv": (3 * d,), "b_o": (d,)}

    def initial(self, rng):
        # PyTorch's MultiheadAttention: in_proj Xavier-uniform, biases 0; out_proj as a
        # Linear's weight (uniform within 1 / sqrt(dim))
        d = self.dim
        limit = math.sqrt(6.0 / (d + 3 * d))
        return {"w_qkv": rng.uniform(-limit, limit, (3 * d, d)),
                "w_o": rng.uniform(-1 / math.sqrt(d), 1 / math.sqrt(d), (d, d))}

    def shared_sizes(self, m):
        # the ones vector of the bias gradients; the gradients of q, k, v and o
        cols = self.tokens * m
        return cols, 4 * self.dim * cols

    def batch_buffers(self, m):
        cols, d = self.tokens * m, self.dim
        return {"_qkv": (3 * d * cols, None), "_o": (d * cols, None),
                "_lse": (self.heads * cols, None), "_a": (d * cols, None),
                "_dsum": (self.heads * cols, None), "_key": (1, np.int32)}

    def products(self, m):
        cols, d = self.tokens * m, self.dim
        return [(3 * d * d, d * cols, 3 * d * cols), (d * d, d * cols, d * cols),
                (3 * d * cols, d * cols, 3 * d * d), (d * cols, d * cols, d * d),
                (d * d, d * cols, d * cols), (3 * d * d, 3 * d * cols, d * cols)]

    def bind(self, a_prev, m, shared):
        bk, cols, d = self.backend, self.tokens * m, self.dim
        super().bind(bk.view(a_prev, (d, cols)), m, shared)
        self.qkv, self.o = bk.view(self._qkv, (3 * d, cols)), bk.view(self._o, (d, cols))
        self.lse = bk.view(self._lse, (self.heads, cols))
        self.a = bk.view(self._a, (d, cols))
        self.shared = shared
        self.do = bk.view(shared.workspace, (d, cols))
        self.dqkv = bk.view(shared.workspace, (3 * d, cols), d * cols)
        self.dsum = bk.view(self._dsum, (self.heads, cols))
        self.ones = bk.view(shared.ones, (cols,))

    def forward(self, training=True):
        bk = self.backend
        bk.dense("linear", self.w_qkv, self.a_prev, self.b_qkv, self.qkv, self.qkv)
        bk.attention(self.o, self.lse, self.qkv, self.heads, self.tokens, self.causal,
                     self._key, self.dropout if training else 0.0)
        bk.dense("linear", self.w_o, self.o, self.b_o, self.a, self.a)

    def backward(self, train, first, delta_in_z=False):
        bk = self.backend
        self.shared.workspace_holds = None      # no conv layer's patches are left there
        g, alpha, beta = train.gradient(self)
        # the projection: dL/da arrived in a
        bk.gemv(alpha, self.a, self.ones, beta, g["b_o"])
        bk.gemm(alpha, self.a, self.o, beta, g["w_o"], trans_b=True)
        bk.gemm(1.0, self.w_o, self.a, 0.0, self.do, trans_a=True)
        # the attention, then q, k and v's product: its weight gradient reads the input
        # before dL/dx replaces it
        bk.attention_grad(self.dqkv, self.dsum, self.do, self.qkv, self.o, self.lse,
                          self.heads, self.tokens, self.causal, self._key, self.dropout)
        bk.gemv(alpha, self.dqkv, self.ones, beta, g["b_qkv"])
        bk.gemm(alpha, self.dqkv, self.a_prev, beta, g["w_qkv"], trans_b=True)
        if not first:
            bk.gemm(1.0, self.w_qkv, self.dqkv, 0.0, self.a_prev, trans_a=True)
        train.update(self)
