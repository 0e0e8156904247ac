/* attention.cl: scaled dot-product attention over a batch of sequences, each head's
   softmax made online (FlashAttention's recurrence), so that no T x T matrix is ever in
   memory; the backward makes the scores again. Layout: qkv is (3 dim, T m) (q's rows,
   then k's, then v's; head h takes rows h hd .. h hd + hd - 1 of each), o and do are
   (dim, T m), lse and dsum are (heads, T m); column c = t m + n is token t of sample n.
   Built for one head dim HEAD_DIM (hd, at most 128: the layer refuses more), so that a
   work-item's rows of it are registers. A work-group of QUERY_TILE work-items takes a
   tile of QUERY_TILE tokens of one sample and head (dimension 0 the tiles' tokens, 1 the
   heads, 2 the samples), a work-item one token; the rows of the other side (keys, or in
   the keys' backward queries) go through local memory in tiles of KEY_TILE tokens, each
   read from global memory once a work-group (FlashAttention's loop), and a tile a causal
   work-group's tokens cannot see is never read. scale = 1 / sqrt(hd); causal: a token
   sees those at or before it. Every pointer is followed by its offset in elements.
   Dropout on the probabilities (rate > 0): p_ij of sample n and head h is kept, times
   keep = 1 / (1 - rate), where random.h's hash of the step's key (read from the device)
   and the element ((n heads + h) t + i) t + j says, and else zeroed after the softmax's
   sum (as torch's scaled_dot_product_attention drops it); the backward draws the same
   mask again. do . o is still each query's term of the softmax's backward. */
#include "prelude.h"
#include "random.h"

#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#ifndef QUERY_TILE              /* a work-group's tokens (its work-items): what local memory
                                   holds (the host gives it; this default fits 48 KB) */
#define QUERY_TILE (256 / (int)sizeof(real))
#endif
#ifndef KEY_TILE
#define KEY_TILE (32 / (int)sizeof(real))   /* the other side's tokens a local tile holds
                                               (ops/attention.py: KEY_TILE_BYTES) */
#endif

/* A work-item's token i of sample n in head h (valid: i < t; the others only help load
   tiles), the group's first token, its column c, that head's rows of q, k and v in qkv
   (cols = t m apart), where its rows of the dropout's elements begin, and the key. */
#define TILE_ROWS(i)                                                                      \
    const int first = GROUP_ID(0) * QUERY_TILE, i = first + LOCAL_ID(0);                  \
    const int h = GLOBAL_ID(1), n = GLOBAL_ID(2), cols = t * m;                           \
    const bool valid = i < t;                                                             \
    const int c = i * m + n;                                                              \
    const GLOBAL real* q = qkv + qkv_off + (h * HEAD_DIM) * cols;                         \
    const GLOBAL real* k = qkv + qkv_off + (dim + h * HEAD_DIM) * cols;                   \
    const GLOBAL real* v = qkv + qkv_off + (2 * dim + h * HEAD_DIM) * cols;               \
    const unsigned int heads_at = (unsigned int)((n * (dim / HEAD_DIM) + h) * t);         \
    const unsigned int draw = rate > 0 ? (unsigned int)key[key_off] : 0u

/* x times the factor of p_ij under dropout: keep or 0 (rate > 0), else x itself. (Intel's
   CPU compiler got dp * (rate > 0 ? factor : 1) - dsum wrong where every work-item of the
   group had rate 0, and this right.) */
#define DROPPED(x, i, j) (rate > 0 ? (x) * kept(draw, (heads_at + (i)) * t + (j), rate, keep) : (x))

/* tile[jj HEAD_DIM + d] <- rows[d cols + (j0 + jj) m + n], tokens j0 .. j0 + KEY_TILE - 1
   of sample n (0 past t), loaded by the group's QUERY_TILE work-items. */
DEVICE void load_tile(LOCAL_PTR real* tile, const GLOBAL real* rows, const int j0,
                      const int t, const int m, const int n, const int cols) {
    for (int e = LOCAL_ID(0); e < KEY_TILE * HEAD_DIM; e += QUERY_TILE) {
        const int jj = e / HEAD_DIM, d = e - jj * HEAD_DIM, j = j0 + jj;
        tile[e] = j < t ? rows[d * cols + j * m + n] : (real)0;
    }
}

