/* elementwise.cl: fill, BLAS-1 and the activations. Arrays are row-major, activations
   (features, batch): element (i, j) of a rows x cols array is x[i * cols + j].
   Every pointer is followed by its offset in elements. */
#include "prelude.h"

KERNEL void fill(GLOBAL real* x, const int x_off, const real value, const int n) {
    const int i = GLOBAL_ID(0);
    if (i < n) x[x_off + i] = value;
}

/* y <- alpha x + y */
KERNEL void axpy(GLOBAL real* y, const int y_off, const GLOBAL real* x, const int x_off,
                 const real alpha, const int n) {
    const int i = GLOBAL_ID(0);
    if (i < n) y[y_off + i] += alpha * x[x_off + i];
}

/* w <- w + v; b <- b + vb: a layer's update, one launch for both (work-items past n_w
   take the bias) */
KERNEL void apply_update(GLOBAL real* w, const int w_off, const GLOBAL real* v, const int v_off,
                         GLOBAL real* b, const int b_off, const GLOBAL real* vb,
                         const int vb_off, const int n_w, const int n_b) {
    const int i = GLOBAL_ID(0);
    if (i < n_w) w[w_off + i] += v[v_off + i];
    else if (i < n_w + n_b) b[b_off + i - n_w] += vb[vb_off + i - n_w];
}

/* out (rows, cols) <- columns idx of x^T: out[r, j] = x[idx[j], r], x samples-first
   (N, rows). Gathers a shuffled batch from a training set kept on the device. */
KERNEL void gather_columns(GLOBAL real* out, const int out_off, const GLOBAL real* x,
                           const int x_off, const GLOBAL int* idx, const int idx_off,
                           const int rows, const int cols) {
    const int j = GLOBAL_ID(0), r = GLOBAL_ID(1);
    if (j < cols && r < rows) out[out_off + r * cols + j] = x[x_off + idx[idx_off + j] * rows + r];
}

/* out[j] <- labels[idx[j]]: the integer targets of the same batch */
KERNEL void gather_labels(GLOBAL int* out, const int out_off, const GLOBAL int* labels,
                          const int labels_off, const GLOBAL int* idx, const int idx_off,
                          const int n) {
    const int j = GLOBAL_ID(0);
    if (j < n) out[out_off + j] = labels[labels_off + idx[idx_off + j]];
}

/* x <- alpha x */
KERNEL void scal(GLOBAL real* x, const int x_off, const real alpha, const int n) {
    const int i = GLOBAL_ID(0);
    if (i < n) x[x_off + i] *= alpha;
}

/* y <- x */
KERNEL void copy(GLOBAL real* y, const int y_off, const GLOBAL real* x, const int x_off,
                 const int n) {
    const int i = GLOBAL_ID(0);
    if (i < n) y[y_off + i] = x[x_off + i];
}

/* tanh, exactly +-1 from where it rounds there (1 - tanh z under half an ulp of 1), as the
   reference's: libraries differ by an ulp there (PoCL's tanh is 1 - 2^-24 even at inf), and
   1 - tanh^2 made of that ulp a derivative of 1.2e-7 or 0, of an inf gradient inf or NaN */
#if REAL_IS_DOUBLE
#define TANH_ONE 19.061547465          /* ln(2^55 - 1) / 2 */
#else
#define TANH_ONE 9.0109134f            /* ln(2^26 - 1) / 2 */
#endif
DEVICE real tanh_rounded(const real z) {
    return fabs(z) > TANH_ONE ? copysign((real)1, z) : tanh(z);     /* NaN: tanh(NaN) */
}

DEVICE real activate(const int kind, const real z) {
    switch (kind) {
    case ACT_RELU: return z < 0 ? (real)0 : z;      /* NaN stays NaN, as in np.maximum */
    case ACT_SIGMOID: return (real)1 / ((real)1 + exp(-z));
    case ACT_TANH: return tanh_rounded(z);
    default: return z;
    }
}

/* f'(z) for the elementwise activations (softmax is only used fused with its loss) */
DEVICE real activate_grad(const int kind, const real z) {
    switch (kind) {
    case ACT_RELU: return z > 0 ? (real)1 : (real)0;
    case ACT_SIGMOID: { const real s = (real)1 / ((real)1 + exp(-z)); return s * ((real)1 - s); }
    case ACT_TANH: { const real t = tanh_rounded(z); return (real)1 - t * t; }
    default: return (real)1;
    }
}

/* z <- z + b 1^T; a <- f(z). One work-item per element; dimension 0 runs along the batch. */
KERNEL void bias_activation(GLOBAL real* a, const int a_off, GLOBAL real* z, const int z_off,
                            const GLOBAL real* b, const int b_off, const int kind,
                            const int rows, const int cols) {
    const int j = GLOBAL_ID(0);
    const int i = GLOBAL_ID(1);
    if (i < rows && j < cols) {
        const real zij = z[z_off + i * cols + j] + b[b_off + i];
        z[z_off + i * cols + j] = zij;
        a[a_off + i * cols + j] = activate(kind, zij);
    }
}

/* softmax over the features of each sample: z <- z + b 1^T; a[:, j] <- softmax(z[:, j]).
   One work-item per sample (column); outputs are few (classes). */
KERNEL void bias_softmax(GLOBAL real* a, const int a_off, GLOBAL real* z, const int z_off,
                         const GLOBAL real* b, const int b_off, const int rows, const int cols) {
    const int j = GLOBAL_ID(0);
    if (j >= cols) return;
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

/* z <- f'(z) . da: the layer's delta, in place in z */
KERNEL void activation_grad(GLOBAL real* z, const int z_off, const GLOBAL real* da,
                            const int da_off, const int kind, const int n) {
    const int i = GLOBAL_ID(0);
    if (i < n) z[z_off + i] = activate_grad(kind, z[z_off + i]) * da[da_off + i];
}
