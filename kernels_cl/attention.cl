/* attention.cl: scaled dot-product attention over a batch of sequences, each head's
   softmax made online (FlashAttention's recurrence), so that no T x T matrix is ever in
   memory; the backward makes the scores again. Layout: qkv is (3 dim, T m) (q's rows,
   then k's, then v's; head h takes rows h hd .. h hd + hd - 1 of each), o and do are
   (dim, T m), lse and dsum are (heads, T m); column c = t m + n is token t of sample n.
   A work-item takes one (token, sample) column and one head: dimension 0 the columns, 1
   the heads. scale = 1 / sqrt(hd); causal: a token sees those at or before it. Every
   pointer is followed by its offset in elements. hd is at most MAX_HEAD_DIM (the layer
   refuses more). */
#include "prelude.h"

#ifndef MAX_HEAD_DIM
#define MAX_HEAD_DIM 128
#endif

/* A kernel's work-item: its column c of the batch's tokens, token `token` of sample n,
   and head h (returning where there is none), and that head's rows of q, k and v in qkv
   (cols = t m apart). */
#define HEAD_ROWS(token)                                                                  \
    const int c = GLOBAL_ID(0), h = GLOBAL_ID(1);                                         \
    const int cols = t * m;                                                               \
    if (c >= cols || h * hd >= dim) return;                                               \
    const int token = c / m, n = c - token * m;                                           \
    const GLOBAL real* q = qkv + qkv_off + (h * hd) * cols;                               \
    const GLOBAL real* k = qkv + qkv_off + (dim + h * hd) * cols;                         \
    const GLOBAL real* v = qkv + qkv_off + (2 * dim + h * hd) * cols

/* The last key token i's query sees. */
DEVICE int last_key(const int i, const int t, const int causal) {
    return causal ? i : t - 1;
}

/* o[:, c] <- sum_j softmax_j(q_i . k_j scale) v_j over the keys token i sees, in one pass
   over them (running maximum mx, running sum l, the output rescaled as the maximum grows);
   lse[h, c] <- mx + log(l), which the backward makes each probability again from. */
KERNEL void attention_forward(GLOBAL real* o, const int o_off, GLOBAL real* lse,
                              const int lse_off, const GLOBAL real* qkv, const int qkv_off,
                              const int dim, const int hd, const int t, const int m,
                              const real scale, const int causal) {
    HEAD_ROWS(i);
    real qi[MAX_HEAD_DIM], acc[MAX_HEAD_DIM];
    for (int d = 0; d < hd; d++) {
        qi[d] = q[d * cols + c] * scale;
        acc[d] = 0;
    }
    real mx = -INFINITY, l = 0;
    for (int j = 0; j <= last_key(i, t, causal); j++) {
        const int cj = j * m + n;
        real s = 0;
        for (int d = 0; d < hd; d++) s += qi[d] * k[d * cols + cj];
        const real grown = fmax(mx, s);
        const real shrink = exp(mx - grown), p = exp(s - grown);
        l = l * shrink + p;
        for (int d = 0; d < hd; d++) acc[d] = acc[d] * shrink + p * v[d * cols + cj];
        mx = grown;
    }
    for (int d = 0; d < hd; d++) o[o_off + (h * hd + d) * cols + c] = acc[d] / l;
    lse[lse_off + h * cols + c] = mx + log(l);
}

/* dsum[h, c] <- do_i . o_i over the head's rows: the term each of token i's probabilities
   subtracts in the softmax's backward. */
KERNEL void attention_dsum(GLOBAL real* dsum, const int dsum_off, const GLOBAL real* dout,
                           const int dout_off, const GLOBAL real* o, const int o_off,
                           const int dim, const int hd, const int cols) {
    const int c = GLOBAL_ID(0), h = GLOBAL_ID(1);
    if (c >= cols || h * hd >= dim) return;
    real s = 0;
    for (int d = 0; d < hd; d++) {
        const int at = (h * hd + d) * cols + c;
        s += dout[dout_off + at] * o[o_off + at];
    }
    dsum[dsum_off + h * cols + c] = s;
}