/* The tokens up to which a work-group's tokens see keys: causal, those up to its last. */
DEVICE int keys_end(const int first, const int t, const int causal) {
    return causal ? min(t, first + QUERY_TILE) : t;
}

/* The tile of keys from j0 into ks and their values into vs, once the group has done with
   the last tile; the whole group calls it (its barriers). */
DEVICE void load_keys(LOCAL_PTR real* ks, LOCAL_PTR real* vs, const GLOBAL real* k,
                      const GLOBAL real* v, const int j0, const int t, const int m,
                      const int n, const int cols) {
    BARRIER();
    load_tile(ks, k, j0, t, m, n, cols);
    load_tile(vs, v, j0, t, m, n, cols);
    BARRIER();
}

/* The keys token i sees in the tile from j0 (0 to KEY_TILE; none for an invalid one). */
DEVICE int seen(const bool valid, const int i, const int j0, const int t, const int causal) {
    return valid ? max(0, min((causal ? i + 1 : t) - j0, KEY_TILE)) : 0;
}

/* o[:, c] <- sum_j softmax_j(q_i . k_j scale) v_j over the keys token i sees, a tile of
   keys at a time: the tile's scores, their maximum, the running output and sum rescaled
   once a tile as the maximum grows; lse[h, c] <- mx + log(l), which the backward makes
   each probability again from. */
KERNEL void attention_forward(GLOBAL real* o, const int o_off, GLOBAL real* lse,
                              const int lse_off, const GLOBAL real* qkv, const int qkv_off,
                              const int dim, const int t, const int m,
                              const real scale, const int causal, const GLOBAL int* key,
                              const int key_off, const real rate, const real keep) {
    TILE_ROWS(i);
    LOCAL real ks[KEY_TILE * HEAD_DIM], vs[KEY_TILE * HEAD_DIM];
    real qi[HEAD_DIM], acc[HEAD_DIM];
#pragma unroll
    for (int d = 0; d < HEAD_DIM; d++) {
        qi[d] = valid ? q[d * cols + c] * scale : (real)0;
        acc[d] = 0;
    }
    real mx = -INFINITY, l = 0;
    for (int j0 = 0; j0 < keys_end(first, t, causal); j0 += KEY_TILE) {
        load_keys(ks, vs, k, v, j0, t, m, n, cols);
        const int count = seen(valid, i, j0, t, causal);
        if (count == 0) continue;
        real p[KEY_TILE], top = mx;
#pragma unroll
        for (int jj = 0; jj < KEY_TILE; jj++) {
            real s = 0;
#pragma unroll
            for (int d = 0; d < HEAD_DIM; d++) s += qi[d] * ks[jj * HEAD_DIM + d];
            p[jj] = s;
            if (jj < count) top = fmax(top, s);
        }
        const real shrink = exp(mx - top);
        l *= shrink;
#pragma unroll
        for (int jj = 0; jj < KEY_TILE; jj++) {
            const real e = jj < count ? exp(p[jj] - top) : (real)0;
            l += e;
            p[jj] = DROPPED(e, i, j0 + jj);
        }
#pragma unroll
        for (int d = 0; d < HEAD_DIM; d++) {
            real a = acc[d] * shrink;
#pragma unroll
            for (int jj = 0; jj < KEY_TILE; jj++) a += p[jj] * vs[jj * HEAD_DIM + d];
            acc[d] = a;
        }
        mx = top;
    }
    if (!valid) return;
#pragma unroll
    for (int d = 0; d < HEAD_DIM; d++) o[o_off + (h * HEAD_DIM + d) * cols + c] = acc[d] / l;
    lse[lse_off + h * cols + c] = mx + log(l);
}

/* dsum[h, c] <- do_i . o_i over the head's rows: the term each of token i's probabilities
   subtracts in the softmax's backward. */
