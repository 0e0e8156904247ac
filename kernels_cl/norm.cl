/* norm.cl: batch and layer normalization. x is viewed as (rows, n), row-major: a row per
   feature of a Dense layer's (features, batch) activations, or per channel of (C, H, W, N)
   images (n = H W N). Batch normalization's statistics are per row (layer
   normalization's, at the end, per column); mean, inv_std, gamma, beta, running_mean,
   running_var, dgamma and dbeta hold one value per row. Every pointer is followed by its
   offset in elements. Built with STORED_HALF (copies.h), x, z and a are a layer's 16-bit
   storage (bf16, fp16): read as their values, written rounded; the statistics, the
   parameters and the gradients dz and dx stay real. */
#include "prelude.h"
#include "groups.h"
#include "copies.h"

/* How a row's work is shared (phase): one group of GROUP_THREADS per row does all of it
   (BN_WHOLE, parts = 1), or, where the rows alone leave the device idle (a conv layer's
   channels over H.W.N columns), `parts` groups per row each take a piece of its columns in
   successive launches: the sums of their pieces into ws (BN_SUMS, for the forward then
   BN_SQUARES), then the outputs of their pieces (BN_APPLY) from the row's total, which
   every group adds up from ws in the same order. ws holds 2 rows parts reals: the first
   per-piece sums of each row, then the second. */
#define BN_WHOLE 0
#define BN_SUMS 1
#define BN_SQUARES 2
#define BN_APPLY 3

/* the sum of a row's parts, in order */
DEVICE real parts_total(const GLOBAL real* v, const int parts) {
    real total = 0;
    for (int i = 0; i < parts; i++) total += v[i];
    return total;
}

/* Per row r, over its n values:
     mean = sum(x) / n;  var = sum((x - mean)^2) / n   (two passes: E[x^2] - E[x]^2
     cancels catastrophically where the mean is large against the spread)
     inv_std = 1 / sqrt(var + eps);  z <- gamma (x - mean) inv_std + beta;  a <- f(z)
     running_mean <- (1 - momentum) running_mean + momentum mean
     running_var <- (1 - momentum) running_var + momentum var n / (n - 1)   (var if n = 1)
   Groups (GROUP_THREADS, 1): dimension 0 the rows, 1 the parts. Each work-item reads and
   writes the same elements in every pass, so z may be x. */
KERNEL void batchnorm_train(GLOBAL STORED* z, const int z_off, GLOBAL STORED* a, const int a_off,
                            GLOBAL real* mean, const int mean_off, GLOBAL real* inv_std,
                            const int inv_std_off, GLOBAL real* running_mean, const int rm_off,
                            GLOBAL real* running_var, const int rv_off, const GLOBAL STORED* x,
                            const int x_off, const GLOBAL real* gamma, const int gamma_off,
                            const GLOBAL real* beta, const int beta_off, const int kind,
                            const real eps, const real momentum, const int rows, const int n,
                            GLOBAL real* ws, const int ws_off, const int parts,
                            const int phase) {
    LOCAL real partial[GROUP_THREADS];
    const int r = GROUP_ID(0), p = GROUP_ID(1), t = LOCAL_ID(0), row = r * n;
    const int chunk = (n + parts - 1) / parts, k0 = p * chunk, k1 = min(n, k0 + chunk);
    GLOBAL real* sums = ws + ws_off + r * parts;
    GLOBAL real* squares = ws + ws_off + (rows + r) * parts;
    real m, var;
    if (phase == BN_WHOLE || phase == BN_SUMS) {
        real sum = 0;
        for (int k = k0 + t; k < k1; k += GROUP_THREADS) sum += FROM_STORED(x[x_off + row + k]);
        sum = group_sum(partial, sum);
        if (phase == BN_SUMS) {
            if (t == 0) sums[p] = sum;
            return;
        }
        m = sum / (real)n;
    } else {
        m = parts_total(sums, parts) / (real)n;
    }
    if (phase == BN_WHOLE || phase == BN_SQUARES) {
        real sq = 0;
        for (int k = k0 + t; k < k1; k += GROUP_THREADS) {
            const real d = FROM_STORED(x[x_off + row + k]) - m;
            sq += d * d;
        }
        sq = group_sum(partial, sq);
        if (phase == BN_SQUARES) {
            if (t == 0) squares[p] = sq;
            return;
        }
        var = sq / (real)n;
    } else {
        var = parts_total(squares, parts) / (real)n;
    }
    const real s = (real)1 / sqrt(var + eps);
    if (p == 0 && t == 0) {
        const real unbiased = n > 1 ? var * (real)n / (real)(n - 1) : var;
        mean[mean_off + r] = m;
        inv_std[inv_std_off + r] = s;
        running_mean[rm_off + r] = ((real)1 - momentum) * running_mean[rm_off + r] + momentum * m;
        running_var[rv_off + r] = ((real)1 - momentum) * running_var[rv_off + r]
                                  + momentum * unbiased;
    }
    const real g = gamma[gamma_off + r] * s, b = beta[beta_off + r];
    for (int k = k0 + t; k < k1; k += GROUP_THREADS) {
        const real zk = g * (FROM_STORED(x[x_off + row + k]) - m) + b;
        z[z_off + row + k] = TO_STORED(zk);
        a[a_off + row + k] = TO_STORED(activate(kind, zk));
    }
}

