/* elementwise.cl: fill, BLAS-1, the activations and the optimizers' updates. Arrays are
   row-major, activations (features, batch): element (i, j) of a rows x cols array is
   x[i * cols + j]. Every pointer is followed by its offset in elements. */
#include "prelude.h"
#include "copies.h"

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

/* out (rows, cols) <- columns idx of x^T: out[r, j] = x[idx[j], r], x samples-first
   (N, rows). Gathers a shuffled batch from a training set kept on the device. */
KERNEL void gather_columns(GLOBAL STORED* out, const int out_off, const GLOBAL real* x,
                           const int x_off, const GLOBAL int* idx, const int idx_off,
                           const int rows, const int cols) {
    const int j = GLOBAL_ID(0), r = GLOBAL_ID(1);
    if (j < cols && r < rows)
        out[out_off + r * cols + j] = TO_STORED(x[x_off + idx[idx_off + j] * rows + r]);
}

/* out (rows, ld), columns col0 .. col0 + cols <- x^T, x samples-first (cols, rows): a
   batch sent as the host holds it, laid out on the device. Where check, the least index
   (first + col0 + j) of a sample holding NaN or inf goes into *bad, which the caller set
   high and reads when it waits anyway. Dimension 0 runs along a sample's features
   (reads in runs), 1 along the samples (writes in runs of the group's 8). */
KERNEL void features_first(GLOBAL STORED* out, const int out_off, const GLOBAL real* x,
                           const int x_off, GLOBAL int* bad, const int bad_off,
                           const int check, const int first, const int rows, const int cols,
                           const int ld, const int col0) {
    const int r = GLOBAL_ID(0), j = GLOBAL_ID(1);
    if (r < rows && j < cols) {
        const real v = x[x_off + j * rows + r];
        out[out_off + r * ld + col0 + j] = TO_STORED(v);
        if (check && !isfinite(v)) ATOMIC_MIN(bad + bad_off, first + col0 + j);
    }
}

/* out (cols, rows) <- x^T, x (rows, cols): through a TILE x TILE tile in local memory, so
   that the reads and the writes both run along rows (a column-wise write of 400 MB took
   three times a copy's time on an H100). Work-group (TILE, TILE_ROWS): dimension 0 runs
   along x's columns, 1 along its rows, each work-item taking TILE / TILE_ROWS rows of a
   tile; the groups of dimension 1 stride over the row tiles (CUDA allows 65535 of them). */
#define TILE 32
#define TILE_ROWS 8
KERNEL GROUP_SIZE(TILE, TILE_ROWS, 1, 1)
void transpose(GLOBAL real* out, const int out_off, const GLOBAL real* x, const int x_off,
               const int rows, const int cols) {
    LOCAL real tile[TILE][TILE + 1];            /* + 1: a column's reads hit every bank */
    const int tx = LOCAL_ID(0), ty = LOCAL_ID(1), c0 = GROUP_ID(0) * TILE;
    for (int r0 = GROUP_ID(1) * TILE; r0 < rows; r0 += NUM_GROUPS(1) * TILE) {
        for (int i = ty; i < TILE; i += TILE_ROWS)
            if (r0 + i < rows && c0 + tx < cols)
                tile[i][tx] = x[x_off + (r0 + i) * cols + c0 + tx];
        BARRIER();
        for (int i = ty; i < TILE; i += TILE_ROWS)     /* out's row c0 + i, column r0 + tx */
            if (c0 + i < cols && r0 + tx < rows)
                out[out_off + (c0 + i) * rows + r0 + tx] = tile[tx][i];
        BARRIER();                                      /* the tile is read before the next */
    }
}

/* out[j] <- labels[idx[j]]: the integer targets of the same batch */
KERNEL void gather_labels(GLOBAL int* out, const int out_off, const GLOBAL int* labels,
                          const int labels_off, const GLOBAL int* idx, const int idx_off,
                          const int n) {
    const int j = GLOBAL_ID(0);
    if (j < n) out[out_off + j] = labels[labels_off + idx[idx_off + j]];
}

