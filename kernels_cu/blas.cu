/* blas.cu: BLAS-2 on row-major arrays. */
#include "prelude.h"

#ifndef GEMV_THREADS                /* work-items of gemv's group, set from the device's limits */
#define GEMV_THREADS 256
#endif

/* y <- alpha a x + beta y, a: rows x cols. One work-group of GEMV_THREADS per row, so the
   row is read coalesced (the bias gradient dz . ones reads a batch-long row), summed
   through local memory. */
KERNEL void gemv(GLOBAL real* y, const int y_off, const GLOBAL real* a, const int a_off,
                 const GLOBAL real* x, const int x_off, const real alpha, const real beta,
                 const int rows, const int cols) {
    LOCAL real partial[GEMV_THREADS];
    const int i = GROUP_ID(0), t = LOCAL_ID(0);
    real sum = 0;
    for (int k = t; k < cols; k += GEMV_THREADS) sum += a[a_off + i * cols + k] * x[x_off + k];
    partial[t] = sum;
    BARRIER();
    for (int stride = GEMV_THREADS / 2; stride > 0; stride /= 2) {
        if (t < stride) partial[t] += partial[t + stride];
        BARRIER();
    }
    if (t == 0) y[y_off + i] = alpha * partial[0] + (beta == (real)0 ? (real)0 : beta * y[y_off + i]);
}

/* y <- alpha a^T x + beta y. One work-item per column: neighbours read neighbouring
   addresses. The column is summed in pieces of GEMV_PIECE rows, so that no float sum runs
   longer (ACC_K in backends/base.py says why). */
#define GEMV_PIECE 512
KERNEL void gemv_t(GLOBAL real* y, const int y_off, const GLOBAL real* a, const int a_off,
                   const GLOBAL real* x, const int x_off, const real alpha, const real beta,
                   const int rows, const int cols) {
    const int j = GLOBAL_ID(0);
    if (j >= cols) return;
    real sum = 0;
    for (int k0 = 0; k0 < rows; k0 += GEMV_PIECE) {
        real piece = 0;
        const int k1 = min(rows, k0 + GEMV_PIECE);
        for (int k = k0; k < k1; ++k) piece += a[a_off + k * cols + j] * x[x_off + k];
        sum += piece;
    }
    y[y_off + j] = alpha * sum + (beta == (real)0 ? (real)0 : beta * y[y_off + j]);
}

/* a <- alpha x y^T + a, a: rows x cols */
KERNEL void ger(GLOBAL real* a, const int a_off, const GLOBAL real* x, const int x_off,
                const GLOBAL real* y, const int y_off, const real alpha, const int rows,
                const int cols) {
    const int j = GLOBAL_ID(0);
    const int i = GLOBAL_ID(1);
    if (i < rows && j < cols) a[a_off + i * cols + j] += alpha * x[x_off + i] * y[y_off + j];
}

/* c <- alpha sum_p parts[p] + beta c, the parts of a split-K gemm (n = M N each), summed
   pairwise so that the sum of P parts errs by log2(P) roundings, not P: the parts are
   taken in order, and a partial sum of 2^h of them merges with the one before it of the
   same size (a binary counter; stack[h] holds the waiting sum of 2^h parts) */
#define SPLIT_SUM_DEPTH 16              /* up to 2^16 parts */
KERNEL void gemm_split_sum(GLOBAL real* c, const int c_off, const GLOBAL real* parts,
                           const int parts_off, const real alpha, const real beta, const int n,
                           const int count) {
    const int i = GLOBAL_ID(0);
    if (i >= n) return;
    real stack[SPLIT_SUM_DEPTH];
    int depth = 0;
    for (int p = 0; p < count; ++p) {
        real sum = parts[parts_off + p * n + i];
        for (int q = p + 1; (q & 1) == 0; q >>= 1) sum += stack[--depth];
        stack[depth++] = sum;
    }
    real sum = 0;
    while (depth > 0) sum += stack[--depth];
    c[c_off + i] = alpha * sum + (beta == (real)0 ? (real)0 : beta * c[c_off + i]);
}
