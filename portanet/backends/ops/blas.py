"""Moving and scaling arrays: fill, copy, transpose, axpy, scal, and the gathers that take
a batch from data kept on the device (elementwise.cl)."""
import numpy as np

from ..arrays import MAX_GROUPS_1
from ..checks import check_alike, check_gather, check_transpose
from .reference import quiet

TILE, TILE_ROWS = 32, 8    # transpose's tiles and work-groups (elementwise.cl)


class BlasOps:
    """The family's interface: what each op does, whatever runs it."""

    def fill(self, x, value):
        raise NotImplementedError

    def copy(self, src, dst):
        raise NotImplementedError

    def transpose(self, x, out):
        """out (cols, rows) <- x^T, x (rows, cols)."""
        raise NotImplementedError

    def axpy(self, alpha, x, y):
        """y <- alpha x + y."""
        raise NotImplementedError

    def scal(self, alpha, x):
        """x <- alpha x."""
        raise NotImplementedError

    def gather(self, out, x, idx):
        """A batch from data kept on the device: out (rows, m) <- x[idx].T for x (N, rows)
        samples-first, or out (m,) <- x[idx] for int32 labels x (N,). idx: int32 (m,)."""
        raise NotImplementedError

    def gather_batch(self, x_out, x, y_out, y, idx):
        """A training batch's inputs and targets gathered by the same indices: gather(x_out,
        x, idx) and gather(y_out, y, idx). Here the two calls; kernel backends make them one
        launch for integer labels."""
        self.gather(x_out, x, idx)
        self.gather(y_out, y, idx)


class BlasReference(BlasOps):
    """NumPy's: device arrays are NumPy arrays."""

    def fill(self, x, value):
        self._store(x, np.full(x.shape, value, self.dtype))

    def copy(self, src, dst):
        check_alike("copy", src=src, dst=dst)
        dst[...] = src.reshape(dst.shape)

    def transpose(self, x, out):
        check_transpose(x, out)
        out[...] = x.T

    @quiet
    def axpy(self, alpha, x, y):
        y += alpha * x

    @quiet
    def scal(self, alpha, x):
        x *= alpha

    def gather(self, out, x, idx):
        check_gather(out, x, idx)
        self._store(out, x[idx].T)


class BlasKernels(BlasOps):
    """KernelBackend's: launches of elementwise.cl's kernels."""

    def fill(self, x, value):
        if self._stored(x):                 # (a kernel writes reals)
            if not self.dry:
                self.write(x, np.full(x.shape, value, np.float32))
            return
        self._run("fill", (x.size,), x, float(value), x.size)

    def copy(self, src, dst):
        check_alike("copy", src=src, dst=dst)
        self._run("copy", (dst.size,), dst, src, dst.size, stored=self._stored(dst))

    def transpose(self, x, out):
        check_transpose(x, out)
        rows, cols = x.shape
        if rows and cols:                   # TILE x TILE tiles, groups of TILE x TILE_ROWS
            tiles = min(-(-rows // TILE), MAX_GROUPS_1)
            self._run("transpose", (-(-cols // TILE) * TILE, tiles * TILE_ROWS), out, x, rows,
                      cols, local=(TILE, TILE_ROWS))

    def axpy(self, alpha, x, y):
        self._run("axpy", (y.size,), y, x, float(alpha), y.size)

    def scal(self, alpha, x):
        self._run("scal", (x.size,), x, float(alpha), x.size)

    def gather(self, out, x, idx):
        check_gather(out, x, idx)
        if len(out.shape) == 1:
            self._run("gather_labels", (out.size,), out, x, idx, out.size)
        else:
            rows, cols = out.shape
            self._run("gather_columns", (cols, rows), out, x, idx, rows, cols,
                      stored=self._stored(out))

    def gather_batch(self, x_out, x, y_out, y, idx):
        """Inputs and integer labels in one launch (gather_batch); float targets apart."""
        if len(y_out.shape) != 1:
            super().gather_batch(x_out, x, y_out, y, idx)
            return
        check_gather(x_out, x, idx)
        check_gather(y_out, y, idx)
        rows, cols = x_out.shape
        self._run("gather_batch", (cols, rows), x_out, x, y_out, y, idx, rows, cols,
                  stored=self._stored(x_out))