/* gather_columns and gather_labels by the same indices in one launch: a training batch's
   inputs out (rows, cols) and its integer targets out_labels (cols,), the work-items of
   row 0 taking the labels */
KERNEL void gather_batch(GLOBAL STORED* out, const int out_off, const GLOBAL real* x,
                         const int x_off, GLOBAL int* out_labels, const int out_labels_off,
                         const GLOBAL int* labels, const int labels_off, const GLOBAL int* idx,
                         const int idx_off, const int rows, const int cols) {
    const int j = GLOBAL_ID(0), r = GLOBAL_ID(1);
    if (j >= cols || r >= rows) return;
    const int sample = idx[idx_off + j];
    out[out_off + r * cols + j] = TO_STORED(x[x_off + sample * rows + r]);
    if (r == 0) out_labels[out_labels_off + j] = labels[labels_off + sample];
}

/* x <- alpha x */
KERNEL void scal(GLOBAL real* x, const int x_off, const real alpha, const int n) {
    const int i = GLOBAL_ID(0);
    if (i < n) x[x_off + i] *= alpha;
}

/* y <- x (built with STORED_HALF: 16-bit storage as it is) */
KERNEL void copy(GLOBAL STORED* y, const int y_off, const GLOBAL STORED* x, const int x_off,
                 const int n) {
    const int i = GLOBAL_ID(0);
    if (i < n) y[y_off + i] = x[x_off + i];
}

/* y <- x byte for byte, whatever they hold (offsets and n in bytes): on the Oclgrind
   simulator, a host write into part of a buffer from the scratch buffer it was written to
   whole (runtime/opencl.py's _write_part says why) */
KERNEL void copy_bytes(GLOBAL unsigned char* y, const int y_off,
                       const GLOBAL unsigned char* x, const int x_off, const int n) {
    const int i = GLOBAL_ID(0);
    if (i < n) y[y_off + i] = x[x_off + i];
}

#if HALF_OPERANDS
/* y <- x as a bf16 or fp16 backend's vendor GEMM takes its inputs: 16 bits each
   (prelude.h's half_bits, which rounds as our own kernels' OPERAND rounds). Work-item i
   writes elements 2i and 2i + 1 as one 32-bit word (the first the low half: little-endian
   devices), so y_off is even; for an odd n the last word's high half, past y, is 0 (the
   caller leaves room for it). */
KERNEL void half_operands(GLOBAL unsigned short* y, const int y_off, const GLOBAL real* x,
                          const int x_off, const int n) {
    const int i = GLOBAL_ID(0), j = 2 * i;
    if (j >= n) return;
    const unsigned int low = half_bits(x[x_off + j]);
    const unsigned int high = j + 1 < n ? half_bits(x[x_off + j + 1]) : 0u;
    ((GLOBAL unsigned int*)(y + y_off))[i] = low | (high << 16);
}
#endif

/* A work-item of bias_activation and momentum_updates takes STEPS elements, a part of the
   array apart, and issues their loads before any store: one element a work-item kept too
   few loads in flight to fill an H100's memory bandwidth (they ran at 1.8-2.1 TB/s of about
   3). The host sizes their launches with the same number (arrays.py's STEPS). */
#define STEPS 4

/* z <- z + b 1^T; a <- f(z), and where shadow is set h <- a's 16-bit copy (STORE_HALF).
   Dimension 0 runs along the batch; work-item (j, i) takes rows i, i + g, ...,
   i + (STEPS - 1) g of column j, where g = ceil(rows / STEPS). */
KERNEL void bias_activation(GLOBAL real* a, const int a_off, GLOBAL real* z, const int z_off,
                            const GLOBAL real* b, const int b_off,
                            GLOBAL unsigned short* h, const int h_off, const int shadow,
                            const int kind, const int rows, const int cols) {
    const int j = GLOBAL_ID(0);
    const int g = (rows + STEPS - 1) / STEPS;
    if (j >= cols || GLOBAL_ID(1) >= g) return;
    real zs[STEPS];
    for (int s = 0, i = GLOBAL_ID(1); s < STEPS; s++, i += g)
        if (i < rows) zs[s] = z[z_off + i * cols + j] + b[b_off + i];
    for (int s = 0, i = GLOBAL_ID(1); s < STEPS; s++, i += g)
        if (i < rows) {
            const real ai = activate(kind, zs[s]);
            z[z_off + i * cols + j] = zs[s];
            a[a_off + i * cols + j] = ai;
            STORE_HALF(h, h_off + i * cols + j, ai, shadow);
        }
}

