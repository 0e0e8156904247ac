/* conv.cl: convolution by patch matrices or directly, pooling and dropout. Images are stored
   C x H x W x N, batch innermost (cuda-convnet's layout): element (c, h, w, n) of a
   C x H x W x N array is x[((c * H + h) * W + w) * N + n]. Every pointer is followed by
   its offset in elements. Built with STORED_HALF (copies.h), the images a layer stores in
   16 bits (bf16, fp16) are STORED: the forward kernels read them so (im2col, conv_direct,
   the pools, dropout) and write them so (conv_direct, the pools, dropout); gradients stay
   real. */
#include "prelude.h"
#include "copies.h"
#include "random.h"

/* Columns col0 .. col0 + ncols of the patch matrix (a chunk: the workspace holds no more):
   cols[(c k + ki) k + kj, col - col0] <- x[c, oh s - p + ki, ow s - p + kj, n] for
   col = (oh Wo + ow) N + n, zero outside the image. One work-item per element of cols. */
KERNEL void im2col(GLOBAL real* cols, const int cols_off, const GLOBAL STORED* x, const int x_off,
                   const int C, const int H, const int W, const int N, const int k,
                   const int stride, const int pad, const int Ho, const int Wo, const int col0,
                   const int ncols) {
    const int j = GLOBAL_ID(0), row = GLOBAL_ID(1);
    if (row >= C * k * k || j >= ncols) return;
    const int col = col0 + j;
    const int kj = row % k, ki = (row / k) % k, c = row / (k * k);
    const int n = col % N, ow = (col / N) % Wo, oh = col / (N * Wo);
    const int h = oh * stride - pad + ki, w = ow * stride - pad + kj;
    cols[cols_off + row * ncols + j] =
        (h >= 0 && h < H && w >= 0 && w < W) ? FROM_STORED(x[x_off + ((c * H + h) * W + w) * N + n])
                                             : (real)0;
}

/* x[c, h, w, n] <- (add ? x[c, h, w, n] : 0) + the sum of the entries of patch-matrix
   columns col0 .. col0 + ncols taken from it (the adjoint of im2col; chunks after the first
   add). One work-item per element of x, gathering, so no atomics are needed. */
KERNEL void col2im(GLOBAL real* x, const int x_off, const GLOBAL real* cols, const int cols_off,
                   const int C, const int H, const int W, const int N, const int k,
                   const int stride, const int pad, const int Ho, const int Wo, const int col0,
                   const int ncols, const int add) {
    const int e = GLOBAL_ID(0);
    if (e >= C * H * W * N) return;
    const int n = e % N, w = (e / N) % W, h = (e / (N * W)) % H, c = e / (N * W * H);
    real sum = 0;
    for (int ki = 0; ki < k; ++ki) {
        const int hs = h + pad - ki;                 /* = oh * stride */
        if (hs < 0 || hs % stride != 0 || hs / stride >= Ho) continue;
        for (int kj = 0; kj < k; ++kj) {
            const int ws = w + pad - kj;
            if (ws < 0 || ws % stride != 0 || ws / stride >= Wo) continue;
            const int row = (c * k + ki) * k + kj;
            const int col = ((hs / stride) * Wo + ws / stride) * N + n - col0;
            if (col >= 0 && col < ncols) sum += cols[cols_off + row * ncols + col];
        }
    }
    x[x_off + e] = add ? x[x_off + e] + sum : sum;
}

/* The convolution by its definition, with bias_activation fused, for few input channels
   (a first layer, C = 1: patches too short to fill a GEMM's slabs):
   z[f, oh, ow, n] <- b[f] + sum over (c, ki, kj) of w[f, (c k + ki) k + kj] x[c, oh s - p + ki,
   ow s - p + kj, n]; a <- f(z) (a may be z). One work-item per output column (oh, ow, n)
   and DIRECT_F filters, so that each pixel it reads serves DIRECT_F of them. */
