"""Batch normalization: the NumPy reference (NormReference) and the kernels of norm.cl /
norm.cu (NormKernels), written as the Backend methods they are to become, for NumpyBackend
and KernelBackend.

x is viewed as (rows, n): rows are the features of a Dense layer's (features, batch)
activations, or the channels of (C, H, W, N) images (n = H W N). Statistics are per row;
mean, inv_std, gamma, beta, running_mean, running_var, dgamma and dbeta are 1-D arrays of
one value per row. `kind` is an activation of base.ACTIVATIONS but softmax.
"""
import numpy as np

from ..errors import InputError, ShapeError
from .base import check_activation
from .gpu import ACT
from .numpy import _quiet, activate

# the kernels of norm.cl / norm.cu (one kernel family)
NORM_FAMILY = ("batchnorm_train", "batchnorm_infer", "batchnorm_grad")

# the activations norm.cl's `activate` knows (the cases of its switch); others are refused
# rather than run as linear
NORM_ACTIVATIONS = ("linear", "relu", "sigmoid", "tanh")


class NormReference:
    """Batch normalization in NumPy: the oracle of the kernels (NumpyBackend's methods)."""

    @_quiet
    def batchnorm_train(self, kind, z, a, mean, inv_std, x, gamma, beta, running_mean,
                        running_var, eps, momentum):
        """Per row r of x (rows, n): mean[r] and the biased variance var over the row;
        inv_std[r] <- 1 / sqrt(var + eps); z <- gamma[r] (x - mean) inv_std + beta[r];
        a <- f(z); running_mean <- (1 - momentum) running_mean + momentum mean;
        running_var <- (1 - momentum) running_var + momentum var n / (n - 1) (the unbiased
        variance, as PyTorch's; var for n = 1). z may be x; a may be z."""
        _check_kind(kind)
        rows, n = check_rows("batchnorm_train", x, {"z": z, "a": a},
                             {"mean": mean, "inv_std": inv_std, "gamma": gamma, "beta": beta,
                              "running_mean": running_mean, "running_var": running_var})
        xs = x.reshape(rows, n)
        mu = xs.mean(axis=1)
        d = xs - mu[:, None]
        var = (d * d).mean(axis=1)                   # two passes, not E[x^2] - E[x]^2
        s = 1 / np.sqrt(var + eps)
        zs = gamma[:, None] * (d * s[:, None]) + beta[:, None]
        z[...] = zs.reshape(z.shape)                 # x is read: z may be x
        a[...] = activate(kind, z)
        mean[...] = mu
        inv_std[...] = s
        unbiased = var * (n / (n - 1)) if n > 1 else var
        running_mean[...] = (1 - momentum) * running_mean + momentum * mu
        running_var[...] = (1 - momentum) * running_var + momentum * unbiased

    @_quiet
    def batchnorm_infer(self, kind, z, a, x, gamma, beta, running_mean, running_var, eps):
        """z <- gamma (x - running_mean) / sqrt(running_var + eps) + beta; a <- f(z)."""
        _check_kind(kind)
        rows, n = check_rows("batchnorm_infer", x, {"z": z, "a": a},
                             {"gamma": gamma, "beta": beta, "running_mean": running_mean,
                              "running_var": running_var})
        s = 1 / np.sqrt(running_var + eps)
        zs = (gamma * s)[:, None] * (x.reshape(rows, n) - running_mean[:, None]) + beta[:, None]
        z[...] = zs.reshape(z.shape)
        a[...] = activate(kind, z)

    @_quiet
    def batchnorm_grad(self, dx, dgamma, dbeta, dz, x, gamma, mean, inv_std, alpha, beta):
        """Per row, xhat = (x - mean) inv_std:
        dbeta <- alpha sum(dz) + beta dbeta; dgamma <- alpha sum(dz xhat) + beta dgamma
        (beta = 0: the old values are not read), and unless dx is None
        dx <- gamma inv_std (dz - sum(dz) / n - xhat sum(dz xhat) / n).
        dx may be x or dz: all of them are read before it is written."""
        rows, n = check_rows("batchnorm_grad", x, {"dx": dx, "dz": dz},
                             {"dgamma": dgamma, "dbeta": dbeta, "gamma": gamma, "mean": mean,
                              "inv_std": inv_std})
        dzs = dz.reshape(rows, n)
        xhat = (x.reshape(rows, n) - mean[:, None]) * inv_std[:, None]
        sum_dz = dzs.sum(axis=1)
        sum_dz_xhat = (dzs * xhat).sum(axis=1)
        if dx is not None:
            g = (gamma * inv_std)[:, None] * (dzs - sum_dz[:, None] / n
                                              - xhat * (sum_dz_xhat[:, None] / n))
            dx[...] = g.reshape(dx.shape)
        dbeta[...] = alpha * sum_dz + (beta * dbeta if beta != 0 else 0)
        dgamma[...] = alpha * sum_dz_xhat + (beta * dgamma if beta != 0 else 0)