/* bias_activation where the layer stores z and a in 16 bits (built with STORED_HALF): zs <- z + b 1^T, a <- f(z + b),
   each rounded as it is stored; z is the product's float32 sum, which only this reads */
KERNEL void bias_activation_stored(GLOBAL STORED* a, const int a_off, GLOBAL STORED* zs,
                                   const int zs_off, const GLOBAL real* z, const int z_off,
                                   const GLOBAL real* b, const int b_off, const int kind,
                                   const int rows, const int cols) {
    const int j = GLOBAL_ID(0);
    const int g = (rows + STEPS - 1) / STEPS;
    if (j >= cols || GLOBAL_ID(1) >= g) return;
    real v[STEPS];
    for (int s = 0, i = GLOBAL_ID(1); s < STEPS; s++, i += g)
        if (i < rows) v[s] = z[z_off + i * cols + j] + b[b_off + i];
    for (int s = 0, i = GLOBAL_ID(1); s < STEPS; s++, i += g)
        if (i < rows) {
            zs[zs_off + i * cols + j] = TO_STORED(v[s]);
            a[a_off + i * cols + j] = TO_STORED(activate(kind, v[s]));
        }
}

/* z <- z + x; a <- f(z), elementwise: a residual block's sum and its activation (built with
   STORED_HALF, all three 16-bit: z and a each rounded from the float32 sum) */
KERNEL void add_activation(GLOBAL STORED* a, const int a_off, GLOBAL STORED* z, const int z_off,
                           const GLOBAL STORED* x, const int x_off, const int kind, const int n) {
    const int i = GLOBAL_ID(0);
    if (i < n) {
        const real zi = FROM_STORED(z[z_off + i]) + FROM_STORED(x[x_off + i]);
        z[z_off + i] = TO_STORED(zi);
        a[a_off + i] = TO_STORED(activate(kind, zi));
    }
}

/* delta <- f'(z) . da, out of z's place: z may be 16-bit (built with STORED_HALF), the delta
   float32 where a BatchNorm or a Residual block stores its z in 16 bits; delta may be da */
KERNEL void activation_delta(GLOBAL real* delta, const int delta_off, const GLOBAL STORED* z,
                             const int z_off, const GLOBAL real* da, const int da_off,
                             const int kind, const int n) {
    const int i = GLOBAL_ID(0);
    if (i < n) delta[delta_off + i] = activate_grad(kind, FROM_STORED(z[z_off + i])) * da[da_off + i];
}

/* z <- f'(z) . da: the layer's delta, in place in z; where shadow is set, h <- its 16-bit
   copy (STORE_HALF) */
KERNEL void activation_grad(GLOBAL real* z, const int z_off, const GLOBAL real* da,
                            const int da_off, GLOBAL unsigned short* h, const int h_off,
                            const int shadow, const int kind, const int n) {
    const int i = GLOBAL_ID(0);
    if (i < n) {
        const real d = activate_grad(kind, z[z_off + i]) * da[da_off + i];
        z[z_off + i] = d;
        STORE_HALF(h, h_off + i, d, shadow);
    }
}

/* The optimizers' updates of a layer's flat parameter vector w (n): its first n_decay
   elements are weights, which weight decay applies to, the rest (biases) are not decayed.
   g, the gradient, is only read. Each is torch.optim's step, in the order of operations of
   the reference (ops/optim.py). A decay of 0 is no term at all, as in PyTorch (0 w would make
   an infinite weight's gradient NaN). Complements of averaging rates (1 - beta) come
   formed in double by the host, as PyTorch forms them: 1 - 0.999 in float32 is 1.3e-5
   off. */

