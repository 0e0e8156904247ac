"""The GEMM paths and the products built on them: our tiled kernel (split in K where the
tiles are too few, in launches of at most ACC_K terms), the vendor's (in pieces of
vendor_k terms), the tensor-core kernel; dense, gemv, ger and the bias gradient. Each
runtime supplies its vendor call; which path runs a shape is the router's
(router.py)."""
import functools

from ...errors import ShapeError
from ..arrays import ACT, DeviceArray
from ..base import ACC_K
from ..checks import check_activation, check_gemm
from .tiling import _k_pieces, gemm_options, split_lanes
from ..shadows import _kept_key


def _pieces(a, b, trans_a, trans_b, k, longest=ACC_K):
    """(a_p, b_p, k_p) for each of _k_pieces: a_p, b_p are a and b from the piece's first
    term on (the arrays at another offset; their leading dimensions stay)."""
    pieces = []
    for k0, kp in _k_pieces(k, longest):
        a_off = a.offset + (k0 * a.shape[1] if trans_a else k0)   # K runs down op(a)'s
        b_off = b.offset + (k0 if trans_b else k0 * b.shape[1])   # columns, op(b)'s rows
        pieces.append((DeviceArray(a.buf, a_off, a.shape, a.dtype, a),
                       DeviceArray(b.buf, b_off, b.shape, b.dtype, b), kp))
    return pieces


def _piece_text(i, count):
    """' piece 2/3' in a profile's label for the later pieces of a product cut in K."""
    return f" piece {i + 1}/{count}" if count > 1 else ""


def _shape_text(m, n, k, trans_a, trans_b):
    """'NT 32x144x147456': the transposes and m x n x k of a gemm, for profiles."""
    return f"{'T' if trans_a else 'N'}{'T' if trans_b else 'N'} {m}x{n}x{k}"