KERNEL void attention_dsum(GLOBAL real* dsum, const int dsum_off, const GLOBAL real* dout,
                           const int dout_off, const GLOBAL real* o, const int o_off,
                           const int dim, const int cols) {
    const int c = GLOBAL_ID(0), h = GLOBAL_ID(1);
    if (c >= cols || h * HEAD_DIM >= dim) return;
    real s = 0;
    for (int d = 0; d < HEAD_DIM; d++) {
        const int at = (h * HEAD_DIM + d) * cols + c;
        s += dout[dout_off + at] * o[o_off + at];
    }
    dsum[dsum_off + h * cols + c] = s;
}

/* The two backward kernels' parameters: dqkv <- the gradients of q, k and v (its rows
   each kernel writes) from qkv, dout (the gradient of o), lse and dsum. */
#define GRAD_PARAMETERS                                                                   \
    GLOBAL real* dqkv, const int dqkv_off, const GLOBAL real* qkv, const int qkv_off,     \
    const GLOBAL real* dout, const int dout_off, const GLOBAL real* lse,                  \
    const int lse_off, const GLOBAL real* dsum, const int dsum_off, const int dim,        \
    const int t, const int m, const real scale, const int causal, const GLOBAL int* key,  \
    const int key_off, const real rate, const real keep

/* dq_i <- scale sum_j p_ij (do_i . v_j m_ij - dsum_i) k_j over the keys token i sees (m_ij
   the dropout's factor, p_ij made again from lse), a tile of keys at a time. q_i and dq_i
   are registers, do_i the work-item's own column of local memory (read once a feature for
   a whole tile of keys: registers for all three spilled). */
KERNEL void attention_grad_q(GRAD_PARAMETERS) {
    TILE_ROWS(i);
    LOCAL real ks[KEY_TILE * HEAD_DIM], vs[KEY_TILE * HEAD_DIM], dys[HEAD_DIM * QUERY_TILE];
    const GLOBAL real* dy = dout + dout_off + (h * HEAD_DIM) * cols;
    const int own = LOCAL_ID(0);
    real qi[HEAD_DIM], dq[HEAD_DIM];
#pragma unroll
    for (int d = 0; d < HEAD_DIM; d++) {
        qi[d] = valid ? q[d * cols + c] * scale : (real)0;
        dys[d * QUERY_TILE + own] = valid ? dy[d * cols + c] : (real)0;
        dq[d] = 0;
    }
    const real l = valid ? lse[lse_off + h * cols + c] : (real)0;
    const real di = valid ? dsum[dsum_off + h * cols + c] : (real)0;
    for (int j0 = 0; j0 < keys_end(first, t, causal); j0 += KEY_TILE) {
        load_keys(ks, vs, k, v, j0, t, m, n, cols);
        const int count = seen(valid, i, j0, t, causal);
        real s[KEY_TILE], dp[KEY_TILE];
#pragma unroll
        for (int jj = 0; jj < KEY_TILE; jj++) s[jj] = dp[jj] = 0;
#pragma unroll
        for (int d = 0; d < HEAD_DIM; d++) {
            const real qd = qi[d], yd = dys[d * QUERY_TILE + own];
#pragma unroll
            for (int jj = 0; jj < KEY_TILE; jj++) {
                s[jj] += qd * ks[jj * HEAD_DIM + d];
                dp[jj] += yd * vs[jj * HEAD_DIM + d];
            }
        }
#pragma unroll
        for (int jj = 0; jj < KEY_TILE; jj++)       // s becomes the score's gradient
            s[jj] = jj < count ? exp(s[jj] - l) * scale * (DROPPED(dp[jj], i, j0 + jj) - di)
                               : (real)0;
        // the tile is read again, not kept in registers from above (which spilled them)
        BARRIER();
#pragma unroll
        for (int d = 0; d < HEAD_DIM; d++) {
            real a = dq[d];
#pragma unroll
            for (int jj = 0; jj < KEY_TILE; jj++) a += s[jj] * ks[jj * HEAD_DIM + d];
            dq[d] = a;
        }
    }
    if (!valid) return;
#pragma unroll
    for (int d = 0; d < HEAD_DIM; d++) dqkv[dqkv_off + (h * HEAD_DIM + d) * cols + c] = dq[d];
}

