"""Token embeddings: a table's rows gathered by token id (plus a row per position), and
the tables' gradients (embed.cl)."""
import numpy as np

from ...errors import ShapeError
from .reference import quiet


def check_embedding(op, out, table, pos, ids):
    """(vocab, dim, m, cols) of an embedding of ids (T, m) into out (dim, T m) from table
    (vocab, dim) and pos (T, dim) or None; else a ShapeError naming the array."""
    if len(ids.shape) != 2 or len(table.shape) != 2 or len(out.shape) != 2:
        raise ShapeError(f"{op}: ids {tuple(ids.shape)} must be (T, m), table "
                         f"{tuple(table.shape)} (vocab, dim) and out {tuple(out.shape)} "
                         f"(dim, T m)")
    (positions, m), (vocab, dim) = ids.shape, table.shape
    if tuple(out.shape) != (dim, positions * m):
        raise ShapeError(f"{op}: out {tuple(out.shape)} must be ({dim}, {positions * m}) for "
                         f"ids {tuple(ids.shape)} and a table {tuple(table.shape)}")
    if pos is not None and tuple(pos.shape) != (positions, dim):
        raise ShapeError(f"{op}: pos {tuple(pos.shape)} must be ({positions}, {dim}), a row "
                         f"per position")
    return vocab, dim, m, positions * m


class EmbedOps:
    """The family's interface: what each op does, whatever runs it. ids (T, m) are reals
    holding whole numbers in [0, vocab) (the network's input, checked on the host); column
    c = t m + n of out (dim, T m) is token t of sample n."""

    def embedding(self, out, table, pos, ids):
        """out[:, c] <- table[id(c)] (+ pos[t] where pos is not None)."""
        raise NotImplementedError

    def embedding_grad(self, g_table, g_pos, dout, ids, alpha, beta):
        """g_table[v] <- alpha (the sum of dout's columns whose id is v) + beta g_table[v];
        unless g_pos is None, g_pos[t] <- alpha (the sum of dout's columns of position t)
        + beta g_pos[t] (beta = 0: the old values are not read)."""
        raise NotImplementedError


class EmbedReference(EmbedOps):
    """NumPy's: device arrays are NumPy arrays."""

    @quiet
    def embedding(self, out, table, pos, ids):
        vocab, dim, m, cols = check_embedding("embedding", out, table, pos, ids)
        rows = np.clip(ids.reshape(-1).astype(np.int64), 0, vocab - 1)
        e = table[rows]                                   # (cols, dim)
        if pos is not None:
            e = e + np.repeat(pos, m, axis=0)
        out[...] = e.T

    @quiet
    def embedding_grad(self, g_table, g_pos, dout, ids, alpha, beta):
        vocab, dim, m, cols = check_embedding("embedding_grad", dout, g_table, g_pos, ids)
        rows = np.clip(ids.reshape(-1).astype(np.int64), 0, vocab - 1)
        sums = np.zeros((vocab, dim), dout.dtype)
        np.add.at(sums, rows, dout.reshape(dim, cols).T)
        g_table[...] = alpha * sums + (beta * g_table if beta != 0 else 0)
        if g_pos is not None:
            per_t = dout.reshape(dim, -1, m).sum(axis=2).T          # (T, dim)
            g_pos[...] = alpha * per_t + (beta * g_pos if beta != 0 else 0)


class EmbedKernels(EmbedOps):
    """KernelBackend's: launches of embed.cl's kernels."""

    def embedding(self, out, table, pos, ids):
        vocab, dim, m, cols = check_embedding("embedding", out, table, pos, ids)
        self._run("embedding", (cols, dim), out, table, table if pos is None else pos,
                  pos is not None, ids, vocab, dim, m, cols)

    def embedding_grad(self, g_table, g_pos, dout, ids, alpha, beta):
        vocab, dim, m, cols = check_embedding("embedding_grad", dout, g_table, g_pos, ids)
        self._run("embedding_grad", (dim, vocab), g_table, dout, ids, float(alpha),
                  float(beta), vocab, dim, cols)
        if g_pos is not None:
            self._run("embedding_pos_grad", (dim, cols // m), g_pos, dout, float(alpha),
                      float(beta), dim, cols // m, m)