/* A loss-scaled step (portanet/optim.py, LossScale) runs its updates only where its
   gradients were all finite: each update kernel takes skip, a device int the step's
   unscale_check set to -1 where they were not, and then changes nothing. Unscaled steps
   pass one that stays 0. */

/* SGD with momentum, after the layer's gemm wrote mu v - lr g into v: v <- v - decay w
   (weights; decay = lr weight_decay); w <- w + v. For elements i, i + g, ..., i + (STEPS -
   1) g of a layer's n (v is written only where it changes). */
DEVICE void momentum_steps(GLOBAL real* w, GLOBAL real* v, const int i, const int g,
                           const int n, const real decay, const int n_decay) {
    real vs[STEPS], ws[STEPS];
    for (int s = 0, e = i; s < STEPS; s++, e += g)
        if (e < n) { vs[s] = v[e]; ws[s] = w[e]; }
    for (int s = 0, e = i; s < STEPS; s++, e += g)
        if (e < n) {
            if (e < n_decay && decay != 0) { vs[s] -= decay * ws[s]; v[e] = vs[s]; }
            w[e] = ws[s] + vs[s];
        }
}

/* momentum_steps of one layer, an element a work-item: how CPUs update (gpu.py's
   fused_updates). On half a million elements Intel's CPU runtime took 0.37-13.6 ms for
   momentum_updates, by which buffers it was given, and 61-63 us for this; PoCL 0.91-1.77
   ms and 0.37-0.79 (docs/optimizers.md). */
KERNEL void momentum_update(const GLOBAL int* skip, const int skip_off, const real decay,
                            GLOBAL real* w, const int w_off, GLOBAL real* v, const int v_off,
                            const int n, const int n_decay) {
    const int i = GLOBAL_ID(0);
    if (i >= n || skip[skip_off]) return;
    real vi = v[v_off + i];
    const real wi = w[w_off + i];
    if (i < n_decay && decay != 0) { vi -= decay * wi; v[v_off + i] = vi; }
    w[w_off + i] = wi + vi;
}

/* momentum_steps over the flat vectors of up to four layers in one launch (a launch costs
   NVIDIA's OpenCL 6-8 us of host time): layer p's w_p and v_p of n_p elements, the first
   d_p of them decayed, take ceil(n_p / STEPS) work-items, counting from layer 0. A layer
   not given has n_p = 0. */
KERNEL void momentum_updates(const GLOBAL int* skip, const int skip_off, const real decay,
                             GLOBAL real* w0, const int w0_off, GLOBAL real* v0, const int v0_off,
                             const int n0, const int d0,
                             GLOBAL real* w1, const int w1_off, GLOBAL real* v1, const int v1_off,
                             const int n1, const int d1,
                             GLOBAL real* w2, const int w2_off, GLOBAL real* v2, const int v2_off,
                             const int n2, const int d2,
                             GLOBAL real* w3, const int w3_off, GLOBAL real* v3, const int v3_off,
                             const int n3, const int d3) {
    const int g0 = (n0 + STEPS - 1) / STEPS, g1 = (n1 + STEPS - 1) / STEPS;
    const int g2 = (n2 + STEPS - 1) / STEPS, g3 = (n3 + STEPS - 1) / STEPS;
    int i = GLOBAL_ID(0);
    if (skip[skip_off]) return;
    if (i < g0) { momentum_steps(w0 + w0_off, v0 + v0_off, i, g0, n0, decay, d0); return; }
    i -= g0;
    if (i < g1) { momentum_steps(w1 + w1_off, v1 + v1_off, i, g1, n1, decay, d1); return; }
    i -= g1;
    if (i < g2) { momentum_steps(w2 + w2_off, v2 + v2_off, i, g2, n2, decay, d2); return; }
    i -= g2;
    if (i < g3) momentum_steps(w3 + w3_off, v3 + v3_off, i, g3, n3, decay, d3);
}

/* SGD with the gradient g given (momentum > 0; v = -lr times PyTorch's buffer):
   d = g + weight_decay w (weights), v <- momentum v - lr d; then with Nesterov momentum
   w <- w + momentum v - lr d with the new v, else w <- w + v */
