"""Scaled dot-product attention over a batch of sequences, fused: each head's softmax made
online, no T x T matrix in memory, the backward making the scores again (attention.cl)."""
import numpy as np

from ...errors import ShapeError
from .reference import quiet

MAX_HEAD_DIM = 128      # a head's features a work-item holds (attention.cl's private rows)


def check_attention(op, qkv, o, lse, heads, t):
    """(dim, hd, m, cols) of an attention of heads over sequences of t tokens: qkv
    (3 dim, t m), o (dim, t m), lse (heads, t m); else a ShapeError naming the array."""
    if len(qkv.shape) != 2 or qkv.shape[0] % 3 or qkv.shape[1] % t:
        raise ShapeError(f"{op}: qkv {tuple(qkv.shape)} must be (3 dim, {t} m): q's, k's and "
                         f"v's rows over the batch's tokens")
    dim, cols = qkv.shape[0] // 3, qkv.shape[1]
    if dim % heads or dim // heads > MAX_HEAD_DIM:
        raise ShapeError(f"{op}: {dim} features do not make {heads} heads of at most "
                         f"{MAX_HEAD_DIM} each")
    for name, x, shape in (("o", o, (dim, cols)), ("lse", lse, (heads, cols))):
        if tuple(x.shape) != shape:
            raise ShapeError(f"{op}: {name} {tuple(x.shape)} must be {shape}")
    return dim, dim // heads, cols // t, cols


class AttentionOps:
    """The family's interface. Column c = t m + n of every array is token t of sample n;
    head h takes rows h hd .. h hd + hd - 1 of q, k, v and o (hd = dim / heads); each token
    sees every token (or, causal, those at or before it) of its own sample."""

    def attention(self, o, lse, qkv, heads, t, causal):
        """o <- softmax(q k^T / sqrt(hd)) v for each sample and head; lse <- the log of each
        query's softmax denominator (with its maximum), which the backward reads."""
        raise NotImplementedError

    def attention_grad(self, dqkv, dsum, dout, qkv, o, lse, heads, t, causal):
        """dqkv (3 dim, t m) <- the gradients of q, k and v given dout, the gradient of o;
        dsum (heads, t m) is room for dout . o a query, which the kernels share."""
        raise NotImplementedError


class AttentionReference(AttentionOps):
    """NumPy's, a (t, t) matrix a sample and head."""

    @staticmethod
    def _heads(x, dim, hd, t, m):
        """(heads, m, t, hd) views of rows (dim, t m)."""
        return x.reshape(dim // hd, hd, t, m).transpose(0, 3, 2, 1)

    def _scores(self, qkv, heads, t, causal):
        dim, hd, m, _ = check_attention("attention", qkv, np.empty((qkv.shape[0] // 3,
                                                                     qkv.shape[1])),
                                        np.empty((heads, qkv.shape[1])), heads, t)
        q, k, v = (self._heads(part, dim, hd, t, m) for part in np.split(qkv, 3))
        s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd)
        if causal:
            s = np.where(np.tril(np.ones((t, t), bool)), s, -np.inf)
        mx = s.max(axis=-1, keepdims=True)
        e = np.exp(s - mx)
        total = e.sum(axis=-1, keepdims=True)
        return q, k, v, e / total, (mx + np.log(total))[..., 0], dim, hd, m

    @quiet
    def attention(self, o, lse, qkv, heads, t, causal):
        check_attention("attention", qkv, o, lse, heads, t)
        _, _, v, p, l, dim, hd, m = self._scores(qkv, heads, t, causal)
        o[...] = (p @ v).transpose(0, 3, 2, 1).reshape(dim, t * m)
        lse[...] = l.transpose(0, 2, 1).reshape(heads, t * m)

    @quiet
    def attention_grad(self, dqkv, dsum, dout, qkv, o, lse, heads, t, causal):
        check_attention("attention_grad", qkv, o, lse, heads, t)
        check_attention("attention_grad", dqkv, dout, dsum, heads, t)
        q, k, v, p, _, dim, hd, m = self._scores(qkv, heads, t, causal)
        dy = self._heads(dout, dim, hd, t, m)
        dv = p.transpose(0, 1, 3, 2) @ dy
        dp = dy @ v.transpose(0, 1, 3, 2)
        ds = p * (dp - (dy * self._heads(o, dim, hd, t, m)).sum(-1, keepdims=True)) / np.sqrt(hd)
        dq, dk = ds @ k, ds.transpose(0, 1, 3, 2) @ q
        dqkv[...] = np.concatenate([g.transpose(0, 3, 2, 1).reshape(dim, t * m)
                                    for g in (dq, dk, dv)])
        dsum[...] = (dy * self._heads(o, dim, hd, t, m)).sum(-1).transpose(0, 2, 1).reshape(
            heads, t * m)


class AttentionKernels(AttentionOps):
    """KernelBackend's: launches of attention.cl's kernels, a work-item per token and head,
    a work-group's work-items all of one head (the default 32 x 8 groups would leave a
    quarter of them idle for 6 heads, seven eighths for 1)."""

    def _heads_local(self):
        return (min(128, self.gemv_threads), 1)

    def attention(self, o, lse, qkv, heads, t, causal):
        dim, hd, m, cols = check_attention("attention", qkv, o, lse, heads, t)
        self._run("attention_forward", (cols, heads), o, lse, qkv, dim, hd, t, m,
                  float(1 / np.sqrt(hd)), bool(causal), local=self._heads_local())

    def attention_grad(self, dqkv, dsum, dout, qkv, o, lse, heads, t, causal):
        dim, hd, m, cols = check_attention("attention_grad", qkv, o, lse, heads, t)
        check_attention("attention_grad", dqkv, dout, dsum, heads, t)
        scale = float(1 / np.sqrt(hd))
        local = self._heads_local()
        self._run("attention_dsum", (cols, heads), dsum, dout, o, dim, hd, cols, local=local)
        for kernel in ("attention_grad_q", "attention_grad_kv"):
            self._run(kernel, (cols, heads), dqkv, qkv, dout, lse, dsum, dim, hd, t, m, scale,
                      bool(causal), local=local)
