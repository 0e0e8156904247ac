"""The convolution's paths: the implicit GEMM (our GEMM kernel gathering its patches,
`Gather`), im2col into a workspace then GEMM (in chunks of columns where the workspace is
smaller than the patch matrix), and conv_direct for short patches; which one runs a layer
is measured once per shape where routing is auto (`_conv_path`) and kept with the GEMM
routes."""
from .arrays import ACT, DeviceArray
from .base import conv_out
from .checks import check_activation, check_conv, check_stored


DIRECT_F = 8               # filters per work-item of conv_direct (as in conv.cl)
DIRECT_ROWS = 64           # the longest patch (C.k.k) conv_direct is tried for
MIN_CHUNK = 1024           # the fewest patch-matrix columns a chunk of im2col may have


class Gather:
    """What makes our GEMM kernel an implicit-GEMM convolution (gemm.cl's CONV): the mode
    (1 forward, 2 input gradient, 3 weight gradient), the convolution's sizes, the operand
    read as a matrix (None: both are gathered) and, for the forward, the activation, a and
    the bias that its epilogue may take (kind None: not fused, softmax)."""

    def __init__(self, mode, g, read, label, kind=None, a=None, bias=None):
        self.mode, self.g, self.read, self.label = mode, g, read, label
        self.kind, self.a, self.bias = kind, a, bias

    def vector(self, x, vw):
        """Whether operand x loads in runs of vw as one vector: a matrix read as such where
        aligned, as gemm's operands; images (the forward's and the weight gradient's
        patches) where the batch and their offset are multiples of vw, so that a run is
        one pixel of vw samples."""
        if x is self.read:
            return x.offset % vw == 0 and x.shape[1] % vw == 0
        return self.mode != 2 and x.offset % vw == 0 and self.g.N % vw == 0

    def key(self, fused, fixed):
        return ("conv", self.mode, self.g.k, self.g.stride, self.g.pad, fused) + (
            self.g if fixed else ())

    def options(self, fused, fixed):
        g = self.g
        sizes = (f"-DCONV_FIXED=1 -DCONV_C={g.C} -DCONV_H={g.H} -DCONV_W={g.W} -DCONV_NB={g.N} "
                 f"-DCONV_HO={g.Ho} -DCONV_WO={g.Wo}".split() if fixed else [])
        return [f"-DCONV={self.mode}", f"-DCONV_K={g.k}", f"-DCONV_S={g.stride}",
                f"-DCONV_P={g.pad}", f"-DBIAS_ACT={int(fused)}", *sizes]

    def args(self, k_base, fused):
        g = self.g
        return (g.C, g.H, g.W, g.N, g.Ho, g.Wo, k_base) + (
            (self.a, self.bias, ACT[self.kind]) if fused else ())


def _holds_all(g, workspace):
    """Whether the workspace holds the whole patch matrix of convolution g."""
    return workspace is not None and workspace.size >= g.rows * g.positions


def _columns(x, j0):
    """x (rows, n) from column j0 on: the same array at another offset, so that its leading
    dimension (n) stays; for the vendor's GEMM on a chunk of columns. Its shape reaches j0
    elements past x's last: what reads it whole stops at `_extent`."""
    return DeviceArray(x.buf, x.offset + j0, x.shape, x.dtype, x if x.base is None else x.base)


def _storage_key(bk, *arrays):
    """What a convolution's route key adds for arrays in 16-bit storage (their paths read
    other kernels): which of them are, or nothing where none is."""
    stored = tuple(bk._stored(x) for x in arrays)
    return ("16-bit", stored) if any(stored) else ()


def _conv_sizes(x, k, stride, pad):
    """The size arguments of conv.cl's kernels for images x (C, H, W, N)."""
    C, H, W, N = x.shape
    return C, H, W, N, k, stride, pad, conv_out(H, k, stride, pad), conv_out(W, k, stride, pad)