#define DIRECT_F 8
KERNEL void conv_direct(GLOBAL STORED* z, const int z_off, GLOBAL STORED* a, const int a_off,
                        const GLOBAL real* RESTRICT w, const int w_off,
                        const GLOBAL real* RESTRICT b, const int b_off,
                        const GLOBAL STORED* RESTRICT x, const int x_off, const int F,
                        const int C, const int H, const int W, const int N, const int k,
                        const int stride, const int pad, const int Ho, const int Wo,
                        const int kind) {
    const int col = GLOBAL_ID(0), f0 = GLOBAL_ID(1) * DIRECT_F, P = Ho * Wo * N;
    if (col >= P) return;
    const int n = col % N, ow = (col / N) % Wo, oh = col / (N * Wo), rows = C * k * k;
    real acc[DIRECT_F];
    for (int f = 0; f < DIRECT_F; ++f) acc[f] = 0;
    for (int c = 0; c < C; ++c)
        for (int ki = 0; ki < k; ++ki) {
            const int h = oh * stride - pad + ki;
            if (h < 0 || h >= H) continue;
            for (int kj = 0; kj < k; ++kj) {
                const int wc = ow * stride - pad + kj;
                if (wc < 0 || wc >= W) continue;
                const real v = OPERAND_STORED(x[x_off + ((c * H + h) * W + wc) * N + n]);
                const int r = (c * k + ki) * k + kj;
                for (int f = 0; f < DIRECT_F; ++f)
                    if (f0 + f < F) acc[f] += OPERAND(w[w_off + (f0 + f) * rows + r]) * v;
            }
        }
    for (int f = 0; f < DIRECT_F && f0 + f < F; ++f) {
        const real zf = acc[f] + b[b_off + f0 + f];
        z[z_off + (f0 + f) * P + col] = TO_STORED(zf);
        a[a_off + (f0 + f) * P + col] = TO_STORED(activate(kind, zf));
    }
}

/* a[c, oh, ow, n] <- max of the pool x pool window of x at (oh s, ow s); idx keeps the
   flat index into x of the (first) maximum for the backward; a NaN in the window is
   its maximum (the first NaN), as np.max and np.argmax have it. */
KERNEL void maxpool(GLOBAL STORED* a, const int a_off, GLOBAL int* idx, const int idx_off,
                    const GLOBAL STORED* x, const int x_off, const int C, const int H,
                    const int W, const int N, const int pool, const int stride, const int Ho,
                    const int Wo) {
    const int e = GLOBAL_ID(0);
    if (e >= C * Ho * Wo * N) return;
    const int n = e % N, ow = (e / N) % Wo, oh = (e / (N * Wo)) % Ho, c = e / (N * Wo * Ho);
    int best = ((c * H + oh * stride) * W + ow * stride) * N + n;
    real best_x = FROM_STORED(x[x_off + best]);
    for (int pi = 0; pi < pool; ++pi)
        for (int pj = 0; pj < pool; ++pj) {
            const int i = ((c * H + oh * stride + pi) * W + ow * stride + pj) * N + n;
            const real xi = FROM_STORED(x[x_off + i]);
            if (BEATS(xi, best_x)) { best_x = xi; best = i; }
        }
    a[a_off + e] = TO_STORED(best_x);
    idx[idx_off + e] = best;
}

/* dx[c, h, w, n] <- sum of da over the windows whose maximum was (c, h, w, n). One
   work-item per element of dx, gathering from the windows that cover it. */
