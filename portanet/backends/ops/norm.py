"""Batch and layer normalization: the statistics of each row (batch) or column (layer),
the normalized output, and the gradients (norm.cl: for a batch's rows one work-group of
gemv_threads per row, or pieces of rows; for a layer's columns one work-item each)."""
import numpy as np

from ..arrays import ACT
from ..checks import (check_alike, check_columns, check_norm_delta, check_norm_grad,
                      check_norm_kind, check_rows)
from .activations import activate, activate_grad
from .reference import quiet

# how norm.cl's kernels share a row (BN_* there): one group, or pieces in these launches
BN_WHOLE, BN_SUMS, BN_SQUARES, BN_APPLY = 0, 1, 2, 3


class NormOps:
    """The family's interface: what each op does, whatever runs it."""

    # batch normalization: x viewed as (rows, n), a row per feature of (features, batch) or
    # per channel of (C, H, W, N) images (n = H W N); per-row vectors hold a value per row.
    # x, z and a are stored alike: all real, or all 16-bit (a BatchNorm between 16-bit
    # layers), read as their values and written rounded (a from the unrounded z); the
    # statistics, parameters and gradients (dz, dx) are real

    def batchnorm_train(self, kind, z, a, mean, inv_std, x, gamma, beta, running_mean,
                        running_var, eps, momentum):
        """Per row r of x (rows, n): mean[r] and the biased variance var over the row;
        inv_std[r] <- 1 / sqrt(var + eps); z <- gamma[r] (x - mean) inv_std + beta[r];
        a <- f(z); running_mean <- (1 - momentum) running_mean + momentum mean;
        running_var <- (1 - momentum) running_var + momentum var n / (n - 1) (the unbiased
        variance, as PyTorch's; var for n = 1). z may be x; a may be z."""
        raise NotImplementedError

    def batchnorm_infer(self, kind, z, a, x, gamma, beta, running_mean, running_var, eps):
        """z <- gamma (x - running_mean) / sqrt(running_var + eps) + beta; a <- f(z)."""
        raise NotImplementedError

    def batchnorm_delta(self, kind, delta, da, x, gamma, beta, mean, inv_std):
        """delta <- f'(z) da, z = gamma (x - mean) inv_std + beta made again from x and the
        batch's statistics (as batchnorm_train left them): a BatchNorm keeps its output,
        not z. da and delta are real, x stored as the forward read it; delta may be da."""
        raise NotImplementedError

    def batchnorm_grad(self, dx, dgamma, dbeta, dz, x, gamma, mean, inv_std, alpha, beta):
        """Per row, xhat = (x - mean) inv_std: dbeta <- alpha sum(dz) + beta dbeta;
        dgamma <- alpha sum(dz xhat) + beta dgamma (beta = 0: the old values are not read),
        and unless dx is None dx <- gamma inv_std (dz - sum(dz) / n - xhat sum(dz xhat) / n).
        dx may be x or dz: all of them are read before it is written."""
        raise NotImplementedError

    # layer normalization: x viewed as (rows, n) as above, each column (a sample's features,
    # a position's channels, a token's) normalized over its rows; gamma and beta hold a
    # value per row, mean and inv_std a value per column. All real.

    def layernorm(self, y, mean, inv_std, x, gamma, beta, eps):
        """Per column c of x (rows, n): mean[c] and the biased variance var over the
        column; inv_std[c] <- 1 / sqrt(var + eps); y <- gamma[r] (x - mean) inv_std +
        beta[r]. y may be x."""
        raise NotImplementedError

    def layernorm_grad(self, dx, dgamma, dbeta, dy, x, gamma, mean, inv_std, alpha, beta):
        """xhat = (x - mean[c]) inv_std[c]: per row dbeta <- alpha sum_c(dy) + beta dbeta,
        dgamma <- alpha sum_c(dy xhat) + beta dgamma (beta = 0: the old values are not
        read); and unless dx is None, per column, with g = gamma dy,
        dx <- inv_std (g - sum_r(g) / rows - xhat sum_r(g xhat) / rows). dx may be x or
        dy: all of them are read before it is written."""
        raise NotImplementedError