/* z <- gamma (x - running_mean) / sqrt(running_var + eps) + beta; a <- f(z). One work-item
   per element; dimension 0 runs along the row. */
KERNEL void batchnorm_infer(GLOBAL STORED* z, const int z_off, GLOBAL STORED* a, const int a_off,
                            const GLOBAL STORED* x, const int x_off, const GLOBAL real* gamma,
                            const int gamma_off, const GLOBAL real* beta, const int beta_off,
                            const GLOBAL real* running_mean, const int rm_off,
                            const GLOBAL real* running_var, const int rv_off, const int kind,
                            const real eps, const int rows, const int n) {
    const int j = GLOBAL_ID(0), r = GLOBAL_ID(1);
    if (r < rows && j < n) {
        const real s = (real)1 / sqrt(running_var[rv_off + r] + eps);
        const real zk = gamma[gamma_off + r] * s
                        * (FROM_STORED(x[x_off + r * n + j]) - running_mean[rm_off + r])
                        + beta[beta_off + r];
        z[z_off + r * n + j] = TO_STORED(zk);
        a[a_off + r * n + j] = TO_STORED(activate(kind, zk));
    }
}

/* delta <- f'(z) . da, z = gamma inv_std (x - mean) + beta made again from the input and
   the batch's statistics (BatchNorm keeps its output, not z): one work-item per element,
   dimension 0 along the row. x may be 16-bit (STORED), da and delta are real; delta may be
   da. */
KERNEL void batchnorm_delta(GLOBAL real* delta, const int delta_off, const GLOBAL real* da,
                            const int da_off, const GLOBAL STORED* x, const int x_off,
                            const GLOBAL real* gamma, const int gamma_off,
                            const GLOBAL real* beta, const int beta_off,
                            const GLOBAL real* mean, const int mean_off,
                            const GLOBAL real* inv_std, const int inv_std_off, const int kind,
                            const int rows, const int n) {
    const int j = GLOBAL_ID(0), r = GLOBAL_ID(1);
    if (r < rows && j < n) {
        const int i = r * n + j;
        const real zk = gamma[gamma_off + r] * inv_std[inv_std_off + r]
                        * (FROM_STORED(x[x_off + i]) - mean[mean_off + r]) + beta[beta_off + r];
        delta[delta_off + i] = activate_grad(kind, zk) * da[da_off + i];
    }
}

/* Per row, with xhat = (x - mean) inv_std:
     dbeta <- alpha sum(dz) + beta dbeta;  dgamma <- alpha sum(dz xhat) + beta dgamma
     (beta = 0: the old values are not read) and, where has_dx,
     dx <- gamma inv_std (dz - sum(dz) / n - xhat sum(dz xhat) / n).
   Groups (GROUP_THREADS, 1) as batchnorm_train's: BN_WHOLE, or BN_SUMS (the sums of dz
   and dz xhat over each piece) then BN_APPLY. dx may be x (where x is real: the layer's
   input overwritten by its gradient) or dz: each element of dx is written by the
   work-item that read it, after its last read. Without dx, pass any real array as dx and
   has_dx = 0. */