KERNEL void maxpool_grad(GLOBAL real* dx, const int dx_off, const GLOBAL real* da,
                         const int da_off, const GLOBAL int* idx, const int idx_off,
                         const int C, const int H, const int W, const int N, const int pool,
                         const int stride, const int Ho, const int Wo) {
    const int e = GLOBAL_ID(0);
    if (e >= C * H * W * N) return;
    const int n = e % N, w = (e / N) % W, h = (e / (N * W)) % H, c = e / (N * W * H);
    real sum = 0;
    for (int pi = 0; pi < pool; ++pi) {
        const int hs = h - pi;
        if (hs < 0 || hs % stride != 0 || hs / stride >= Ho) continue;
        for (int pj = 0; pj < pool; ++pj) {
            const int ws = w - pj;
            if (ws < 0 || ws % stride != 0 || ws / stride >= Wo) continue;
            const int o = ((c * Ho + hs / stride) * Wo + ws / stride) * N + n;
            if (idx[idx_off + o] == e) sum += da[da_off + o];
        }
    }
    dx[dx_off + e] = sum;
}

/* a[c, oh, ow, n] <- mean of the ph x pw window of x at (oh sh, ow sw) */
KERNEL void avgpool(GLOBAL STORED* a, const int a_off, const GLOBAL STORED* x, const int x_off,
                    const int C, const int H, const int W, const int N, const int ph,
                    const int pw, const int sh, const int sw, const int Ho, const int Wo) {
    const int e = GLOBAL_ID(0);
    if (e >= C * Ho * Wo * N) return;
    const int n = e % N, ow = (e / N) % Wo, oh = (e / (N * Wo)) % Ho, c = e / (N * Wo * Ho);
    real sum = 0;
    for (int pi = 0; pi < ph; ++pi)
        for (int pj = 0; pj < pw; ++pj)
            sum += FROM_STORED(x[x_off + ((c * H + oh * sh + pi) * W + ow * sw + pj) * N + n]);
    a[a_off + e] = TO_STORED(sum / (real)(ph * pw));
}

/* dx[c, h, w, n] <- sum of da / (ph pw) over the windows that hold (h, w), the adjoint of
   avgpool: rows oh from ceil((h - ph + 1) / sh) to h / sh, within 0 .. Ho - 1, and columns
   alike (none for a pixel in no window). One work-item per element of dx, gathering, so
   no atomics are needed; oh and ow run down, which adds in the reference's order. */
KERNEL void avgpool_grad(GLOBAL real* dx, const int dx_off, const GLOBAL real* da,
                         const int da_off, const int C, const int H, const int W, const int N,
                         const int ph, const int pw, const int sh, const int sw, const int Ho,
                         const int Wo) {
    const int e = GLOBAL_ID(0);
    if (e >= C * H * W * N) return;
    const int n = e % N, w = (e / N) % W, h = (e / (N * W)) % H, c = e / (N * W * H);
    const int oh_first = h < ph ? 0 : (h - ph) / sh + 1, oh_last = min(h / sh, Ho - 1);
    const int ow_first = w < pw ? 0 : (w - pw) / sw + 1, ow_last = min(w / sw, Wo - 1);
    real sum = 0;
    for (int oh = oh_last; oh >= oh_first; --oh)
        for (int ow = ow_last; ow >= ow_first; --ow)
            sum += da[da_off + ((c * Ho + oh) * Wo + ow) * N + n];
    dx[dx_off + e] = sum / (real)(ph * pw);
}

/* out <- x . mask / (1 - rate), mask[i] = (uniform(key, i) >= rate): a product, as in the
   reference, so a dropped NaN or inf gives NaN. The key is read from the device (the host
   writes each step's before the step), so a recorded step draws a new mask at each replay.
   The backward is the same call with the gradients, and the same key. */
KERNEL void dropout(GLOBAL STORED* out, const int out_off, const GLOBAL STORED* x, const int x_off,
                    const GLOBAL int* key, const int key_off, const real rate,
                    const real scale, const int n) {
    const int i = GLOBAL_ID(0);
    if (i >= n) return;
    out[out_off + i] = TO_STORED(FROM_STORED(x[x_off + i])
                                 * kept((unsigned int)key[key_off], (unsigned int)i, rate, scale));
}