class NormReference(NormOps):
    """NumPy's: device arrays are NumPy arrays."""

    @quiet
    def batchnorm_train(self, kind, z, a, mean, inv_std, x, gamma, beta, running_mean,
                        running_var, eps, momentum):
        check_norm_kind(kind)
        rows, n = check_rows("batchnorm_train", x, {"z": z, "a": a},
                             {"mean": mean, "inv_std": inv_std, "gamma": gamma, "beta": beta,
                              "running_mean": running_mean, "running_var": running_var})
        check_alike("batchnorm_train", z=z, a=a, x=x)
        xs = self._value(x).reshape(rows, n)
        mu = xs.mean(axis=1)
        d = xs - mu[:, None]
        var = (d * d).mean(axis=1)                   # two passes, not E[x^2] - E[x]^2
        s = 1 / np.sqrt(var + eps)
        zs = (gamma[:, None] * (d * s[:, None]) + beta[:, None]).reshape(z.shape)
        self._store(z, zs)                           # x is read: z may be x
        self._store(a, activate(kind, zs))
        mean[...] = mu
        inv_std[...] = s
        unbiased = var * (n / (n - 1)) if n > 1 else var
        running_mean[...] = (1 - momentum) * running_mean + momentum * mu
        running_var[...] = (1 - momentum) * running_var + momentum * unbiased

    @quiet
    def batchnorm_infer(self, kind, z, a, x, gamma, beta, running_mean, running_var, eps):
        check_norm_kind(kind)
        rows, n = check_rows("batchnorm_infer", x, {"z": z, "a": a},
                             {"gamma": gamma, "beta": beta, "running_mean": running_mean,
                              "running_var": running_var})
        check_alike("batchnorm_infer", z=z, a=a, x=x)
        s = 1 / np.sqrt(running_var + eps)
        zs = (gamma * s)[:, None] * (self._value(x).reshape(rows, n) - running_mean[:, None]) \
            + beta[:, None]
        self._store(z, zs.reshape(z.shape))
        self._store(a, activate(kind, zs.reshape(z.shape)))

    @quiet
    def batchnorm_delta(self, kind, delta, da, x, gamma, beta, mean, inv_std):
        rows, n = check_norm_delta(self, kind, delta, da, x, gamma, beta, mean, inv_std)
        # z as batchnorm_train made it, operation for operation
        d = self._value(x).reshape(rows, n) - mean[:, None]
        zs = gamma[:, None] * (d * inv_std[:, None]) + beta[:, None]
        delta[...] = (activate_grad(kind, zs) * da.reshape(rows, n)).reshape(delta.shape)

    @quiet
    def batchnorm_grad(self, dx, dgamma, dbeta, dz, x, gamma, mean, inv_std, alpha, beta):
        rows, n = check_rows("batchnorm_grad", x, {"dx": dx, "dz": dz},
                             {"dgamma": dgamma, "dbeta": dbeta, "gamma": gamma, "mean": mean,
                              "inv_std": inv_std})
        check_norm_grad(self, dx, dz)
        dzs = dz.reshape(rows, n)
        xhat = (self._value(x).reshape(rows, n) - mean[:, None]) * inv_std[:, None]
        sum_dz = dzs.sum(axis=1)
        sum_dz_xhat = (dzs * xhat).sum(axis=1)
        if dx is not None:
            g = (gamma * inv_std)[:, None] * (dzs - sum_dz[:, None] / n
                                              - xhat * (sum_dz_xhat[:, None] / n))
            dx[...] = g.reshape(dx.shape)
        dbeta[...] = alpha * sum_dz + (beta * dbeta if beta != 0 else 0)
        dgamma[...] = alpha * sum_dz_xhat + (beta * dgamma if beta != 0 else 0)


    @quiet
    def layernorm(self, y, mean, inv_std, x, gamma, beta, eps):
        rows, n = check_columns(self, "layernorm", x, {"y": y}, {"gamma": gamma, "beta": beta},
                                {"mean": mean, "inv_std": inv_std})
        xs = x.reshape(rows, n)
        mu = xs.mean(axis=0)
        d = xs - mu
        var = (d * d).mean(axis=0)                   # two passes, as batchnorm_train
        s = 1 / np.sqrt(var + eps)
        y[...] = (gamma[:, None] * (d * s) + beta[:, None]).reshape(y.shape)
        mean[...] = mu
        inv_std[...] = s

    @quiet
    def layernorm_grad(self, dx, dgamma, dbeta, dy, x, gamma, mean, inv_std, alpha, beta):
        rows, n = check_columns(self, "layernorm_grad", x, {"dx": dx, "dy": dy},
                                {"dgamma": dgamma, "dbeta": dbeta, "gamma": gamma},
                                {"mean": mean, "inv_std": inv_std})
        dys = dy.reshape(rows, n)
        xhat = (x.reshape(rows, n) - mean) * inv_std
        if dx is not None:
            g = gamma[:, None] * dys
            dx_new = inv_std * (g - g.sum(axis=0) / rows - xhat * ((g * xhat).sum(axis=0) / rows))
        sum_dy, sum_dy_xhat = dys.sum(axis=1), (dys * xhat).sum(axis=1)
        if dx is not None:
            dx[...] = dx_new.reshape(dx.shape)
        dbeta[...] = alpha * sum_dy + (beta * dbeta if beta != 0 else 0)
        dgamma[...] = alpha * sum_dy_xhat + (beta * dgamma if beta != 0 else 0)


