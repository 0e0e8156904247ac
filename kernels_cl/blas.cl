/* blas.cl: BLAS-2 on row-major arrays. */
#include "prelude.h"

/* y <- alpha op(a) x + beta y, a: rows x cols. One work-item per element of y; without
   transpose each reads a row (the bias gradient: dz . ones), with it a column. */
KERNEL void gemv(GLOBAL real* y, const int y_off, const GLOBAL real* a, const int a_off,
                 const GLOBAL real* x, const int x_off, const real alpha, const real beta,
                 const int rows, const int cols, const int trans) {
    const int i = GLOBAL_ID(0);
    const int n = trans ? cols : rows;
    if (i >= n) return;
    real sum = 0;
    if (trans) {
        for (int k = 0; k < rows; ++k) sum += a[a_off + k * cols + i] * x[x_off + k];
    } else {
        for (int k = 0; k < cols; ++k) sum += a[a_off + i * cols + k] * x[x_off + k];
    }
    y[y_off + i] = alpha * sum + (beta == (real)0 ? (real)0 : beta * y[y_off + i]);
}

/* a <- alpha x y^T + a, a: rows x cols */
KERNEL void ger(GLOBAL real* a, const int a_off, const GLOBAL real* x, const int x_off,
                const GLOBAL real* y, const int y_off, const real alpha, const int rows,
                const int cols) {
    const int j = GLOBAL_ID(0);
    const int i = GLOBAL_ID(1);
    if (i < rows && j < cols) a[a_off + i * cols + j] += alpha * x[x_off + i] * y[y_off + j];
}
