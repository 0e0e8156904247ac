/* blas.cl: BLAS-2 on row-major arrays. */
#include "prelude.h"
#include "copies.h"
#include "groups.h"

/* y <- alpha a x + beta y, a: rows x cols. One work-group of GROUP_THREADS per row and
   piece of `chunk` columns, so the row is read coalesced (the bias gradient dz . ones reads
   a batch-long row), summed through local memory. Group (i, p) writes row i's sum over its
   p-th piece to y[p rows + i]: with one piece that is y itself; with several, the parts of
   a split sum that gemm_split_sum adds up (few rows of many columns: a conv layer's 16
   channels of 26 x 26 x 256 positions would keep 16 groups busy). */
KERNEL void gemv(GLOBAL real* y, const int y_off, const GLOBAL real* a, const int a_off,
                 const GLOBAL real* x, const int x_off, const real alpha, const real beta,
                 const int rows, const int cols, const int chunk) {
    LOCAL real partial[GROUP_THREADS];
    const int i = GROUP_ID(0), end = min(cols, (GROUP_ID(1) + 1) * chunk);
    real sum = 0;
    for (int k = GROUP_ID(1) * chunk + LOCAL_ID(0); k < end; k += GROUP_THREADS)
        sum += a[a_off + i * cols + k] * x[x_off + k];
    group_sum_into(partial, sum, y, y_off + GROUP_ID(1) * rows + i, alpha, beta);
}

/* z <- f'(z) . da, a layer's delta in place (where shadow is set, h <- its 16-bit copy:
   STORE_HALF), and y <- alpha (z 1) + beta y, its bias gradient, in one pass over z:
   gemv's row groups and pieces, each forming the delta as it reads it (activation_grad
   and then gemv took two launches, a floor of 6-8 us each on NVIDIA's OpenCL). A
   work-item loads DELTA_RUN columns apart before it stores any: one load, store and load
   after another waited out the memory's latency each time (a conv layer's 32 rows of
   43264 took 121 us on an H100, gemv and activation_grad 24). The sums run in gemv's
   order, so the results are the same bit for bit. Built with STORED_HALF, z is a 16-bit
   Dense's (copies.h): read and written in 16 bits, the bias gradient summed before the
   delta rounds. */
#define DELTA_RUN 4
KERNEL void activation_bias_grad(GLOBAL real* y, const int y_off, GLOBAL STORED* RESTRICT z,
                                 const int z_off, const GLOBAL real* RESTRICT da,
                                 const int da_off, GLOBAL unsigned short* RESTRICT h,
                                 const int h_off, const int shadow, const int kind,
                                 const real alpha, const real beta, const int rows,
                                 const int cols, const int chunk) {
    LOCAL real partial[GROUP_THREADS];
    const int i = GROUP_ID(0), end = min(cols, (GROUP_ID(1) + 1) * chunk);
    real sum = 0;
    for (int k = GROUP_ID(1) * chunk + LOCAL_ID(0); k < end; k += DELTA_RUN * GROUP_THREADS) {
        real zs[DELTA_RUN], ds[DELTA_RUN];
#pragma unroll
        for (int u = 0; u < DELTA_RUN; ++u) {
            const int at = i * cols + k + u * GROUP_THREADS;
            const bool in = k + u * GROUP_THREADS < end;
            zs[u] = in ? FROM_STORED(z[z_off + at]) : (real)0;
            ds[u] = in ? da[da_off + at] : (real)0;
        }
#pragma unroll
        for (int u = 0; u < DELTA_RUN; ++u) {
            if (k + u * GROUP_THREADS < end) {
                const real d = activate_grad(kind, zs[u]) * ds[u];
                z[z_off + i * cols + k + u * GROUP_THREADS] = TO_STORED(d);
                STORE_HALF(h, h_off + i * cols + k + u * GROUP_THREADS, d, shadow);
                sum += d;
            }
        }
    }
    group_sum_into(partial, sum, y, y_off + GROUP_ID(1) * rows + i, alpha, beta);
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

/* c <- alpha sum_p parts[p] + beta c, the parts of a split-K gemm (n = M N elements each).
   A work-group is GROUP_THREADS / lanes outputs (dimension 0: neighbours read neighbouring
   addresses) by `lanes` lanes (dimension 1, a power of two). Lane y sums the y-th run of
   ceil(count / lanes) parts in order, and the lanes' sums meet pairwise in local memory, so
   a sum of P parts errs by about P / lanes + log2(lanes) roundings, in an order fixed by
   (count, lanes). One work-item per output summing every part in turn (a conv layer's
   weight gradient: 144 outputs of 338 parts) took 66 us of a 360 us LeNet step on an H100.
   With kind >= 0, c is a dense layer's z (M units x `cols` samples) and the sum ends as
   bias_activation would go on: z <- z + b 1^T, act <- f(z), one launch fewer. */
KERNEL void gemm_split_sum(GLOBAL real* c, const int c_off, const GLOBAL real* parts,
                           const int parts_off, const real alpha, const real beta, const int n,
                           const int count, const int lanes, const GLOBAL real* b,
                           const int b_off, GLOBAL real* act, const int act_off,
                           const int kind, const int cols) {
    LOCAL real sums[GROUP_THREADS];
    const int width = GROUP_THREADS / lanes, x = LOCAL_ID(0), y = LOCAL_ID(1);
    const int i = GROUP_ID(0) * width + x, run = (count + lanes - 1) / lanes;
    const int end = min(count, (y + 1) * run);
    real sum = 0;
    if (i < n)
        for (int p = y * run; p < end; ++p) sum += parts[parts_off + p * n + i];
    sums[y * width + x] = sum;
    for (int step = lanes / 2; step > 0; step /= 2) {
        BARRIER();
        if (y < step) sums[y * width + x] += sums[(y + step) * width + x];
    }
    if (y != 0 || i >= n) return;
    real out = alpha * sums[x] + (beta == (real)0 ? (real)0 : beta * c[c_off + i]);
    if (kind >= 0) {
        out = out + b[b_off + i / cols];
        act[act_off + i] = activate(kind, out);
    }
    c[c_off + i] = out;
}