class NormKernels(NormOps):
    """KernelBackend's: launches of norm.cl's kernels, a row whole or in the pieces the
    backend's `_norm_pieces` chooses for its device."""

    def batchnorm_train(self, kind, z, a, mean, inv_std, x, gamma, beta, running_mean,
                        running_var, eps, momentum):
        check_norm_kind(kind)
        act = ACT[kind]
        rows, n = check_rows("batchnorm_train", x, {"z": z, "a": a},
                             {"mean": mean, "inv_std": inv_std, "gamma": gamma, "beta": beta,
                              "running_mean": running_mean, "running_var": running_var})
        check_alike("batchnorm_train", z=z, a=a, x=x)
        parts, ws, phases = self._norm_pieces(rows, n, (BN_SUMS, BN_SQUARES, BN_APPLY), mean)
        for phase in phases:
            self._run("batchnorm_train", (rows * self.gemv_threads, parts), z, a, mean,
                      inv_std, running_mean, running_var, x, gamma, beta, act, float(eps),
                      float(momentum), rows, n, ws, parts, phase,
                      local=(self.gemv_threads, 1), stored=self._stored(x))

    def batchnorm_infer(self, kind, z, a, x, gamma, beta, running_mean, running_var, eps):
        check_norm_kind(kind)
        act = ACT[kind]
        rows, n = check_rows("batchnorm_infer", x, {"z": z, "a": a},
                             {"gamma": gamma, "beta": beta, "running_mean": running_mean,
                              "running_var": running_var})
        check_alike("batchnorm_infer", z=z, a=a, x=x)
        self._run("batchnorm_infer", (n, rows), z, a, x, gamma, beta,
                  running_mean, running_var, act, float(eps), rows, n,
                  stored=self._stored(x))

    def batchnorm_delta(self, kind, delta, da, x, gamma, beta, mean, inv_std):
        rows, n = check_norm_delta(self, kind, delta, da, x, gamma, beta, mean, inv_std)
        self._run("batchnorm_delta", (n, rows), delta, da, x, gamma, beta, mean, inv_std,
                  ACT[kind], rows, n, stored=self._stored(x))

    def batchnorm_grad(self, dx, dgamma, dbeta, dz, x, gamma, mean, inv_std, alpha, beta):
        """Without dx the kernel gets dz in its place, never written (has_dx = 0)."""
        rows, n = check_rows("batchnorm_grad", x, {"dx": dx, "dz": dz},
                             {"dgamma": dgamma, "dbeta": dbeta, "gamma": gamma, "mean": mean,
                              "inv_std": inv_std})
        check_norm_grad(self, dx, dz)
        parts, ws, phases = self._norm_pieces(rows, n, (BN_SUMS, BN_APPLY), dz)
        for phase in phases:
            self._run("batchnorm_grad", (rows * self.gemv_threads, parts),
                      dz if dx is None else dx, dgamma, dbeta, dz, x, gamma, mean, inv_std,
                      float(alpha), float(beta), dx is not None, rows, n, ws, parts, phase,
                      local=(self.gemv_threads, 1), stored=self._stored(x))

    def layernorm(self, y, mean, inv_std, x, gamma, beta, eps):
        rows, n = check_columns(self, "layernorm", x, {"y": y}, {"gamma": gamma, "beta": beta},
                                {"mean": mean, "inv_std": inv_std})
        self._run("layernorm", _lanes(n), y, mean, inv_std, x, gamma, beta, float(eps), rows,
                  n, local=(LN_COLS, LN_LANES))

    def layernorm_grad(self, dx, dgamma, dbeta, dy, x, gamma, mean, inv_std, alpha, beta):
        """The parameters' gradients first (a group per row), while x and dy are whole; then
        dx (layernorm's groups), which may be written over either."""
        rows, n = check_columns(self, "layernorm_grad", x, {"dx": dx, "dy": dy},
                                {"dgamma": dgamma, "dbeta": dbeta, "gamma": gamma},
                                {"mean": mean, "inv_std": inv_std})
        self._run("layernorm_params_grad", (rows * self.gemv_threads,), dgamma, dbeta, dy, x,
                  mean, inv_std, float(alpha), float(beta), rows, n,
                  local=(self.gemv_threads,))
        if dx is not None:
            self._run("layernorm_dx", _lanes(n), dx, dy, x, gamma, mean, inv_std, rows, n,
                      local=(LN_COLS, LN_LANES))


LN_COLS, LN_LANES = 32, 8       # norm.cl's layernorm groups: columns by lanes over the rows


def _lanes(n):
    """The global size of layernorm's groups over n columns."""
    return (-(-n // LN_COLS) * LN_COLS, LN_LANES)