KERNEL void sgd_update(const GLOBAL int* skip, const int skip_off, GLOBAL real* w,
                       const int w_off, GLOBAL real* v, const int v_off, const GLOBAL real* g,
                       const int g_off, const real lr, const real momentum,
                       const real weight_decay, const int nesterov, const int n_decay,
                       const int n) {
    const int i = GLOBAL_ID(0);
    if (i >= n || skip[skip_off]) return;
    const real wi = w[w_off + i];
    const real d = i < n_decay && weight_decay != 0 ? g[g_off + i] + weight_decay * wi
                                                    : g[g_off + i];
    const real vi = momentum * v[v_off + i] - lr * d;
    v[v_off + i] = vi;
    w[w_off + i] = wi + (nesterov ? momentum * vi - lr * d : vi);
}

/* Adam and AdamW: on weights d = g + l2 w (Adam's L2) and w <- s[2] w (AdamW's decoupled
   decay, s[2] = 1 - lr wd), else d = g; m <- beta1 m + (1 - beta1) d;
   v <- beta2 v + (1 - beta2) d^2; w <- w - s[0] m / (sqrt(v) / s[1] + eps), where the host
   writes s = [lr / (1 - beta1^t), sqrt(1 - beta2^t), 1 - lr wd, lr] on the device each
   step t (a recorded step reads them there, so its rate may move every step);
   rest1 = 1 - beta1, rest2 = 1 - beta2 */
KERNEL void adam_update(const GLOBAL int* skip, const int skip_off, GLOBAL real* w,
                        const int w_off, GLOBAL real* m, const int m_off, GLOBAL real* v,
                        const int v_off, const GLOBAL real* g, const int g_off,
                        const GLOBAL real* s, const int s_off, const real beta1,
                        const real rest1, const real beta2, const real rest2, const real eps,
                        const real l2, const int n_decay, const int n) {
    const int i = GLOBAL_ID(0);
    if (i >= n || skip[skip_off]) return;
    real wi = w[w_off + i], d = g[g_off + i];
    if (i < n_decay) {
        if (l2 != 0) d += l2 * wi;
        wi *= s[s_off + 2];
    }
    const real mi = beta1 * m[m_off + i] + rest1 * d;
    const real vi = beta2 * v[v_off + i] + rest2 * (d * d);
    m[m_off + i] = mi;
    v[v_off + i] = vi;
    w[w_off + i] = wi - s[s_off] * (mi / (sqrt(vi) / s[s_off + 1] + eps));
}

/* RMSprop: d = g + l2 w (weights); v <- alpha v + (1 - alpha) d^2; centered: gavg <- alpha
   gavg + (1 - alpha) d, den = sqrt(v - gavg^2) + eps, else den = sqrt(v) + eps; with
   momentum: buf <- momentum buf + d / den, w <- w - lr buf, else w <- w - lr d / den.
   rest = 1 - alpha. buf and gavg are read only where their flags say they exist. */
KERNEL void rmsprop_update(const GLOBAL int* skip, const int skip_off, GLOBAL real* w,
                           const int w_off, GLOBAL real* v, const int v_off, GLOBAL real* buf,
                           const int buf_off, GLOBAL real* gavg,
                           const int gavg_off, const GLOBAL real* g, const int g_off,
                           const real lr, const real alpha, const real rest, const real eps,
                           const real l2, const real momentum, const int has_buf,
                           const int centered, const int n_decay, const int n) {
    const int i = GLOBAL_ID(0);
    if (i >= n || skip[skip_off]) return;
    const real wi = w[w_off + i];
    const real d = i < n_decay && l2 != 0 ? g[g_off + i] + l2 * wi : g[g_off + i];
    const real vi = alpha * v[v_off + i] + rest * (d * d);
    v[v_off + i] = vi;
    real den;
    if (centered) {
        const real ai = alpha * gavg[gavg_off + i] + rest * d;
        gavg[gavg_off + i] = ai;
        den = sqrt(vi - ai * ai) + eps;
    } else {
        den = sqrt(vi) + eps;
    }
    if (has_buf) {
        const real bi = momentum * buf[buf_off + i] + d / den;
        buf[buf_off + i] = bi;
        w[w_off + i] = wi - lr * bi;
    } else {
        w[w_off + i] = wi - lr * (d / den);
    }
}

