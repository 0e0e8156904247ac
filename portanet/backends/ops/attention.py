"""Scaled dot-product attention over a batch of sequences, fused: each head's softmax made
online, no T x T matrix in memory, the backward making the scores again (attention.cl)."""
import numpy as np

from ...errors import ShapeError
from ...rng import dropout_mask
from .reference import quiet

MAX_HEAD_DIM = 128      # a head's features a work-item holds (attention.cl's registers)
QUERY_TILES = (64, 32, 16, 8, 4, 2, 1)  # a work-group's tokens, the most local memory holds
KEY_TILE_BYTES = 32     # attention.cl's KEY_TILE is this over the real's size
LOCAL_RESERVED = 64     # bytes of local memory a build may take beside its arrays


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


def check_key(key):
    """A dropout's key: a one-element int32 device array."""
    if key is None or key.size != 1 or key.dtype != np.int32:
        raise ShapeError("attention: a dropout rate > 0 needs its key, a one-element int32 "
                         "array")


class AttentionOps:
    """The family's interface. Column c = t m + n of every array is token t of sample n;
    head h takes rows h hd .. h hd + hd - 1 of q, k, v and o (hd = dim / heads); each token
    sees every token (or, causal, those at or before it) of its own sample."""

    def attention(self, o, lse, qkv, heads, t, causal, key=None, rate=0.0):
        """o <- softmax(q k^T / sqrt(hd)) v for each sample and head; lse <- the log of each
        query's softmax denominator (with its maximum), which the backward reads. With a
        dropout rate > 0, each probability p_ij (sample n, head h) is kept, times
        1 / (1 - rate), where rng.dropout_mask of key (a one-element int32 device array,
        as Dropout's) says for element ((n heads + h) t + i) t + j, else zeroed."""
        raise NotImplementedError

    def attention_grad(self, dqkv, dsum, dout, qkv, o, lse, heads, t, causal, key=None,
                       rate=0.0):
        """dqkv (3 dim, t m) <- the gradients of q, k and v given dout, the gradient of o
        (of the forward with the same key and rate); dsum (heads, t m) is room for
        dout . o a query, which the kernels share."""
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

    @staticmethod
    def _dropped(heads, m, t, key, rate):
        """The dropout's factors (heads, m, t, t): 1 / (1 - rate) or 0, else 1s."""
        if not rate:
            return 1.0
        check_key(key)
        element = np.arange(m * heads * t * t, dtype=np.int64)
        keep = dropout_mask(None, int(key.reshape(-1)[0]) & 0xFFFFFFFF, rate, element)
        return (keep / (1 - rate)).reshape(m, heads, t, t).transpose(1, 0, 2, 3)

    @quiet
    def attention(self, o, lse, qkv, heads, t, causal, key=None, rate=0.0):
        check_attention("attention", qkv, o, lse, heads, t)
        _, _, v, p, l, dim, hd, m = self._scores(qkv, heads, t, causal)
        p_kept = p * self._dropped(heads, m, t, key, rate)
        o[...] = (p_kept @ v).transpose(0, 3, 2, 1).reshape(dim, t * m)
        lse[...] = l.transpose(0, 2, 1).reshape(heads, t * m)

    @quiet
    def attention_grad(self, dqkv, dsum, dout, qkv, o, lse, heads, t, causal, key=None,
                       rate=0.0):
        check_attention("attention_grad", qkv, o, lse, heads, t)
        check_attention("attention_grad", dqkv, dout, dsum, heads, t)
        q, k, v, p, _, dim, hd, m = self._scores(qkv, heads, t, causal)
        dropped = self._dropped(heads, m, t, key, rate)
        dy = self._heads(dout, dim, hd, t, m)
        dv = (p * dropped).transpose(0, 1, 3, 2) @ dy
        dp = (dy @ v.transpose(0, 1, 3, 2)) * dropped
        d = (dy * self._heads(o, dim, hd, t, m)).sum(-1, keepdims=True)       # do . o
        ds = p * (dp - d) / np.sqrt(hd)
        dq, dk = ds @ k, ds.transpose(0, 1, 3, 2) @ q
        dqkv[...] = np.concatenate([g.transpose(0, 3, 2, 1).reshape(dim, t * m)
                                    for g in (dq, dk, dv)])
        dsum[...] = d[..., 0].transpose(0, 2, 1).reshape(heads, t * m)


def query_tile(hd, itemsize, local_bytes):
    """The tokens a work-group of attention.cl takes for heads of hd features: the most of
    QUERY_TILES whose local memory fits (attention_grad_kv's, the most: its keys' own
    columns of k and v, tiles of KEY_TILE queries' q and do, their lse and dsum)."""
    key_tile = KEY_TILE_BYTES // itemsize
    for tile in QUERY_TILES:
        if (2 * tile * hd + 2 * key_tile * hd + 2 * key_tile) * itemsize \
                <= local_bytes - LOCAL_RESERVED:
            return tile
    raise ShapeError(f"attention: heads of {hd} features do not fit the device's "
                     f"{local_bytes} bytes of local memory: give more heads")


class AttentionKernels(AttentionOps):
    """KernelBackend's: launches of attention.cl's kernels, built for each head dim met
    (HEAD_DIM: a work-item's rows in registers) and the work-group's tokens that local
    memory holds (QUERY_TILE), a work-group per tile of a sample's tokens and head."""

    def _attention_kernel(self, name, hd):
        """(attention.cl's kernel `name` built for heads of hd features, its tile)."""
        key = (name, "head dim", hd)
        if key not in self._kernels:
            tile = query_tile(hd, self.dtype.itemsize, self.gemm_limits[1])
            self._kernels[key] = (self._build("attention", name, [f"-DHEAD_DIM={hd}",
                                                                 f"-DQUERY_TILE={tile}"]),
                                  tile)
        return self._kernels[key]

    def _tiles(self, name, hd, heads, t, m, *args):
        """A launch of `name` over (tiles of QUERY_TILE tokens, heads, samples)."""
        kernel, tile = self._attention_kernel(name, hd)
        self._run(kernel, (-(-t // tile) * tile, heads, m), *args, local=(tile, 1, 1),
                  label=name)

    @staticmethod
    def _dropout(key, rate, lse):
        """The kernels' dropout arguments: the key, the rate and 1 / (1 - rate); without
        dropout, lse stands in for the key (never read)."""
        if rate:
            check_key(key)
        return (key if rate else lse), float(rate), float(1 / (1 - rate))

    def attention(self, o, lse, qkv, heads, t, causal, key=None, rate=0.0):
        dim, hd, m, cols = check_attention("attention", qkv, o, lse, heads, t)
        self._tiles("attention_forward", hd, heads, t, m, o, lse, qkv, dim, t, m,
                    float(1 / np.sqrt(hd)), bool(causal), *self._dropout(key, rate, lse))

    def attention_grad(self, dqkv, dsum, dout, qkv, o, lse, heads, t, causal, key=None,
                       rate=0.0):
        dim, hd, m, cols = check_attention("attention_grad", qkv, o, lse, heads, t)
        check_attention("attention_grad", dqkv, dout, dsum, heads, t)
        scale = float(1 / np.sqrt(hd))
        self._run(self._attention_kernel("attention_dsum", hd)[0], (cols, heads), dsum, dout,
                  o, dim, cols, local=(min(128, self.gemv_threads), 1), label="attention_dsum")
        for kernel in ("attention_grad_q", "attention_grad_kv"):
            self._tiles(kernel, hd, heads, t, m, dqkv, qkv, dout, lse, dsum, dim, t, m, scale,
                        bool(causal), *self._dropout(key, rate, lse))
