"""The convolution's paths, each a strategy (`Implicit`, `Im2col`, `Direct`) that says
whether it runs a product (`applies`), the workspace it needs (`workspace`) and runs it
(`run`): the implicit GEMM (our GEMM kernel gathering its patches, `Gather`), im2col into
a workspace then GEMM (in chunks of columns where the workspace is smaller than the patch
matrix), and conv_direct for short patches. Of the strategies that apply to a product, one
is pinned (PORTANET_CONV, `pinned`) or measured once per shape where routing is auto
(`_conv_path`) and kept with the GEMM routes."""
import functools

from .. import config
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


FORWARD, BACKWARD_DATA, BACKWARD_FILTER = "forward", "backward_data", "backward_filter"


class Forward:
    """One call of conv, as its strategies read it: its shape g (ConvShape), the workspace
    (or None) and the operands, z and a viewed as (F, positions); stored: z + b's 16-bit
    copy (or None), half: whether the outputs are in 16-bit storage."""
    name = FORWARD
    __slots__ = ("g", "workspace", "x", "kind", "w", "b", "z", "a", "stored", "half")

    def __init__(self, g, workspace, x, kind, w, b, z, a, stored, half):
        self.g, self.workspace, self.x, self.kind, self.w = g, workspace, x, kind, w
        self.b, self.z, self.a, self.stored, self.half = b, z, a, stored, half


class BackwardData:
    """One call of conv_input_grad: dx <- the input gradient of w and dz (F, positions),
    or with add dx + that."""
    name = BACKWARD_DATA
    __slots__ = ("g", "workspace", "w", "dz", "dx", "add")

    def __init__(self, g, workspace, w, dz, dx, add=False):
        self.g, self.workspace, self.w, self.dz, self.dx = g, workspace, w, dz, dx
        self.add = add


class BackwardFilter:
    """One call of conv_weight_grad: gw <- alpha dz . cols(x)^T + beta gw; patches: the
    workspace holds x's whole patch matrix already."""
    name = BACKWARD_FILTER
    __slots__ = ("g", "workspace", "x", "alpha", "beta", "dz", "gw", "patches")

    def __init__(self, g, workspace, x, alpha, beta, dz, gw, patches):
        self.g, self.workspace, self.x, self.alpha, self.beta = g, workspace, x, alpha, beta
        self.dz, self.gw, self.patches = dz, gw, patches


class Strategy:
    """A way to compute convolution products, written once for every shape: `applies`
    to a product's call (Forward, BackwardData, BackwardFilter) on a backend, needs
    `workspace(bk, g)` bytes of the conv workspace and `run`s one by its method of the
    product's name (forward, backward_data, backward_filter)."""
    name = None

    def applies(self, bk, p):
        """Whether this strategy can run the product's call p on backend bk."""
        return True

    def workspace(self, bk, g):
        """The fewest bytes of conv workspace this strategy runs a product of shape g with."""
        return 0

    def run(self, bk, p):
        """Launch the kernels of the product's call p on bk."""
        getattr(self, p.name)(bk, p)


class Implicit(Strategy):
    """Our GEMM kernel reading the patches from the images itself (gemm.cl's CONV,
    `Gather`): every product, no workspace; the forward adds the bias and activates in the
    GEMM's epilogue where it can."""
    name = "implicit"

    def forward(self, bk, p):
        g = p.g
        fused = None if p.kind == "softmax" or p.half else p.kind
        if not bk._gemm_own(1.0, p.w, p.x, 0.0, p.z, False, False, g.F, g.positions, g.rows,
                            Gather(1, g, p.w, "conv", fused, p.a, p.b)):
            bk.bias_activation(p.kind, p.z, p.b, p.a, stored=p.stored)

    def backward_data(self, bk, p):
        g = p.g
        dx = bk.view(p.dx, (g.C, g.H * g.W * g.N))
        bk._gemm_own(1.0, p.w, p.dz, 1.0 if p.add else 0.0, dx, False, False, g.C,
                     g.H * g.W * g.N, g.F * g.k * g.k, Gather(2, g, None, "conv dgrad"))

    def backward_filter(self, bk, p):
        g = p.g
        bk._gemm_own(p.alpha, p.dz, p.x, p.beta, p.gw, False, True, g.F, g.rows, g.positions,
                     Gather(3, g, p.dz, "conv wgrad"))