/* The probability p_ij = exp(q_i . k_j scale - lse_i), made again. */
DEVICE real attention_p(const real* qi, const GLOBAL real* k, const int cols, const int cj,
                        const int hd, const real lse) {
    real s = 0;
    for (int d = 0; d < hd; d++) s += qi[d] * k[d * cols + cj];
    return exp(s - lse);
}

/* dq_i <- scale sum_j p_ij (do_i . v_j - dsum_i) k_j over the keys token i sees. */
KERNEL void attention_grad_q(GLOBAL real* dqkv, const int dqkv_off, const GLOBAL real* qkv,
                             const int qkv_off, const GLOBAL real* dout, const int dout_off,
                             const GLOBAL real* lse, const int lse_off,
                             const GLOBAL real* dsum, const int dsum_off, const int dim,
                             const int hd, const int t, const int m, const real scale,
                             const int causal) {
    HEAD_ROWS(i);
    const GLOBAL real* dy = dout + dout_off + (h * hd) * cols;
    real qi[MAX_HEAD_DIM], dyi[MAX_HEAD_DIM], dq[MAX_HEAD_DIM];
    for (int d = 0; d < hd; d++) {
        qi[d] = q[d * cols + c] * scale;
        dyi[d] = dy[d * cols + c];
        dq[d] = 0;
    }
    const real l = lse[lse_off + h * cols + c], ds = dsum[dsum_off + h * cols + c];
    for (int j = 0; j <= last_key(i, t, causal); j++) {
        const int cj = j * m + n;
        const real p = attention_p(qi, k, cols, cj, hd, l);
        real dp = 0;
        for (int d = 0; d < hd; d++) dp += dyi[d] * v[d * cols + cj];
        const real g = p * (dp - ds) * scale;
        for (int d = 0; d < hd; d++) dq[d] += g * k[d * cols + cj];
    }
    for (int d = 0; d < hd; d++) dqkv[dqkv_off + (h * hd + d) * cols + c] = dq[d];
}

/* dk_j <- scale sum_i p_ij (do_i . v_j - dsum_i) q_i and dv_j <- sum_i p_ij do_i over the
   queries that see token j. */
KERNEL void attention_grad_kv(GLOBAL real* dqkv, const int dqkv_off, const GLOBAL real* qkv,
                              const int qkv_off, const GLOBAL real* dout, const int dout_off,
                              const GLOBAL real* lse, const int lse_off,
                              const GLOBAL real* dsum, const int dsum_off, const int dim,
                              const int hd, const int t, const int m, const real scale,
                              const int causal) {
    HEAD_ROWS(j);
    const GLOBAL real* dy = dout + dout_off + (h * hd) * cols;
    real kj[MAX_HEAD_DIM], vj[MAX_HEAD_DIM], dk[MAX_HEAD_DIM], dv[MAX_HEAD_DIM];
    for (int d = 0; d < hd; d++) {
        kj[d] = k[d * cols + c];
        vj[d] = v[d * cols + c];
        dk[d] = 0;
        dv[d] = 0;
    }
    for (int i = causal ? j : 0; i < t; i++) {
        const int ci = i * m + n;
        real s = 0, dp = 0;
        for (int d = 0; d < hd; d++) {
            s += q[d * cols + ci] * scale * kj[d];
            dp += dy[d * cols + ci] * vj[d];
        }
        const real p = exp(s - lse[lse_off + h * cols + ci]);
        const real g = p * (dp - dsum[dsum_off + h * cols + ci]) * scale;
        for (int d = 0; d < hd; d++) {
            dk[d] += g * q[d * cols + ci];
            dv[d] += p * dy[d * cols + ci];
        }
    }
    for (int d = 0; d < hd; d++) {
        dqkv[dqkv_off + (dim + h * hd + d) * cols + c] = dk[d];
        dqkv[dqkv_off + (2 * dim + h * hd + d) * cols + c] = dv[d];
    }
}