KERNEL void batchnorm_grad(GLOBAL real* dx, const int dx_off, GLOBAL real* dgamma,
                           const int dgamma_off, GLOBAL real* dbeta, const int dbeta_off,
                           const GLOBAL real* dz, const int dz_off, const GLOBAL STORED* x,
                           const int x_off, const GLOBAL real* gamma, const int gamma_off,
                           const GLOBAL real* mean, const int mean_off,
                           const GLOBAL real* inv_std, const int inv_std_off, const real alpha,
                           const real beta, const int has_dx, const int rows, const int n,
                           GLOBAL real* ws, const int ws_off, const int parts,
                           const int phase) {
    LOCAL real partial[GROUP_THREADS];
    const int r = GROUP_ID(0), p = GROUP_ID(1), t = LOCAL_ID(0), row = r * n;
    const int chunk = (n + parts - 1) / parts, k0 = p * chunk, k1 = min(n, k0 + chunk);
    GLOBAL real* sums = ws + ws_off + r * parts;
    GLOBAL real* dots = ws + ws_off + (rows + r) * parts;
    const real m = mean[mean_off + r], s = inv_std[inv_std_off + r];
    real sum_dz, sum_dz_xhat;
    if (phase == BN_WHOLE || phase == BN_SUMS) {
        real sum = 0, dot = 0;
        for (int k = k0 + t; k < k1; k += GROUP_THREADS) {
            const real d = dz[dz_off + row + k];
            sum += d;
            dot += d * ((FROM_STORED(x[x_off + row + k]) - m) * s);
        }
        sum_dz = group_sum(partial, sum);
        sum_dz_xhat = group_sum(partial, dot);
        if (phase == BN_SUMS) {
            if (t == 0) {
                sums[p] = sum_dz;
                dots[p] = sum_dz_xhat;
            }
            return;
        }
    } else {
        sum_dz = parts_total(sums, parts);
        sum_dz_xhat = parts_total(dots, parts);
    }
    if (p == 0 && t == 0) {
        dbeta[dbeta_off + r] = alpha * sum_dz
                               + (beta == (real)0 ? (real)0 : beta * dbeta[dbeta_off + r]);
        dgamma[dgamma_off + r] = alpha * sum_dz_xhat
                                 + (beta == (real)0 ? (real)0 : beta * dgamma[dgamma_off + r]);
    }
    if (!has_dx) return;
    const real g = gamma[gamma_off + r] * s;
    const real mean_dz = sum_dz / (real)n, mean_dz_xhat = sum_dz_xhat / (real)n;
    for (int k = k0 + t; k < k1; k += GROUP_THREADS) {
        const real xhat = (FROM_STORED(x[x_off + row + k]) - m) * s;
        dx[dx_off + row + k] = g * (dz[dz_off + row + k] - mean_dz - xhat * mean_dz_xhat);
    }
}

/* Layer normalization: each column c of x (rows, n) normalized over its rows,
     mean[c] = sum_r(x) / rows;  var = sum_r((x - mean)^2) / rows   (two passes)
     inv_std[c] = 1 / sqrt(var + eps);  y <- gamma[r] (x - mean) inv_std + beta[r]
   A work-group is LN_COLS neighbouring columns (dimension 0: neighbours read neighbouring
   addresses) by LN_LANES lanes (dimension 1), lane l taking rows l, l + LN_LANES, ...; the
   lanes' sums meet in local memory, in a fixed order. (One work-item per column left an
   H200 a warp per multiprocessor for a GPT's 16384 columns: 0.1-0.2 ms a call, waiting on
   memory.) y may be x (each element is written by the work-item that read it, after its
   last read). Real arrays only. */
#define LN_COLS 32
#define LN_LANES 8

/* The sum over the lanes of each one's v, for every lane of the column (two barriers). */
DEVICE real lanes_sum(LOCAL_PTR real* part, const real v) {
    part[LOCAL_ID(1) * LN_COLS + LOCAL_ID(0)] = v;
    BARRIER();
    real total = 0;
    for (int l = 0; l < LN_LANES; l++) total += part[l * LN_COLS + LOCAL_ID(0)];
    BARRIER();
    return total;
}