/* Dynamic loss scaling (portanet/optim.py, LossScale). The device keeps the scale:
   s = [scale, 1 / scale, clean steps in a row, steps skipped], powers of two and counts,
   so a recorded step reads it there and the host never waits for it. */

/* x <- s[0] x: the loss's delta times the scale */
KERNEL void scale_by(GLOBAL real* x, const int x_off, const GLOBAL real* s, const int s_off,
                     const int n) {
    const int i = GLOBAL_ID(0);
    if (i < n) x[x_off + i] *= s[s_off];
}

/* g <- g / s[0] (times the power of two 1 / s[0]: exact), and found[0] <- -1 where a
   result is inf or NaN (ATOMIC_MIN: atomic writes, no race; only a step that overflows
   makes them) */
KERNEL void unscale_check(GLOBAL real* g, const int g_off, const GLOBAL real* s,
                          const int s_off, GLOBAL int* found, const int found_off,
                          const int n) {
    const int i = GLOBAL_ID(0);
    if (i >= n) return;
    const real gi = g[g_off + i] * s[s_off + 1];
    g[g_off + i] = gi;
    if (!isfinite(gi)) ATOMIC_MIN(found + found_off, -1);
}

/* g <- g min(1, max_norm / (sqrt(squares[0]) inv_unit + 1e-6)): global-norm clipping of
   the gradient g holds times a unit of 1 / inv_unit, after gemv made squares[0] = g . g
   (torch.nn.utils.clip_grad_norm_'s factor, 1e-6 its guard) */
KERNEL void clip_scale(GLOBAL real* g, const int g_off, const GLOBAL real* squares,
                       const int squares_off, const real max_norm, const real inv_unit,
                       const int n) {
    const int i = GLOBAL_ID(0);
    const real coef = max_norm / (sqrt(squares[squares_off]) * inv_unit + (real)1e-6);
    if (i < n && coef < 1) g[g_off + i] *= coef;
}

/* Adam's numbers of a loss-scaled step, which the device counts (a skipped step is not a
   step, as in PyTorch): where found[0] is 0, t[0] <- t[0] + 1 and s[0], s[1] <- lr / (1 -
   beta1^t), sqrt(1 - beta2^t), each 1 - beta^t as -expm1(t log beta) (log_beta1,
   log_beta2 come from the host in double: no cancellation), lr = s[3] (the host writes the
   step's rate there); else nothing. One work-item, before the updates. */
KERNEL void adam_scalars(GLOBAL real* s, const int s_off, GLOBAL real* t, const int t_off,
                         const GLOBAL int* found, const int found_off,
                         const real log_beta1, const real log_beta2) {
    if (GLOBAL_ID(0) != 0 || found[found_off] != 0) return;
    const real lr = s[s_off + 3];
    const real step = t[t_off] + 1;
    t[t_off] = step;
    s[s_off] = lr / -expm1(step * log_beta1);
    s[s_off + 1] = sqrt(-expm1(step * log_beta2));
}

/* after a step's updates, one work-item: a step that found inf or NaN halves the scale
   (not below low) and counts as skipped; growth_interval clean steps in a row double it
   (not above high). found goes back to 0 for the next step. */
KERNEL void update_loss_scale(GLOBAL real* s, const int s_off, GLOBAL int* found,
                              const int found_off, const int growth_interval, const real low,
                              const real high) {
    if (GLOBAL_ID(0) != 0) return;
    GLOBAL real* t = s + s_off;
    if (found[found_off] != 0) {
        found[found_off] = 0;
        t[2] = 0;
        t[3] += 1;
        if (t[0] > low) {
            t[0] *= (real)0.5;
            t[1] *= 2;
        }
    } else {
        t[2] += 1;
        if (t[2] >= growth_interval) {
            t[2] = 0;
            if (t[0] < high) {
                t[0] *= 2;
                t[1] *= (real)0.5;
            }
        }
    }
}