/* dk_j <- scale sum_i p_ij (do_i . v_j m_ij - dsum_i) q_i and dv_j <- sum_i p_ij m_ij do_i
   over the queries that see token j (m_ij the dropout's factor), a tile of queries (their
   q, do, lse and dsum) at a time: here the work-group's tokens are keys. dk_j and dv_j are
   registers, k_j and v_j the work-item's own columns of local memory. */
KERNEL void attention_grad_kv(GRAD_PARAMETERS) {
    TILE_ROWS(j);
    LOCAL real qs[KEY_TILE * HEAD_DIM], dys[KEY_TILE * HEAD_DIM];
    LOCAL real lses[KEY_TILE], dsums[KEY_TILE];
    LOCAL real kown[HEAD_DIM * QUERY_TILE], vown[HEAD_DIM * QUERY_TILE];
    const GLOBAL real* dy = dout + dout_off + (h * HEAD_DIM) * cols;
    const int own = LOCAL_ID(0);
    real dk[HEAD_DIM], dv[HEAD_DIM];
#pragma unroll
    for (int d = 0; d < HEAD_DIM; d++) {
        kown[d * QUERY_TILE + own] = valid ? k[d * cols + c] * scale : (real)0;
        vown[d * QUERY_TILE + own] = valid ? v[d * cols + c] : (real)0;
        dk[d] = 0;
        dv[d] = 0;
    }
    // causal: the queries from the group's first key on see its keys
    for (int i0 = causal ? first - first % KEY_TILE : 0; i0 < t; i0 += KEY_TILE) {
        BARRIER();
        load_tile(qs, q, i0, t, m, n, cols);
        load_tile(dys, dy, i0, t, m, n, cols);
        if (own < KEY_TILE) {
            const int at = h * cols + (i0 + own) * m + n;
            const bool in = i0 + own < t;
            lses[own] = in ? lse[lse_off + at] : (real)0;
            dsums[own] = in ? dsum[dsum_off + at] : (real)0;
        }
        BARRIER();
        real s[KEY_TILE], dp[KEY_TILE];
#pragma unroll
        for (int ii = 0; ii < KEY_TILE; ii++) s[ii] = dp[ii] = 0;
#pragma unroll
        for (int d = 0; d < HEAD_DIM; d++) {
            const real kd = kown[d * QUERY_TILE + own], vd = vown[d * QUERY_TILE + own];
#pragma unroll
            for (int ii = 0; ii < KEY_TILE; ii++) {
                s[ii] += qs[ii * HEAD_DIM + d] * kd;
                dp[ii] += dys[ii * HEAD_DIM + d] * vd;
            }
        }
#pragma unroll
        for (int ii = 0; ii < KEY_TILE; ii++) {     // s, dp become the gradients' factors
            const int i = i0 + ii;
            const real p = i < t && (!causal || i >= j) ? exp(s[ii] - lses[ii]) : (real)0;
            s[ii] = p * (DROPPED(dp[ii], i, j) - dsums[ii]) * scale;
            dp[ii] = DROPPED(p, i, j);
        }
        // the tiles are read again, not kept in registers from above (which spilled them)
        BARRIER();
#pragma unroll
        for (int d = 0; d < HEAD_DIM; d++) {
            real a = dk[d], b = dv[d];
#pragma unroll
            for (int ii = 0; ii < KEY_TILE; ii++) {
                a += s[ii] * qs[ii * HEAD_DIM + d];
                b += dp[ii] * dys[ii * HEAD_DIM + d];
            }
            dk[d] = a;
            dv[d] = b;
        }
    }
    if (!valid) return;
#pragma unroll
    for (int d = 0; d < HEAD_DIM; d++) {
        dqkv[dqkv_off + (dim + h * HEAD_DIM + d) * cols + c] = dk[d];
        dqkv[dqkv_off + (2 * dim + h * HEAD_DIM + d) * cols + c] = dv[d];
    }
}