KERNEL void layernorm(GLOBAL real* y, const int y_off, GLOBAL real* mean, const int mean_off,
                      GLOBAL real* inv_std, const int inv_std_off, const GLOBAL real* x,
                      const int x_off, const GLOBAL real* gamma, const int gamma_off,
                      const GLOBAL real* beta, const int beta_off, const real eps,
                      const int rows, const int n) {
    LOCAL real part[LN_LANES * LN_COLS];
    const int c = GROUP_ID(0) * LN_COLS + LOCAL_ID(0), lane = LOCAL_ID(1);
    const bool in = c < n;
    real sum = 0;
    if (in)
        for (int r = lane; r < rows; r += LN_LANES) sum += x[x_off + r * n + c];
    const real m = lanes_sum(part, sum) / (real)rows;
    real sq = 0;
    if (in)
        for (int r = lane; r < rows; r += LN_LANES) {
            const real d = x[x_off + r * n + c] - m;
            sq += d * d;
        }
    const real s = (real)1 / sqrt(lanes_sum(part, sq) / (real)rows + eps);
    if (!in) return;
    if (lane == 0) {
        mean[mean_off + c] = m;
        inv_std[inv_std_off + c] = s;
    }
    for (int r = lane; r < rows; r += LN_LANES) {
        const int i = r * n + c;
        y[y_off + i] = gamma[gamma_off + r] * ((x[x_off + i] - m) * s) + beta[beta_off + r];
    }
}

/* Per row r, with xhat = (x - mean[c]) inv_std[c] over the columns c:
     dbeta <- alpha sum(dy) + beta dbeta;  dgamma <- alpha sum(dy xhat) + beta dgamma
   (beta = 0: the old values are not read). One group of GROUP_THREADS per row. */
KERNEL void layernorm_params_grad(GLOBAL real* dgamma, const int dgamma_off, GLOBAL real* dbeta,
                                  const int dbeta_off, const GLOBAL real* dy, const int dy_off,
                                  const GLOBAL real* x, const int x_off,
                                  const GLOBAL real* mean, const int mean_off,
                                  const GLOBAL real* inv_std, const int inv_std_off,
                                  const real alpha, const real beta, const int rows,
                                  const int n) {
    LOCAL real partial[GROUP_THREADS];
    const int r = GROUP_ID(0), t = LOCAL_ID(0), row = r * n;
    real sum = 0, dot = 0;
    for (int c = t; c < n; c += GROUP_THREADS) {
        const real d = dy[dy_off + row + c];
        sum += d;
        dot += d * ((x[x_off + row + c] - mean[mean_off + c]) * inv_std[inv_std_off + c]);
    }
    group_sum_into(partial, sum, dbeta, dbeta_off + r, alpha, beta);
    group_sum_into(partial, dot, dgamma, dgamma_off + r, alpha, beta);
}

/* Per column c, with g = gamma[r] dy and xhat = (x - mean[c]) inv_std[c]:
     dx <- inv_std (g - sum_r(g) / rows - xhat sum_r(g xhat) / rows)
   layernorm's work-groups (LN_COLS columns by LN_LANES lanes). dx may be x or dy: each
   element is written by the work-item that read it, after its last read. */
KERNEL void layernorm_dx(GLOBAL real* dx, const int dx_off, const GLOBAL real* dy,
                         const int dy_off, const GLOBAL real* x, const int x_off,
                         const GLOBAL real* gamma, const int gamma_off,
                         const GLOBAL real* mean, const int mean_off,
                         const GLOBAL real* inv_std, const int inv_std_off, const int rows,
                         const int n) {
    LOCAL real part[LN_LANES * LN_COLS];
    const int c = GROUP_ID(0) * LN_COLS + LOCAL_ID(0), lane = LOCAL_ID(1);
    const bool in = c < n;
    const real m = in ? mean[mean_off + c] : (real)0, s = in ? inv_std[inv_std_off + c] : (real)0;
    real sum = 0, dot = 0;
    if (in)
        for (int r = lane; r < rows; r += LN_LANES) {
            const int i = r * n + c;
            const real g = gamma[gamma_off + r] * dy[dy_off + i];
            sum += g;
            dot += g * ((x[x_off + i] - m) * s);
        }
    const real mean_g = lanes_sum(part, sum) / (real)rows;
    const real mean_g_xhat = lanes_sum(part, dot) / (real)rows;
    if (!in) return;
    for (int r = lane; r < rows; r += LN_LANES) {
        const int i = r * n + c;
        const real xhat = (x[x_off + i] - m) * s;
        const real g = gamma[gamma_off + r] * dy[dy_off + i];  /* rounded as in the sums */
        dx[dx_off + i] = s * (g - mean_g - xhat * mean_g_xhat);
    }
}