class ConvPaths:
    """KernelBackend's convolutions (see the module's docstring)."""

    def im2col(self, cols, x, k, stride, pad, col0=0):
        """cols (C.k.k, n) <- columns col0 .. col0 + n of the patch matrix (all by default)."""
        rows, n = cols.shape
        self._run("im2col", (n, rows), cols, x, *_conv_sizes(x, k, stride, pad), col0, n,
                  stored=self._stored(x))

    def col2im(self, x, cols, k, stride, pad, col0=0, add=False):
        """x <- (x if add, else 0) + col2im of cols, columns col0 .. col0 + n of a patch
        matrix (all by default)."""
        self._run("col2im", (x.size,), x, cols, *_conv_sizes(x, k, stride, pad), col0,
                  cols.shape[1], add)

    def conv(self, kind, w, x, b, z, a, k, stride, pad, workspace=None, stored=None):
        check_activation(kind)
        g = check_conv("conv", x, k, stride, pad, w=w, b=b, z=z, a=a)
        z, a = (self.view(y, (g.F, g.positions)) for y in (z, a))
        half = stored is not None or self._stored(a)
        if half:                        # the sums in z, float32; z + b in stored
            stored = self.view(stored, z.shape) if stored is not None else None
            check_stored(self, z, a, stored, "conv")

        def implicit():
            fused = None if kind == "softmax" or half else kind
            if not self._gemm_own(1.0, w, x, 0.0, z, False, False, g.F, g.positions, g.rows,
                                  Gather(1, g, w, "conv", fused, a, b)):
                self.bias_activation(kind, z, b, a, stored=stored)

        def direct():
            self._run("conv_direct", (g.positions, -(-g.F // DIRECT_F)),
                      stored if half else z, a, w, b, x, g.F, *g[1:], ACT[kind], stored=half)

        def im2col():
            for j0, cols in self._patch_chunks(g, workspace):
                self.im2col(cols, x, k, stride, pad, j0)
                self._gemm_columns(1.0, w, cols, 0.0, z, False, False, j0)
            self.bias_activation(kind, z, b, a, stored=stored)
        paths = {"implicit": implicit, "im2col": im2col}
        # direct: not softmax (over the filters, not elementwise), and its images and
        # outputs stored alike (one STORED type)
        if kind != "softmax" and self._stored(x) == half:
            paths["direct"] = direct
        path = self._conv_path(("conv", kind, *g, *_storage_key(self, x, a)), paths, g,
                               workspace)
        paths[path]()
        return path == "im2col" and _holds_all(g, workspace)

    def conv_weight_grad(self, alpha, dz, x, beta, gw, k, stride, pad, workspace=None,
                         patches=False):
        g = check_conv("conv_weight_grad", x, k, stride, pad, gw=gw, dz=dz)
        dz = self.view(dz, (g.F, g.positions))
        patches = patches and _holds_all(g, workspace)

        def implicit():
            self._gemm_own(alpha, dz, x, beta, gw, False, True, g.F, g.rows, g.positions,
                           Gather(3, g, dz, "conv wgrad"))

        def im2col():
            for i, (j0, cols) in enumerate(self._patch_chunks(g, workspace)):
                if not patches:
                    self.im2col(cols, x, k, stride, pad, j0)
                self._gemm_columns(alpha, dz, cols, beta if i == 0 else 1.0, gw, False, True,
                                   j0)
        paths = {"implicit": implicit, "im2col": im2col}
        paths[self._conv_path(("conv_weight_grad", patches, *g, *_storage_key(self, x, dz)),
                              paths, g, workspace, restore=[gw] if beta != 0 else [])]()

    def conv_input_grad(self, dx, w, dz, k, stride, pad, workspace=None):
        g = check_conv("conv_input_grad", dx, k, stride, pad, w=w, dz=dz)
        dz = self.view(dz, (g.F, g.positions))

        def implicit():
            self._gemm_own(1.0, w, dz, 0.0, self.view(dx, (g.C, g.H * g.W * g.N)), False, False,
                           g.C, g.H * g.W * g.N, g.F * g.k * g.k, Gather(2, g, None, "conv dgrad"))

        def im2col():
            for i, (j0, dcols) in enumerate(self._patch_chunks(g, workspace)):
                self._gemm_columns(1.0, w, dz, 0.0, dcols, True, False, j0)
                self.col2im(dx, dcols, k, stride, pad, j0, add=i > 0)
        paths = {"implicit": implicit, "im2col": im2col}
        paths[self._conv_path(("conv_input_grad", *g, *_storage_key(self, dz)), paths, g,
                              workspace)]()

    def _gemm_columns(self, alpha, a, b, beta, c, trans_a, trans_b, j0):
        """One chunk's product in a convolution's im2col path: the patch chunk is b (the
        forward, the weight gradient: columns j0.. of the other operand, a or c, pair with
        it) or c (the input gradient: with columns j0.. of b). Where the chunk is the whole
        matrix, gemm (routed to our kernel or the vendor's as any product); else the
        vendor's GEMM, which takes the wider matrix's leading dimension."""
        chunk = c if trans_a else b
        cols = chunk.shape[1]
        if trans_b:                     # weight gradient: a (F, positions) . chunk^T
            wide, m, n, k = a, a.shape[0], b.shape[0], cols
        elif trans_a:                   # input gradient: a^T (rows, F) . b (F, positions)
            wide, m, n, k = b, a.shape[1], cols, a.shape[0]
        else:                           # forward: a (F, rows) . chunk into c (F, positions)
            wide, m, n, k = c, a.shape[0], cols, a.shape[1]
        if cols == wide.shape[1]:
            self.gemm(alpha, a, b, beta, c, trans_a, trans_b)
        elif trans_b:
            self._gemm_vendor_pieces(alpha, _columns(a, j0), b, beta, c, False, True, m, n, k)
        elif trans_a:
            self._gemm_vendor_pieces(alpha, a, _columns(b, j0), beta, c, True, False, m, n, k)
        else:
            self._gemm_vendor_pieces(alpha, a, b, beta, _columns(c, j0), False, False, m, n, k,
                                     ldc=c.shape[1])

    def _conv_path(self, key, paths, g, workspace, restore=()):
        """The path a convolution takes: of those that apply here (direct for short
        patches; im2col with a workspace that holds the whole patch matrix, or, with a
        vendor GEMM, chunks of at least MIN_CHUNK columns), the one PORTANET_CONV or
        PORTANET_GEMM forces, or the fastest."""
        room = workspace.size // g.rows if workspace is not None else 0
        if not (_holds_all(g, workspace) or self.vendor_gemm and room >= MIN_CHUNK):
            paths.pop("im2col")
        if "direct" in paths and g.rows > DIRECT_ROWS:
            paths.pop("direct")
        if self.conv_path in paths:
            return self.conv_path
        if self.gemm_path == "vendor" and "im2col" in paths:
            return "im2col"
        if self.gemm_path != "auto" and len(paths) > 1:
            paths.pop("im2col", None)
        if len(paths) == 1:
            return next(iter(paths))
        key += (tuple(sorted(paths)),)      # im2col's room differs between networks
        return self._routes.get(key) or self._fastest(key, paths, restore)

    def _patch_chunks(self, g, workspace):
        """[(j0, cols)]: the patch matrix's columns in chunks the workspace holds, cols a
        view of it (C.k.k, columns)."""
        step = min(workspace.size // g.rows, g.positions)
        return [(j0, self.view(workspace, (g.rows, min(step, g.positions - j0))))
                for j0 in range(0, g.positions, step)]
