/* loss.cu: losses fused with the output layer's gradient, and argmax. One work-item per
   sample j (a column of the (outputs, batch) arrays). Each writes the delta for its
   column and ADDS its loss and whether it was classified right (hit) to loss[j] and
   hit[j], the sums of an epoch; it reads a before writing delta, so delta may alias a. */
#include "prelude.h"
#include "groups.h"

/* log p, with p kept off 0 but a NaN kept NaN (fmax(NaN, x) is x, which hid divergence):
   NumPy's maximum, which the reference uses, propagates NaN the same way */
DEVICE real log_clamped(const real p) { return log(p < REAL_MIN ? REAL_MIN : p); }

/* column j of the output layer: z <- z + b; a <- softmax(z) */
DEVICE void softmax_column(GLOBAL real* a, const int a_off, GLOBAL real* z, const int z_off,
                           const GLOBAL real* b, const int b_off, const int rows,
                           const int cols, const int j) {
    real zmax = -INFINITY;
    for (int i = 0; i < rows; ++i) {
        const real zij = z[z_off + i * cols + j] + b[b_off + i];
        z[z_off + i * cols + j] = zij;
        zmax = fmax(zmax, zij);
    }
    real sum = 0;
    for (int i = 0; i < rows; ++i) {
        const real e = exp(z[z_off + i * cols + j] - zmax);
        a[a_off + i * cols + j] = e;
        sum += e;
    }
    for (int i = 0; i < rows; ++i) a[a_off + i * cols + j] /= sum;
}

/* column j: delta <- a - onehot(label); loss += -log a[label]; hit += argmax a == label */
DEVICE void xent_column(GLOBAL real* delta, const int delta_off, GLOBAL real* loss,
                        const int loss_off, GLOBAL real* hit, const int hit_off,
                        const GLOBAL real* a, const int a_off, const GLOBAL int* labels,
                        const int labels_off, const int rows, const int cols, const int j) {
    const int label = labels[labels_off + j];
    int best = 0;
    real best_a = a[a_off + j];
    for (int i = 0; i < rows; ++i) {
        const real aij = a[a_off + i * cols + j];
        if (BEATS(aij, best_a)) { best_a = aij; best = i; }
        if (i == label) loss[loss_off + j] -= log_clamped(aij);
        delta[delta_off + i * cols + j] = aij - (i == label ? (real)1 : (real)0);
    }
    if (best == label) hit[hit_off + j] += (real)1;
}

/* softmax over the features of each sample: z <- z + b 1^T; a[:, j] <- softmax(z[:, j]).
   One work-item per sample (column); outputs are few (classes). Here beside the losses,
   with which bias_softmax_xent fuses it. */
KERNEL void bias_softmax(GLOBAL real* a, const int a_off, GLOBAL real* z, const int z_off,
                         const GLOBAL real* b, const int b_off, const int rows, const int cols) {
    const int j = GLOBAL_ID(0);
    if (j < cols) softmax_column(a, a_off, z, z_off, b, b_off, rows, cols, j);
}

KERNEL void softmax_xent(GLOBAL real* delta, const int delta_off, GLOBAL real* loss,
                         const int loss_off, GLOBAL real* hit, const int hit_off,
                         const GLOBAL real* a, const int a_off, const GLOBAL int* labels,
                         const int labels_off, const int rows, const int cols) {
    const int j = GLOBAL_ID(0);
    if (j < cols) xent_column(delta, delta_off, loss, loss_off, hit, hit_off, a, a_off,
                              labels, labels_off, rows, cols, j);
}

/* bias_softmax, then softmax_xent with the delta into z: one launch for a training step's
   output layer and loss */
KERNEL void bias_softmax_xent(GLOBAL real* loss, const int loss_off, GLOBAL real* hit,
                              const int hit_off, GLOBAL real* a, const int a_off,
                              GLOBAL real* z, const int z_off, const GLOBAL real* b,
                              const int b_off, const GLOBAL int* labels, const int labels_off,
                              const int rows, const int cols) {
    const int j = GLOBAL_ID(0);
    if (j >= cols) return;
    softmax_column(a, a_off, z, z_off, b, b_off, rows, cols, j);
    xent_column(z, z_off, loss, loss_off, hit, hit_off, a, a_off, labels, labels_off, rows,
                cols, j);
}

