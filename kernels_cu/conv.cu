/* conv.cu: convolution lowered to GEMM, pooling and dropout. Images are stored
   C x H x W x N, batch innermost (cuda-convnet's layout): element (c, h, w, n) of a
   C x H x W x N array is x[((c * H + h) * W + w) * N + n]. Every pointer is followed by
   its offset in elements. */
#include "prelude.h"

/* cols[(c k + ki) k + kj, (oh Wo + ow) N + n] <- x[c, oh s - p + ki, ow s - p + kj, n],
   zero outside the image. One work-item per element of cols. */
KERNEL void im2col(GLOBAL real* cols, const int cols_off, const GLOBAL real* x, const int x_off,
                   const int C, const int H, const int W, const int N, const int k,
                   const int stride, const int pad, const int Ho, const int Wo) {
    const int col = GLOBAL_ID(0), row = GLOBAL_ID(1);
    if (row >= C * k * k || col >= Ho * Wo * N) return;
    const int kj = row % k, ki = (row / k) % k, c = row / (k * k);
    const int n = col % N, ow = (col / N) % Wo, oh = col / (N * Wo);
    const int h = oh * stride - pad + ki, w = ow * stride - pad + kj;
    cols[cols_off + row * (Ho * Wo * N) + col] =
        (h >= 0 && h < H && w >= 0 && w < W) ? x[x_off + ((c * H + h) * W + w) * N + n] : (real)0;
}

/* x[c, h, w, n] <- sum of the cols entries im2col took from it (the adjoint of im2col).
   One work-item per element of x, gathering, so no atomics are needed. */
KERNEL void col2im(GLOBAL real* x, const int x_off, const GLOBAL real* cols, const int cols_off,
                   const int C, const int H, const int W, const int N, const int k,
                   const int stride, const int pad, const int Ho, const int Wo) {
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
            const int col = ((hs / stride) * Wo + ws / stride) * N + n;
            sum += cols[cols_off + row * (Ho * Wo * N) + col];
        }
    }
    x[x_off + e] = sum;
}

/* a[c, oh, ow, n] <- max of the pool x pool window of x at (oh s, ow s); idx keeps the
   flat index into x of the (first) maximum for the backward; a NaN in the window is
   its maximum (the first NaN), as np.max and np.argmax have it. */
KERNEL void maxpool(GLOBAL real* a, const int a_off, GLOBAL int* idx, const int idx_off,
                    const GLOBAL real* x, const int x_off, const int C, const int H,
                    const int W, const int N, const int pool, const int stride, const int Ho,
                    const int Wo) {
    const int e = GLOBAL_ID(0);
    if (e >= C * Ho * Wo * N) return;
    const int n = e % N, ow = (e / N) % Wo, oh = (e / (N * Wo)) % Ho, c = e / (N * Wo * Ho);
    int best = ((c * H + oh * stride) * W + ow * stride) * N + n;
    real best_x = x[x_off + best];
    for (int pi = 0; pi < pool; ++pi)
        for (int pj = 0; pj < pool; ++pj) {
            const int i = ((c * H + oh * stride + pi) * W + ow * stride + pj) * N + n;
            if (BEATS(x[x_off + i], best_x)) { best_x = x[x_off + i]; best = i; }
        }
    a[a_off + e] = best_x;
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
KERNEL void avgpool(GLOBAL real* a, const int a_off, const GLOBAL real* x, const int x_off,
                    const int C, const int H, const int W, const int N, const int ph,
                    const int pw, const int sh, const int sw, const int Ho, const int Wo) {
    const int e = GLOBAL_ID(0);
    if (e >= C * Ho * Wo * N) return;
    const int n = e % N, ow = (e / N) % Wo, oh = (e / (N * Wo)) % Ho, c = e / (N * Wo * Ho);
    real sum = 0;
    for (int pi = 0; pi < ph; ++pi)
        for (int pj = 0; pj < pw; ++pj)
            sum += x[x_off + ((c * H + oh * sh + pi) * W + ow * sw + pj) * N + n];
    a[a_off + e] = sum / (real)(ph * pw);
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

/* The counter-based hash behind dropout (lowbias32 by C. Wellons): the same bits on
   every device and in the NumPy reference for the same key and element. */
DEVICE unsigned int mix32(unsigned int h) {
    h ^= h >> 16; h *= 0x7feb352du;
    h ^= h >> 15; h *= 0x846ca68bu;
    h ^= h >> 16;
    return h;
}

/* out <- x . mask / (1 - rate), mask[i] = (uniform(key, i) >= rate): a product, as in the
   reference, so a dropped NaN or inf gives NaN. The key is read from the device (the host
   writes each step's before the step), so a recorded step draws a new mask at each replay.
   The backward is the same call with the gradients, and the same key. */
KERNEL void dropout(GLOBAL real* out, const int out_off, const GLOBAL real* x, const int x_off,
                    const GLOBAL int* key, const int key_off, const real rate,
                    const real scale, const int n) {
    const int i = GLOBAL_ID(0);
    if (i >= n) return;
    const unsigned int h = mix32((unsigned int)i * 0x9e3779b1u + (unsigned int)key[key_off]);
    const real u = (real)(h >> 8) * (real)(1.0f / 16777216.0f);
    out[out_off + i] = x[x_off + i] * (u >= rate ? scale : (real)0);
}
