"""The NumPy reference backend: plain, obviously right, and the oracle of every test."""
import os

import numpy as np

from ..precision import from_storage, round_to, to_storage
from .base import ACC_K, CONV_WORKSPACE_BYTES, Backend, conv_out, features_first
from .checks import check_activation, check_conv, check_gemm, check_stored
# the activation functions live with their family; tests take them from here too
from .ops.activations import ActivationReference, activate, activate_grad  # noqa: F401
from .ops.blas import BlasReference
from .ops.loss import LossReference
from .ops.norm import NormReference
from .ops.optim import UpdateReference
from .ops.pool import PoolReference
from .ops.attention import AttentionReference
from .ops.embed import EmbedReference
from .ops.reference import quiet
from .pinning import OnePath

EMULATED = ("tf32", "bf16", "fp16")     # the precisions below float32 it emulates


class NumpyBackend(OnePath, BlasReference, ActivationReference, LossReference, PoolReference,
                   NormReference, EmbedReference, AttentionReference, UpdateReference,
                   Backend):
    """The op families' NumPy references over host memory (backends/ops), and the
    products and convolutions, each computed one way (OnePath: nothing to pin or route)."""

    kind = "cpu"

    def __init__(self, name="cpu", dtype=np.float32, precision=None):
        super().__init__(name, dtype, precision)
        self.check_precision()

    @property
    def precisions(self):
        """EMULATED's too: each product's inputs rounded as a tensor core rounds them."""
        return super().precisions + (EMULATED if self.dtype == np.float32 else ())

    def _product(self, a, b, out=None):
        """a @ b as the device's matrix products compute it in this precision: inputs
        rounded to it (round_to: fp32 and fp64 as they are), products and sums in the dtype."""
        return np.matmul(round_to(self._value(a), self.precision),
                         round_to(self._value(b), self.precision), out=out)

    def _value(self, x):
        """x's float32 values: x itself, or what its 16-bit storage holds."""
        return from_storage(x, self.precision) if self._stored(x) else x

    def _store(self, dst, values):
        """dst <- values, rounded as the kernels store them where dst is 16-bit storage
        (values of its own dtype are stored values already: a download written back)."""
        stored = self._stored(dst) and np.asarray(values).dtype != dst.dtype
        dst[...] = to_storage(values, self.precision) if stored else values

    # -- memory: device arrays are NumPy arrays ------------------------------------------

    def empty(self, shape, dtype=None, label="buffer"):
        x = np.empty(shape, dtype=dtype or self.dtype)
        return self._track(x, x.nbytes)

    def write(self, dst, host, wait=True):
        self._store(dst, np.asarray(host).reshape(dst.shape))

    def write_samples(self, dst, host, staging=None, bad=None, first=0):
        if self._stored(dst):
            self._store(dst, features_first(host, self.dtype))
        else:
            features_first(host, dst.dtype, out=dst)
        if bad is not None:
            self._flag_nonfinite(bad, host, first)

    def download(self, x):
        return np.array(x)

    def dlpack_view(self, x):
        """x itself: a NumPy array speaks DLPack."""
        return x

    def view(self, x, shape, offset=0):
        n = int(np.prod(shape))
        return x.reshape(-1)[offset:offset + n].reshape(shape)

    def memory_info(self):
        """The host's available memory (what can be allocated without swapping) and its
        total."""
        return _host_memory()

    # -- BLAS ----------------------------------------------------------------------------

    @quiet
    def gemm(self, alpha, a, b, beta, c, trans_a=False, trans_b=False):
        check_gemm(a, b, c, trans_a, trans_b)
        product = self._product(a.T if trans_a else a, b.T if trans_b else b)
        _scale(beta, c)
        c += alpha * product

    @quiet
    def gemv(self, alpha, a, x, beta, y, trans_a=False):
        """In pieces of ACC_K terms, as the kernels sum: BLAS's gemv runs a transposed
        product's whole K in one float sum (5e-6 off float64 at K = 150000)."""
        op = a.T if trans_a else a
        k = op.shape[1]
        product = np.zeros(op.shape[0], y.dtype)
        for k0 in range(0, k, ACC_K):
            product += op[:, k0:k0 + ACC_K] @ x[k0:k0 + ACC_K]
        _scale(beta, y)
        y += alpha * product

    @quiet
    def ger(self, alpha, x, y, a):
        a += alpha * np.outer(x, y)

    @quiet
    def activation_bias_grad(self, kind, z, da, alpha, beta, gb, ones):
        if not self._stored(z):
            super().activation_bias_grad(kind, z, da, alpha, beta, gb, ones)
            return
        check_activation(kind, derivative=True)
        delta = (activate_grad(kind, self._value(z)) * da).astype(self.dtype)
        self.gemv(alpha, delta, ones, beta, gb)     # summed before the delta rounds
        self._store(z, delta)

    def im2col(self, cols, x, k, stride, pad):
        C, H, W, N = x.shape
        Ho, Wo = conv_out(H, k, stride, pad), conv_out(W, k, stride, pad)
        xp = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
        out = cols.reshape(C, k, k, Ho, Wo, N)
        for ki in range(k):
            for kj in range(k):
                out[:, ki, kj] = xp[:, ki:ki + stride * Ho:stride, kj:kj + stride * Wo:stride]

    @quiet
    def col2im(self, x, cols, k, stride, pad):
        C, H, W, N = x.shape
        Ho, Wo = conv_out(H, k, stride, pad), conv_out(W, k, stride, pad)
        xp = np.zeros((C, H + 2 * pad, W + 2 * pad, N), x.dtype)
        patches = cols.reshape(C, k, k, Ho, Wo, N)
        for ki in range(k):
            for kj in range(k):
                xp[:, ki:ki + stride * Ho:stride, kj:kj + stride * Wo:stride] += patches[:, ki, kj]
        x[...] = xp[:, pad:pad + H, pad:pad + W]

    # convolution as im2col and a matrix product, chunk by chunk where the workspace does
    # not hold the whole patch matrix (chunks of whole columns, (oh, ow, n) in order)

    @quiet
    def conv(self, kind, w, x, b, z, a, k, stride, pad, workspace=None, stored=None):
        g = check_conv("conv", x, k, stride, pad, w=w, b=b, z=z, a=a)
        zf = z.reshape(g.F, g.positions)
        if stored is not None or self._stored(a):     # (before z is written)
            stored = None if stored is None else stored.reshape(zf.shape)
            check_stored(self, zf, a.reshape(zf.shape), stored, "conv")
        chunks = self._patch_chunks(g, workspace)
        xv = self._value(x)
        for j0, j1, cols in chunks:
            self._patches(cols, xv, g, j0, j1)
            self._product(w, cols, out=zf[:, j0:j1])
        self.bias_activation(kind, zf, b, a.reshape(zf.shape), stored=stored)
        return workspace is not None and len(chunks) == 1

    @quiet
    def conv_weight_grad(self, alpha, dz, x, beta, gw, k, stride, pad, workspace=None,
                         patches=False):
        g = check_conv("conv_weight_grad", x, k, stride, pad, gw=gw, dz=dz)
        dzf = dz.reshape(g.F, g.positions)
        _scale(beta, gw)
        chunks = self._patch_chunks(g, workspace)
        reuse = patches and workspace is not None and len(chunks) == 1   # as conv left it
        xv = x if reuse else self._value(x)
        for j0, j1, cols in chunks:
            if not reuse:
                self._patches(cols, xv, g, j0, j1)
            gw += alpha * self._product(dzf[:, j0:j1], cols.T)

    @quiet
    def conv_input_grad(self, dx, w, dz, k, stride, pad, workspace=None, add=False):
        g = check_conv("conv_input_grad", dx, k, stride, pad, w=w, dz=dz)
        dzf = dz.reshape(g.F, g.positions)
        chunks = self._patch_chunks(g, workspace)
        if len(chunks) == 1 and not add:              # the whole patch matrix: col2im
            self._product(w.T, dzf, out=chunks[0][2])
            self.col2im(dx, chunks[0][2], k, stride, pad)
            return
        if not add:
            dx[...] = 0
        for j0, j1, dcols in chunks:
            self._product(w.T, dzf[:, j0:j1], out=dcols)
            _add_patches(dx, dcols, g, j0, j1)

    def _patch_chunks(self, g, workspace):
        """[(j0, j1, cols)]: the patch matrix's columns in chunks that the workspace (or,
        without one, a buffer of at most CONV_WORKSPACE_BYTES) holds, cols a view of it
        (C.k.k, j1 - j0)."""
        room = (workspace.size if workspace is not None
                else CONV_WORKSPACE_BYTES // self.dtype.itemsize) // g.rows
        row = g.Wo * g.N                   # whole output rows where they fit: slices
        step = max(1, min(room if room < row else room // row * row, g.positions))
        if workspace is None or workspace.size < g.rows * step:
            workspace = np.empty(g.rows * step, self.dtype)
        return [(j0, min(j0 + step, g.positions),
                 workspace[:g.rows * (min(j0 + step, g.positions) - j0)].reshape(g.rows, -1))
                for j0 in range(0, g.positions, step)]

    def _patches(self, cols, x, g, j0, j1):
        """cols <- columns j0 .. j1 of im2col(x)."""
        row = g.Wo * g.N
        if j0 % row == 0 and j1 % row == 0:
            out = cols.reshape(g.C, g.k, g.k, (j1 - j0) // row, g.Wo, g.N)
            for ki, kj, inside, window in _row_windows(g, j0 // row, j1 // row):
                out[:, ki, kj][inside] = x[window]
                _zero_outside(out[:, ki, kj], inside)
            return
        out = cols.reshape(g.C, g.k, g.k, j1 - j0)
        for ki, kj, h, w, n, inside in _patch_pixels(g, j0, j1):
            out[:, ki, kj] = np.where(inside, x[:, np.clip(h, 0, g.H - 1),
                                                np.clip(w, 0, g.W - 1), n], 0)

    def info(self):
        return {"name": "NumPy reference on the host CPU", "vendor": "numpy " + np.__version__,
                "memory_bytes": _host_memory()[1], "compute_units": os.cpu_count()}


def _scale(beta, c):
    """c <- beta c, where beta = 0 means c is not read (BLAS: it may hold garbage or NaN)."""
    if beta == 0:
        c[...] = 0
    else:
        c *= beta


def _host_memory():
    """(available, total) bytes of host memory. Linux's MemAvailable counts the page cache
    the kernel would give up, sysconf's free pages do not: they are the fallback (macOS
    has neither; then all of it is taken as available and NumPy's MemoryError decides)."""
    total = _sysconf_bytes("SC_PHYS_PAGES")
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, total        # given in kB
    except (OSError, ValueError, IndexError):
        pass
    return _sysconf_bytes("SC_AVPHYS_PAGES") or total, total


def _sysconf_bytes(pages):
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf(pages)
    except (ValueError, OSError, AttributeError):       # unknown name, or not POSIX
        return 0


def _patch_pixels(g, j0, j1):
    """For each window offset (ki, kj): the pixel (h, w, n) that columns j0 .. j1 of the
    patch matrix take from the images there (as index arrays), and whether it is inside
    the image (else padding)."""
    q, n = np.divmod(np.arange(j0, j1), g.N)
    oh, ow = np.divmod(q, g.Wo)
    for ki in range(g.k):
        h = oh * g.stride - g.pad + ki
        for kj in range(g.k):
            w = ow * g.stride - g.pad + kj
            yield ki, kj, h, w, n, (h >= 0) & (h < g.H) & (w >= 0) & (w < g.W)


def _row_windows(g, oh0, oh1):
    """For each window offset (ki, kj) and output rows oh0 .. oh1: (ki, kj, inside,
    window), slices of the (C, rows, Wo, N) patches that come from inside the image and of
    the image they come from (every stride-th pixel)."""
    def inside(first, last, offset, size):      # outputs o with 0 <= o s - p + offset < size
        lo = max(first, -(-(g.pad - offset) // g.stride))
        return lo, max(lo, min(last, (size - 1 + g.pad - offset) // g.stride + 1))

    def pixels(lo, hi, offset):                 # the image's pixels of outputs lo .. hi
        start = lo * g.stride - g.pad + offset
        return slice(start, start + (hi - lo - 1) * g.stride + 1, g.stride) if hi > lo \
            else slice(0, 0)
    for ki in range(g.k):
        h0, h1 = inside(oh0, oh1, ki, g.H)
        for kj in range(g.k):
            w0, w1 = inside(0, g.Wo, kj, g.W)
            yield (ki, kj, (slice(None), slice(h0 - oh0, h1 - oh0), slice(w0, w1)),
                   (slice(None), pixels(h0, h1, ki), pixels(w0, w1, kj)))


def _zero_outside(patches, inside):
    """patches (C, rows, Wo, N) <- 0 outside the rows and columns of `inside`."""
    rows, cols = inside[1], inside[2]
    patches[:, :rows.start] = 0
    patches[:, rows.stop:] = 0
    patches[:, :, :cols.start] = 0
    patches[:, :, cols.stop:] = 0


def _add_patches(x, cols, g, j0, j1):
    """x += col2im of columns j0 .. j1 of a patch matrix (the pixels of one window offset
    are distinct, so a fancy-indexed += adds each once)."""
    row = g.Wo * g.N
    if j0 % row == 0 and j1 % row == 0:
        patches = cols.reshape(g.C, g.k, g.k, (j1 - j0) // row, g.Wo, g.N)
        for ki, kj, inside, window in _row_windows(g, j0 // row, j1 // row):
            x[window] += patches[:, ki, kj][inside]
        return
    patches = cols.reshape(g.C, g.k, g.k, j1 - j0)
    for ki, kj, h, w, n, inside in _patch_pixels(g, j0, j1):
        x[:, h[inside], w[inside], n[inside]] += patches[:, ki, kj][:, inside]