class NormKernels:
    """Batch normalization on a KernelBackend (OpenCL, CUDA): the kernels of norm.cl and
    norm.cu. The row-wise kernels (train, grad) run one work-group per row, its size the
    backend's gemv group (a power of two within the device's limits), summed through local
    memory. Few long rows leave a GPU mostly idle: 16 rows of 200704 took 237 us to train
    on an H100 (CUDA, float32), 271 GB/s, against 159 us (1.6 TB/s) for 256 rows of 50176;
    groups of 1024 took 76 us there, but NVIDIA's OpenCL allows these kernels 256."""

    def batchnorm_train(self, kind, z, a, mean, inv_std, x, gamma, beta, running_mean,
                        running_var, eps, momentum):
        """See NormReference.batchnorm_train."""
        act = _kernel_act(kind)
        rows, n = check_rows("batchnorm_train", x, {"z": z, "a": a},
                             {"mean": mean, "inv_std": inv_std, "gamma": gamma, "beta": beta,
                              "running_mean": running_mean, "running_var": running_var})
        threads = self.gemv_threads
        self._run(self._norm_kernel("batchnorm_train"), (rows * threads,), z, a, mean,
                  inv_std, running_mean, running_var, x, gamma, beta, act, float(eps),
                  float(momentum), rows, n, local=(threads,), label="batchnorm_train")

    def batchnorm_infer(self, kind, z, a, x, gamma, beta, running_mean, running_var, eps):
        """See NormReference.batchnorm_infer."""
        act = _kernel_act(kind)
        rows, n = check_rows("batchnorm_infer", x, {"z": z, "a": a},
                             {"gamma": gamma, "beta": beta, "running_mean": running_mean,
                              "running_var": running_var})
        self._run(self._norm_kernel("batchnorm_infer"), (n, rows), z, a, x, gamma, beta,
                  running_mean, running_var, act, float(eps), rows, n,
                  label="batchnorm_infer")

    def batchnorm_grad(self, dx, dgamma, dbeta, dz, x, gamma, mean, inv_std, alpha, beta):
        """See NormReference.batchnorm_grad. Without dx the kernel gets x in its place,
        never written (has_dx = 0)."""
        rows, n = check_rows("batchnorm_grad", x, {"dx": dx, "dz": dz},
                             {"dgamma": dgamma, "dbeta": dbeta, "gamma": gamma, "mean": mean,
                              "inv_std": inv_std})
        threads = self.gemv_threads
        self._run(self._norm_kernel("batchnorm_grad"), (rows * threads,),
                  x if dx is None else dx, dgamma, dbeta, dz, x, gamma, mean, inv_std,
                  float(alpha), float(beta), dx is not None, rows, n, local=(threads,),
                  label="batchnorm_grad")

    def _norm_kernel(self, name):
        """norm's kernel `name`, built once for groups of gemv_threads work-items (the
        -DNORM_THREADS the row-wise kernels size their local memory and tree by)."""
        key = ("norm", name, self.gemv_threads)
        kernel = self._kernels.get(key)
        if kernel is None:
            kernel = self._kernels[key] = self._build(
                "norm", name, [f"-DNORM_THREADS={self.gemv_threads}"])
        return kernel


def check_rows(op, x, like_x, per_row):
    """(rows, n) of x viewed as (rows, n); or a ShapeError naming the array that does not
    fit: like_x (name -> array or None) must have x's shape, per_row (name -> array) one
    element per row."""
    if len(x.shape) < 2 or x.size == 0:
        raise ShapeError(f"{op}: x {tuple(x.shape)} must be (features, batch) or (C, H, W, N), "
                         f"not empty")
    rows = x.shape[0]
    for name, y in like_x.items():
        if y is not None and tuple(y.shape) != tuple(x.shape):
            raise ShapeError(f"{op}: {name} {tuple(y.shape)} must have the shape of x "
                             f"{tuple(x.shape)}")
    for name, v in per_row.items():
        if tuple(v.shape) != (rows,):
            raise ShapeError(f"{op}: {name} {tuple(v.shape)} must be ({rows},), one value per "
                             f"row of x {tuple(x.shape)}")
    return rows, x.size // rows


def _check_kind(kind):
    check_activation(kind)
    if kind == "softmax":
        raise InputError("batch normalization takes an elementwise activation, not softmax: "
                         "normalize, then apply softmax in a layer of its own")


def _kernel_act(kind):
    """The ACT code of `kind` for norm.cl, refusing what its `activate` does not know."""
    _check_kind(kind)
    if kind not in NORM_ACTIVATIONS:
        raise InputError(f"batch normalization with {kind!r} has no kernel yet: norm.cl's "
                         f"activate knows {', '.join(NORM_ACTIVATIONS)}")
    return ACT[kind]