class Im2col(Strategy):
    """The patch matrix written into the workspace (im2col; col2im for the input gradient)
    and multiplied by gemm: every product where the workspace holds the whole matrix, or,
    with a vendor GEMM (which takes a chunk's leading dimension), chunks of at least
    MIN_CHUNK of its columns."""
    name = "im2col"

    def applies(self, bk, p):
        ws = p.workspace
        return ws is not None and ws.size * bk.dtype.itemsize >= self.workspace(bk, p.g)

    def workspace(self, bk, g):
        columns = min(MIN_CHUNK, g.positions) if bk.vendor_gemm else g.positions
        return g.rows * columns * bk.dtype.itemsize

    def forward(self, bk, p):
        g = p.g
        for j0, cols in bk._patch_chunks(g, p.workspace):
            bk.im2col(cols, p.x, g.k, g.stride, g.pad, j0)
            bk._gemm_columns(1.0, p.w, cols, 0.0, p.z, False, False, j0)
        bk.bias_activation(p.kind, p.z, p.b, p.a, stored=p.stored)

    def backward_data(self, bk, p):
        g = p.g
        for i, (j0, dcols) in enumerate(bk._patch_chunks(g, p.workspace)):
            bk._gemm_columns(1.0, p.w, p.dz, 0.0, dcols, True, False, j0)
            bk.col2im(p.dx, dcols, g.k, g.stride, g.pad, j0, add=i > 0 or p.add)

    def backward_filter(self, bk, p):
        g = p.g
        for i, (j0, cols) in enumerate(bk._patch_chunks(g, p.workspace)):
            if not p.patches:               # the forward left them in the workspace
                bk.im2col(cols, p.x, g.k, g.stride, g.pad, j0)
            bk._gemm_columns(p.alpha, p.dz, cols, p.beta if i == 0 else 1.0, p.gw, False, True,
                             j0)


class Direct(Strategy):
    """conv_direct: a work-item per output position and DIRECT_F filters, summing the patch
    itself; the forward only, for patches of at most DIRECT_ROWS, not softmax (over the
    filters, not elementwise), and its images and outputs stored alike (one STORED type)."""
    name = "direct"

    def applies(self, bk, p):
        return (p.name == FORWARD and p.kind != "softmax" and p.g.rows <= DIRECT_ROWS
                and bk._stored(p.x) == p.half)

    def forward(self, bk, p):
        g = p.g
        bk._run("conv_direct", (g.positions, -(-g.F // DIRECT_F)),
                p.stored if p.half else p.z, p.a, p.w, p.b, p.x, g.F, *g[1:], ACT[p.kind],
                stored=p.half)


STRATEGIES = (Implicit(), Im2col(), Direct())   # in the order routing times them
BY_NAME = {s.name: s for s in STRATEGIES}


class ConvPaths:
    """KernelBackend's convolutions (see the module's docstring)."""

    conv_paths = config.CONV_PATHS      # what `pinned` takes

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
        p = Forward(g, workspace, x, kind, w, b, z, a, stored, half)
        path = self._conv_path(("conv", kind, *g, *_storage_key(self, x, a)), p)
        path.forward(self, p)
        return path.name == "im2col" and _holds_all(g, workspace)

    def conv_weight_grad(self, alpha, dz, x, beta, gw, k, stride, pad, workspace=None,
                         patches=False):
        g = check_conv("conv_weight_grad", x, k, stride, pad, gw=gw, dz=dz)
        dz = self.view(dz, (g.F, g.positions))
        patches = patches and _holds_all(g, workspace)
        p = BackwardFilter(g, workspace, x, alpha, beta, dz, gw, patches)
        self._conv_path(("conv_weight_grad", patches, *g, *_storage_key(self, x, dz)), p,
                        restore=[gw] if beta != 0 else []).backward_filter(self, p)

    def conv_input_grad(self, dx, w, dz, k, stride, pad, workspace=None, add=False):
        g = check_conv("conv_input_grad", dx, k, stride, pad, w=w, dz=dz)
        dz = self.view(dz, (g.F, g.positions))
        p = BackwardData(g, workspace, w, dz, dx, add)
        self._conv_path(("conv_input_grad", add, *g, *_storage_key(self, dz)), p,
                        restore=[dx] if add else []).backward_data(self, p)

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

    def _conv_path(self, key, p, restore=()):
        """The strategy that runs the product's call p: of those that apply to it, the one pinned
        (conv_path: PORTANET_CONV or `pinned`), im2col where the GEMM is pinned to the
        vendor's, one of ours where it is pinned to ours, else the route measured for key
        (`_fastest`, the arrays in `restore` put back after its trials)."""
        ways = [s.name for s in STRATEGIES if s.applies(self, p)]
        if self.conv_path in ways:
            return BY_NAME[self.conv_path]
        if "im2col" in ways and self.gemm_path != "auto":
            if self.gemm_path == "vendor":
                return BY_NAME["im2col"]
            if len(ways) > 1:
                ways.remove("im2col")
        if len(ways) == 1:
            return BY_NAME[ways[0]]
        key += (tuple(sorted(ways)),)       # im2col's room differs between networks
        name = self._routes.get(key) or self._fastest(
            key, {name: functools.partial(BY_NAME[name].run, self, p) for name in ways},
            restore)
        return BY_NAME[name]

    def _patch_chunks(self, g, workspace):
        """[(j0, cols)]: the patch matrix's columns in chunks the workspace holds, cols a
        view of it (C.k.k, columns)."""
        step = min(workspace.size // g.rows, g.positions)
        return [(j0, self.view(workspace, (g.rows, min(step, g.positions - j0))))
                for j0 in range(0, g.positions, step)]
