/* embed.cl: token embeddings. A batch of m samples of T token ids is held as the network's
   input, (T, m) reals (whole numbers, each an id): column c = t m + n is token t of sample
   n. Its embedding out is (dim, T m): column c the table's row of its id, plus, where
   has_pos, the row t of the position table. table is (vocab, dim) and pos (T, dim), row
   by row, as PyTorch's Embedding weights. Every pointer is followed by its offset in
   elements. An id outside [0, vocab) (which the host refuses before it comes here) reads
   row 0 or vocab - 1, never memory beyond the table. */
#include "prelude.h"

DEVICE int token_row(const real id, const int vocab) {
    const int v = (int)id;
    return v < 0 ? 0 : v >= vocab ? vocab - 1 : v;
}

/* out[d, c] <- table[id(c), d] (+ pos[c / m, d]). Dimension 0 along the columns. */
KERNEL void embedding(GLOBAL real* out, const int out_off, const GLOBAL real* table,
                      const int table_off, const GLOBAL real* pos, const int pos_off,
                      const int has_pos, const GLOBAL real* ids, const int ids_off,
                      const int vocab, const int dim, const int m, const int cols) {
    const int c = GLOBAL_ID(0), d = GLOBAL_ID(1);
    if (c >= cols || d >= dim) return;
    const int v = token_row(ids[ids_off + c], vocab);
    real e = table[table_off + v * dim + d];
    if (has_pos) e += pos[pos_off + (c / m) * dim + d];
    out[out_off + d * cols + c] = e;
}

/* The table's gradient, deterministic (no atomics: the same bits on every run and device):
     g[v, d] <- alpha sum over the columns c whose id is v of dout[d, c] + beta g[v, d]
   (beta = 0: the old value is not read). One work-item per (v, d), dimension 0 along d,
   each walking every column: vocab x dim x columns steps, for small vocabularies. */
KERNEL void embedding_grad(GLOBAL real* g, const int g_off, const GLOBAL real* dout,
                           const int dout_off, const GLOBAL real* ids, const int ids_off,
                           const real alpha, const real beta, const int vocab, const int dim,
                           const int cols) {
    const int d = GLOBAL_ID(0), v = GLOBAL_ID(1);
    if (d >= dim || v >= vocab) return;
    real sum = 0;
    for (int c = 0; c < cols; c++)
        if (token_row(ids[ids_off + c], vocab) == v) sum += dout[dout_off + d * cols + c];
    const int i = g_off + v * dim + d;
    g[i] = alpha * sum + (beta == (real)0 ? (real)0 : beta * g[i]);
}

/* The position table's gradient: g[t, d] <- alpha sum_n dout[d, t m + n] + beta g[t, d].
   One work-item per (t, d), dimension 0 along d. */
KERNEL void embedding_pos_grad(GLOBAL real* g, const int g_off, const GLOBAL real* dout,
                               const int dout_off, const real alpha, const real beta,
                               const int dim, const int positions, const int m) {
    const int d = GLOBAL_ID(0), t = GLOBAL_ID(1);
    if (d >= dim || t >= positions) return;
    const int cols = positions * m;
    real sum = 0;
    for (int n = 0; n < m; n++) sum += dout[dout_off + d * cols + t * m + n];
    const int i = g_off + t * dim + d;
    g[i] = alpha * sum + (beta == (real)0 ? (real)0 : beta * g[i]);
}
