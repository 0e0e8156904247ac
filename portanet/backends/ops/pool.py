"""Pooling: the maxima and the means of windows of images and their gradients (conv.cl)."""
import numpy as np

from ..checks import check_alike, check_pool, conv_out
from .reference import quiet


class PoolOps:
    """The family's interface: what each op does, whatever runs it. Images are
    (C, H, W, N), batch innermost; the shapes of the arguments say the sizes."""

    def maxpool(self, a, idx, x, pool, stride):
        """a (C, Ho, Wo, N) <- window maxima of x; idx (int32, like a) <- their flat index.
        a and x are stored alike (check_alike): real, or both in 16-bit storage, as are
        avgpool's and dropout's; the gradients are real."""
        raise NotImplementedError

    def maxpool_grad(self, dx, da, idx, pool, stride):
        """dx (C, H, W, N) <- da summed into the positions idx names."""
        raise NotImplementedError

    def avgpool(self, a, x, pool, stride):
        """a (C, Ho, Wo, N) <- means of the ph x pw windows of x (C, H, W, N), no padding:
        Ho = (H - ph) // sh + 1, Wo = (W - pw) // sw + 1. pool = (ph, pw), stride = (sh, sw)
        (an int n stands for (n, n)). A global average pool is pool = stride = (H, W)."""
        raise NotImplementedError

    def avgpool_grad(self, dx, da, pool, stride):
        """dx (C, H, W, N) <- the adjoint of avgpool: each pixel the sum of da / (ph pw)
        over the windows that hold it (overwrites dx; pixels in no window get 0)."""
        raise NotImplementedError


class PoolReference(PoolOps):
    """NumPy's: device arrays are NumPy arrays."""

    def maxpool(self, a, idx, x, pool, stride):
        """(16-bit storage: on x's values, a stored after: the same bits as x's)"""
        check_alike("maxpool", a=a, x=x)
        if self._stored(x):
            values = np.empty(a.shape, self.dtype)
            self.maxpool(values, idx, self._value(x), pool, stride)
            self._store(a, values)
            return
        _, Ho, Wo, _ = a.shape
        flat = np.arange(x.size).reshape(x.shape)
        a[...] = x[:, :stride * Ho:stride, :stride * Wo:stride]
        idx[...] = flat[:, :stride * Ho:stride, :stride * Wo:stride]
        for pi in range(pool):                      # scan order of the kernels: first max wins
            for pj in range(pool):
                window = (slice(None), slice(pi, pi + stride * Ho, stride),
                          slice(pj, pj + stride * Wo, stride))
                # a NaN in the window is its maximum, the first NaN its argmax, as in
                # np.max and np.argmax (comparing alone kept a NaN only where it came first)
                better = (x[window] > a) | (np.isnan(x[window]) & ~np.isnan(a))
                a[better] = x[window][better]
                idx[better] = flat[window][better]

    @quiet
    def maxpool_grad(self, dx, da, idx, pool, stride):
        flat = np.zeros(dx.size, dx.dtype)
        np.add.at(flat, idx.ravel(), da.ravel())
        dx[...] = flat.reshape(dx.shape)

    @quiet
    def avgpool(self, a, x, pool, stride):
        check_alike("avgpool", a=a, x=x)
        if self._stored(x):                 # on x's values, the mean rounded as stored
            values = np.empty(a.shape, self.dtype)
            self.avgpool(values, self._value(x), pool, stride)
            self._store(a, values)
            return
        _, _, _, _, ph, pw, sh, sw, Ho, Wo = check_pool("avgpool", a, x, pool, stride)
        total = np.zeros(a.shape, a.dtype)
        for pi in range(ph):                # the kernel's order of summation
            for pj in range(pw):
                total += x[:, pi:pi + sh * Ho:sh, pj:pj + sw * Wo:sw]
        a[...] = total / (ph * pw)

    @quiet
    def avgpool_grad(self, dx, da, pool, stride):
        _, _, _, _, ph, pw, sh, sw, Ho, Wo = check_pool("avgpool_grad", da, dx, pool, stride)
        total = np.zeros(dx.shape, dx.dtype)
        for pi in range(ph):                # the kernel's order of summation
            for pj in range(pw):
                total[:, pi:pi + sh * Ho:sh, pj:pj + sw * Wo:sw] += da
        dx[...] = total / (ph * pw)


class PoolKernels(PoolOps):
    """KernelBackend's: launches of conv.cl's pooling kernels."""

    def maxpool(self, a, idx, x, pool, stride):
        check_alike("maxpool", a=a, x=x)
        self._run("maxpool", (a.size,), a, idx, x, *_pool_sizes(x, pool, stride),
                  stored=self._stored(x))

    def maxpool_grad(self, dx, da, idx, pool, stride):
        self._run("maxpool_grad", (dx.size,), dx, da, idx, *_pool_sizes(dx, pool, stride))

    def avgpool(self, a, x, pool, stride):
        check_alike("avgpool", a=a, x=x)
        self._run("avgpool", (a.size,), a, x, *check_pool("avgpool", a, x, pool, stride),
                  stored=self._stored(x))

    def avgpool_grad(self, dx, da, pool, stride):
        self._run("avgpool_grad", (dx.size,), dx, da,
                  *check_pool("avgpool_grad", da, dx, pool, stride))


def _pool_sizes(x, pool, stride):
    """The size arguments of conv.cl's maxpool kernels for images x (C, H, W, N): square
    windows, no padding (as conv.py's _conv_sizes gives them for pad 0)."""
    C, H, W, N = x.shape
    return C, H, W, N, pool, stride, conv_out(H, pool, stride, 0), conv_out(W, pool, stride, 0)