/* bias_softmax_xent, then the output layer's bias gradient from the delta it left in z,
   gb <- alpha (z 1) + beta gb, in one work-group of GROUP_THREADS: work-item t takes the
   samples t, t + GROUP_THREADS, ... and sums each row of its delta over them as gemv's
   work-item t does, then the group adds up as gemv's does, so gb is gemv's bit for bit.
   One launch where there were two (6-10 us each on NVIDIA's OpenCL), for the few samples
   of a training batch; one group gives up the parallelism of many, so routing measures
   the two ways per shape (GpuBackend.bias_softmax_xent_grad). */
KERNEL void bias_softmax_xent_grad(GLOBAL real* loss, const int loss_off, GLOBAL real* hit,
                                   const int hit_off, GLOBAL real* a, const int a_off,
                                   GLOBAL real* z, const int z_off, const GLOBAL real* b,
                                   const int b_off, const GLOBAL int* labels,
                                   const int labels_off, GLOBAL real* gb, const int gb_off,
                                   const real alpha, const real beta, const int rows,
                                   const int cols) {
    LOCAL real partial[GROUP_THREADS];
    const int t = LOCAL_ID(0);
    for (int j = t; j < cols; j += GROUP_THREADS) {
        softmax_column(a, a_off, z, z_off, b, b_off, rows, cols, j);
        xent_column(z, z_off, loss, loss_off, hit, hit_off, a, a_off, labels, labels_off,
                    rows, cols, j);
    }
    for (int i = 0; i < rows; ++i) {    /* (each work-item reads back its own columns) */
        real sum = 0;
        for (int j = t; j < cols; j += GROUP_THREADS) sum += z[z_off + i * cols + j];
        group_sum_into(partial, sum, gb, gb_off + i, alpha, beta);
    }
}

/* delta <- a - y; loss += sum_i -(y log a + (1 - y) log(1 - a)); hit += all (a > 1/2) == y */
KERNEL void sigmoid_bce(GLOBAL real* delta, const int delta_off, GLOBAL real* loss,
                        const int loss_off, GLOBAL real* hit, const int hit_off,
                        const GLOBAL real* a, const int a_off, const GLOBAL real* y,
                        const int y_off, const int rows, const int cols) {
    const int j = GLOBAL_ID(0);
    if (j >= cols) return;
    real sum = 0;
    int right = 1;
    for (int i = 0; i < rows; ++i) {
        const real aij = a[a_off + i * cols + j];
        const real yij = y[y_off + i * cols + j];
        sum -= yij * log_clamped(aij) + ((real)1 - yij) * log_clamped((real)1 - aij);
        right = right && ((aij > (real)0.5) == (yij > (real)0.5));
        delta[delta_off + i * cols + j] = aij - yij;
    }
    loss[loss_off + j] += sum;
    if (right) hit[hit_off + j] += (real)1;
}

/* delta <- 2 (a - y) / rows; loss += mean_i (a - y)^2; hit += argmax a == argmax y
   (rows > 1) or |a - y| < 1/2 (rows == 1) */
KERNEL void mse(GLOBAL real* delta, const int delta_off, GLOBAL real* loss, const int loss_off,
                GLOBAL real* hit, const int hit_off, const GLOBAL real* a, const int a_off,
                const GLOBAL real* y, const int y_off, const int rows, const int cols) {
    const int j = GLOBAL_ID(0);
    if (j >= cols) return;
    real sum = 0;
    int best_a = 0, best_y = 0;
    real max_a = a[a_off + j], max_y = y[y_off + j], diff0 = 0;
    for (int i = 0; i < rows; ++i) {
        const real aij = a[a_off + i * cols + j];
        const real yij = y[y_off + i * cols + j];
        if (BEATS(aij, max_a)) { max_a = aij; best_a = i; }
        if (BEATS(yij, max_y)) { max_y = yij; best_y = i; }
        const real d = aij - yij;
        if (i == 0) diff0 = d;
        sum += d * d;
        delta[delta_off + i * cols + j] = (real)2 / (real)rows * d;   /* 2 d may overflow */
    }
    loss[loss_off + j] += sum / (real)rows;
    if (rows > 1 ? best_a == best_y : fabs(diff0) < (real)0.5) hit[hit_off + j] += (real)1;
}

/* out[j] <- argmax_i a[i, j] (the first maximum, or the first NaN) */
KERNEL void argmax(GLOBAL int* out, const int out_off, const GLOBAL real* a, const int a_off,
                   const int rows, const int cols) {
    const int j = GLOBAL_ID(0);
    if (j >= cols) return;
    int best = 0;
    real best_a = a[a_off + j];
    for (int i = 1; i < rows; ++i) {
        const real aij = a[a_off + i * cols + j];
        if (BEATS(aij, best_a)) { best_a = aij; best = i; }
    }
    out[out_off + j] = best;
}