class GemmPaths:
    """KernelBackend's GEMM paths (see the module's docstring)."""

    @property
    def _own_is_tensor(self):
        """PORTANET_GEMM=own on a backend whose own GEMM is its tensor-core one."""
        return self.gemm_path == "own" and self.tensor_gemm

    def _gemm_tensor(self, alpha, a, b, beta, c, trans_a, trans_b, m, n, k, label):
        """c <- alpha op(a) op(b) + beta c on the tensor cores, in one launch (backends
        with tensor_gemm)."""
        raise NotImplementedError

    @property
    def finishes_splits(self):
        """Whether a split K's last part adds the parts up in the same launch (gemm.cl's
        SPLIT_K 2) here, instead of gemm_split_sum after it."""
        return self.finish_options is not None

    def gemm(self, alpha, a, b, beta, c, trans_a=False, trans_b=False):
        m, n, k = check_gemm(a, b, c, trans_a, trans_b)
        if m == 0 or n == 0:
            return                          # no output (CLBlast refuses empty products)
        if k == 0:
            self._empty_sum(beta, c)
            return
        path, tiling = self.gemm_path, None
        if path == "auto":
            key = (m, n, k, trans_a, trans_b)
            path = self._routes.get(key) or self._route(a, b, beta, c, trans_a, trans_b,
                                                        m, n, k)
            tiling = self._route_tilings.get(key)
        if path == "vendor":
            self._gemm_vendor_pieces(alpha, a, b, beta, c, trans_a, trans_b, m, n, k)
        elif path == "vendor_t":
            self._gemm_vendor_t(alpha, a, b, beta, c, trans_a, trans_b, m, n, k)
        elif path == "tensor" or self._own_is_tensor:
            self._gemm_tensor_pieces(alpha, a, b, beta, c, trans_a, trans_b, m, n, k)
        else:
            self._gemm_own(alpha, a, b, beta, c, trans_a, trans_b, m, n, k, tiling=tiling)

    def dense(self, kind, w, x, b, z, a):
        """z <- w x + b 1^T, a <- f(z). Our GEMM adds the bias and activates in its
        epilogue (or gemm_split_sum's, where that adds a split K up): one launch fewer than
        the product and bias_activation. Routed as a whole per shape (the vendor's GEMM, then
        bias_activation, against ours, fused where it splits), since the launch it saves
        is what decides small products on some drivers (6-8 us on NVIDIA's OpenCL)."""
        check_activation(kind)
        m, n, k = check_gemm(w, x, z, False, False)
        self._fresh.discard(_kept_key(a))   # only bias_activation writes its copy too
        if kind == "softmax" or 0 in (m, n, k) or self.gemm_path == "vendor" or \
                self._own_is_tensor:
            super().dense(kind, w, x, b, z, a)          # gemm, then bias_activation
            return

        def own(tiling=None):
            if not self._gemm_own(1.0, w, x, 0.0, z, False, False, m, n, k, then=(kind, b, a),
                                  tiling=tiling):
                self.bias_activation(kind, z, b, a)

        def vendor():
            self._gemm_vendor_pieces(1.0, w, x, 0.0, z, False, False, m, n, k)
            self.bias_activation(kind, z, b, a)

        def vendor_t():
            self._gemm_vendor_t(1.0, w, x, 0.0, z, False, False, m, n, k)
            self.bias_activation(kind, z, b, a)

        def tensor():
            self._gemm_tensor_pieces(1.0, w, x, 0.0, z, False, False, m, n, k)
            self.bias_activation(kind, z, b, a)
        path, tiling = self.gemm_path, None
        if path == "auto":
            key = ("dense", m, n, k)
            path = self._routes.get(key) or self._fastest_tiling(key, m, n, k, own, vendor,
                                                                 tensor, vendor_t=vendor_t)
            tiling = self._route_tilings.get(key)
        if path == "vendor":
            vendor()
        elif path == "vendor_t":
            vendor_t()
        elif path == "tensor":
            tensor()
        else:
            own(tiling)

    def _gemm_vendor_pieces(self, alpha, a, b, beta, c, trans_a, trans_b, m, n, k, ldc=None):
        """The vendor's gemm, in calls of at most vendor_k terms each, added into c
        (c = alpha op(a_1) op(b_1) + beta c, then c += alpha op(a_p) op(b_p)): its sums run
        the whole K in one float accumulator, whose error grows with sqrt(K) (8e-6 at
        K = 150000, uniform inputs). `portanet tune` measures how long a K the vendor keeps
        within bounds on a device; untuned, vendor_k is ACC_K. ldc: c's leading dimension
        where c is columns of a wider matrix (default n)."""
        if self.half_operands is not None:
            a, b = self._operands16(a, b)
        pieces = _pieces(a, b, trans_a, trans_b, k, self.vendor_k)
        for i, (a_p, b_p, kp) in enumerate(pieces):
            beta_p = beta if i == 0 else 1.0
            if self.trace is None:
                self._gemm_vendor(alpha, a_p, b_p, beta_p, c, trans_a, trans_b, m, n, kp,
                                  ldc or n)
            else:
                self.trace.record(
                    self, f"gemm {_shape_text(m, n, k, trans_a, trans_b)} vendor"
                    + _piece_text(i, len(pieces)),
                    lambda: self._gemm_vendor(alpha, a_p, b_p, beta_p, c, trans_a, trans_b,
                                              m, n, kp, ldc or n))

    def _gemm_vendor_t(self, alpha, a, b, beta, c, trans_a, trans_b, m, n, k):
        """c <- alpha op(a) op(b) + beta c by the vendor's GEMM on a^T, copied into the
        transposed-operand workspace, with trans_a flipped: the same product in another
        orientation, which the vendor's kernels take at another rate. On an H100 cuBLAS
        took 20.09 ms for mlp-big's first forward product as our layout asks it
        (column-major NN) and 19.20 with w transposed (NT), whose copy took 0.18
        (docs/gemm.md). Routing offers it for float32 operands where
        the product is large enough for the copy to be paid back (`_transposes`)."""
        at = self.view(self._transposed_workspace(a.size), a.shape[::-1])
        self.transpose(a, at)
        self._gemm_vendor_pieces(alpha, at, b, beta, c, not trans_a, trans_b, m, n, k)

    def _gemm_tensor_pieces(self, alpha, a, b, beta, c, trans_a, trans_b, m, n, k):
        """Our tensor-core GEMM (`tensor_gemm`), in launches of at most ACC_K terms each,
        added into c as _gemm_vendor_pieces adds; a piece it does not take
        (`_tensor_takes`) goes to our FFMA GEMM, which rounds its inputs alike."""
        pieces = _pieces(a, b, trans_a, trans_b, k)
        for i, (a_p, b_p, kp) in enumerate(pieces):
            beta_p = beta if i == 0 else 1.0
            if self._tensor_takes(kp):
                self._gemm_tensor(alpha, a_p, b_p, beta_p, c, trans_a, trans_b, m, n, kp,
                                  f"gemm {_shape_text(m, n, k, trans_a, trans_b)} "
                                  f"{self.precision}" + _piece_text(i, len(pieces)))
            else:
                self._gemm_own(alpha, a_p, b_p, beta_p, c, trans_a, trans_b, m, n, kp)

    def _tensor_takes(self, k):
        """Whether the tensor-core GEMM computes a product (piece) of K terms."""
        return True

    def _empty_sum(self, beta, c):
        """c <- beta c, the result of a product whose sum is empty (K = 0), as BLAS and
        NumPy give it: beta 0 writes zeros over whatever c held."""
        if beta == 0:
            self.fill(c, 0.0)
        else:
            self.scal(beta, c)

    def _gemm_own(self, alpha, a, b, beta, c, trans_a, trans_b, m, n, k, conv=None,
                  then=None, tiling=None):
        """Our tiled gemm kernel: a (TSN/WPTN, TSM/WPTM) work-group per TSM x TSN tile, and
        along dimension 2 the parts of a split K; the tiling and the parts as `_tiling`
        chooses them, or as given (tiling = (params, parts, k_chunk[, finish]): the
        candidates auto routing times). An unsplit K longer than ACC_K runs as launches
        over pieces of K that add into c. A split K of at most FINISH_PARTS parts is added
        up by its last part to finish, in the same launch, where the device orders memory
        for it (`_finishes`) and unless finish is False; else by gemm_split_sum after (the
        last part's sum lengthens the launch's tail by up to 25 us on an H100, more than
        the launch saved, for large tiles in many parts: routing decides). With conv (a
        `Gather`), an operand is gathered from images (gemm.cl's CONV), and the pieces of K start at
        k_base. A layer's bias and activation, then = (kind, bias, a) (a conv forward's
        are the Gather's), are fused into the kernel's epilogue where K runs in one launch
        or its last part adds the split up, else into gemm_split_sum's. Returns whether
        they were."""
        if tiling is None:
            tiling = self._tiling(m, n, k, conv)
        p, parts, k_chunk, *finish = tiling
        if conv is not None and conv.kind is not None:
            then = (conv.kind, conv.bias, conv.a)
        split = 0 if parts == 1 else 2 if self._finishes(parts) and finish != [False] else 1
        fused = then is not None and (split == 2 or (split == 0 and k <= ACC_K))
        frozen = tuple(sorted(p.items()))
        rtsm, rtsn = p["TSM"] // p["WPTM"], p["TSN"] // p["WPTN"]
        tiles_n, tiles_m = -(-n // p["TSN"]), -(-m // p["TSM"])
        fixed = self.conv_fixed
        halves = tuple(f"-D{side}_HALF=1" for side, x in (("A", a), ("B", b))
                       if self._stored(x))                      # 16-bit operands
        key = ("gemm", trans_a, trans_b, split, fused, frozen, *halves) + (
            conv.key(fused, fixed) if conv else ())
        if key not in self._kernels:
            self._kernels[key] = self._build("gemm", "gemm", gemm_options(
                trans_a, trans_b, dict(p, SPLIT_K=split)) + self._register_cap(p)
                + (conv.options(fused, fixed) if conv else [f"-DBIAS_ACT={int(fused)}"])
                + (self.finish_options if split == 2 else []) + list(halves))
        label = (f"{conv.label if conv else 'gemm'} {_shape_text(m, n, k, trans_a, trans_b)} "
                 f"own {p['TSM']}x{p['TSN']}" + (f" split-K {parts}" if parts > 1 else ""))

        def launch(out, a, b, alpha, beta, k, k_chunk, k_base=0, label=label, tail=()):
            vw = p["VW"]                # whole runs load as vectors where 16-byte aligned
            vec_a, vec_b = (vw > 1 and (conv.vector(x, vw) if conv else
                                        x.offset % vw == 0 and x.shape[1] % vw == 0)
                            for x in (a, b))
            extra = (conv.args(k_base, fused) if conv else
                     (then[2], then[1], ACT[then[0]]) if fused else ())
            self._run(self._kernels[key], (tiles_n * rtsn, tiles_m * rtsm, parts), out, a, b,
                      alpha, beta, m, n, k, a.shape[1], b.shape[1], k_chunk, vec_a, vec_b,
                      *extra, *tail, local=(rtsn, rtsm, 1), label=label)
        if split == 2:                  # partial products into the workspace, added up
            tail = (self._split_workspace(parts * m * n), self._split_counts(tiles_m * tiles_n))
            launch(c, a, b, float(alpha), float(beta), k, k_chunk, tail=tail)
            return fused
        if split == 1:                  # partial products into the workspace, then summed
            ws = self._split_workspace(parts * m * n)
            launch(ws, a, b, 1.0, 0.0, k, k_chunk)
            self._split_sum(alpha, ws, beta, c, m * n, parts, then, n)
            return then is not None
        pieces = (_pieces(a, b, trans_a, trans_b, k, ACC_K) if conv is None
                  else [(a, b, kp, k0) for k0, kp in _k_pieces(k, ACC_K)])
        for i, (a_p, b_p, kp, *k_base) in enumerate(pieces):
            launch(c, a_p, b_p, float(alpha), float(beta) if i == 0 else 1.0, kp, kp, *k_base,
                   label=label + _piece_text(i, len(pieces)))
        return fused

    def gemv(self, alpha, a, x, beta, y, trans_a=False):
        rows, cols = a.shape
        if x.size != (rows if trans_a else cols) or y.size != (cols if trans_a else rows):
            raise ShapeError(f"gemv: a {a.shape} trans={trans_a}, x {x.shape}, y {y.shape}")
        if y.size == 0:
            return
        if x.size == 0:
            self._empty_sum(beta, y)
            return
        if trans_a:
            self._run("gemv_t", (cols,), y, a, x, float(alpha), float(beta), rows, cols)
            return
        self._row_way("gemv", rows, cols,
                      lambda parts: self._gemv_rows(alpha, a, x, beta, y, parts),
                      restore=[y] if beta else [])()

    def _gemv_rows(self, alpha, a, x, beta, y, parts, kind=None):
        """y <- alpha a x + beta y by gemv's row groups, each row's columns in `parts`
        pieces: one writes y; several write the parts of a split sum, added up after.
        With an activation's code `kind`, activation_bias_grad's: a is z, x is da, and the
        sum is over the delta f'(z) . da, which replaces z."""
        rows, cols = a.shape
        chunk = -(-cols // parts)
        parts, threads = -(-cols // chunk), self.gemv_threads
        name = "gemv" if kind is None else "activation_bias_grad"
        operands = (a, x) if kind is None else (a, x, *self._copy_beside(a), kind)
        out = y if parts == 1 else self._split_workspace(parts * rows)
        self._run(name, (rows * threads, parts), out, *operands,
                  *((alpha, beta) if parts == 1 else (1.0, 0.0)), rows, cols, chunk,
                  local=(threads, 1), label=name + (f" {rows}x{cols} split {parts}"
                                                    if parts > 1 else ""),
                  stored=self._stored(a))
        if parts > 1:
            self._split_sum(alpha, out, beta, y, rows, parts)

    def _split_sum(self, alpha, parts_ws, beta, c, n, parts, then=None, cols=1):
        """c <- alpha (the sum of the n-element parts in parts_ws) + beta c: gemm_split_sum
        with split_lanes lanes per output. then = (kind, bias, a): c is a layer's z of
        `cols` columns, and the sum goes on to z <- z + bias 1^T, a <- f(z)."""
        lanes, threads = split_lanes(parts, self.gemv_threads), self.gemv_threads
        kind, bias, act = then or (None, c, c)      # without: c stands in (never read)
        self._run("gemm_split_sum", (n, lanes), c, parts_ws, float(alpha), float(beta), n,
                  parts, lanes, bias, act, -1 if kind is None else ACT[kind], cols,
                  local=(threads // lanes, lanes))

    def activation_bias_grad(self, kind, z, da, alpha, beta, gb, ones):
        """activation_grad and the bias gradient gemv(alpha, z, ones, beta, gb) in one
        kernel (activation_bias_grad in blas.cl): gemv's row groups. Few long rows (a conv
        layer's channels) are routed as gemv's are, whole or in pieces, and against the two
        kernels apart: one group per row and piece has less parallelism than
        activation_grad's one work-item per element (an H100 under ncu: 133 us fused
        against 73 apart for 32 rows of 147456, in pieces; the launch it saves decides
        short rows)."""
        check_activation(kind, derivative=True)
        rows, cols = z.shape
        if da.shape != z.shape or ones.size != cols or gb.size != rows:
            raise ShapeError(f"activation_bias_grad: z {z.shape}, da {da.shape}, ones "
                             f"{ones.shape}, gb {gb.shape}")
        if rows == 0 or cols == 0:
            self.gemv(alpha, z, ones, beta, gb)
            return
        if self._stored(z):                 # 16 bits: gemv's row groups, whole or in pieces
            self._row_way("activation_bias_grad_stored", rows, cols,
                          lambda parts: self._gemv_rows(alpha, z, da, beta, gb, parts,
                                                        ACT[kind]),
                          restore=[z, gb])()
            return
        self._fresh.discard(_kept_key(z))   # each way writes z's copy where it is kept
        apart = functools.partial(super().activation_bias_grad, kind, z, da, alpha, beta,
                                  gb, ones)             # activation_grad, then gemv
        self._row_way("activation_bias_grad", rows, cols,
                      lambda parts: self._gemv_rows(alpha, z, da, beta, gb, parts, ACT[kind]),
                      restore=[z, gb], apart=apart)()

    def ger(self, alpha, x, y, a):
        rows, cols = a.shape
        if x.size != rows or y.size != cols:
            raise ShapeError(f"ger: x {x.shape}, y {y.shape} do not fit a {a.shape}")
        self._run("ger", (cols, rows), a, x, y, float(alpha), rows, cols)
