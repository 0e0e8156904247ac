"""What the OpenCL and CUDA backends share: device arrays (buffer + offset + shape), the
argument packing and dispatch of the kernel twins in kernels_cl/ and kernels_cu/, and GEMM
parameter choice. Each backend supplies memory, `_launch` and its two GEMM paths."""
import dataclasses
import functools
import hashlib
import logging
import math
import time
import weakref

import numpy as np

from .. import config
from ..errors import ShapeError
from ..precision import PRECISIONS, to_storage
from . import routes, sources
from .base import (ACC_K, Backend, check_activation, check_activation_grad, check_adam,
                   check_add_activation, check_alike, check_conv, check_found, check_gather,
                   check_gemm, check_loss_scale, check_norm_grad, check_norm_kind,
                   check_pool, check_rows, check_skip, check_stored, check_transpose,
                   check_update, conv_out, log_beta)
from .gemm_tiling import (CONV_TILES, GEMM_DEFAULTS, SMALL_TILES, WORK_ITEMS_PER_UNIT, _halved,
                          _k_pieces, _thinned, _tiles, gemm_fits, gemm_options, gemm_params,
                          gemv_parts, k_parts, norm_parts, split_k, split_lanes)
from .tuned import capped

log = logging.getLogger("portanet")

# how norm.cl's kernels share a row (BN_* there): one group, or pieces in these launches
BN_WHOLE, BN_SUMS, BN_SQUARES, BN_APPLY = 0, 1, 2, 3

# activation codes, as ACT_* in prelude.h
ACT = {"linear": 0, "relu": 1, "sigmoid": 2, "tanh": 3, "softmax": 4, "leaky_relu": 5, "elu": 6,
       "gelu": 7, "silu": 8}

MAX_GROUPS_1 = 65535       # the most work-groups in dimension 1 of a CUDA launch
# the most samples one features_first launch lays out: its dimension 1 in groups of 8
# stays within MAX_GROUPS_1
STAGED_SAMPLES = 8 * MAX_GROUPS_1

# the least part of a batch write_samples sends through the copy lane: a smaller one (a
# training step's batch) goes by a plain write, which the driver stages at once, without
# the lane's pinned copy, events and waits (measured: at batch 64 the lane cost NVIDIA's
# OpenCL 150 us a batch, and pinned writes without it gained nothing beyond the noise;
# docs/batches.md)
LANE_BYTES = 2**20

# kernel family (file stem) -> kernel names, the same in kernels_cl/ and kernels_cu/
FAMILIES = {"elementwise": ("fill", "axpy", "scal", "copy", "copy_bytes", "bias_activation",
                            "bias_activation_stored",
                            "activation_grad", "activation_delta", "add_activation",
                            "gather_columns", "gather_labels", "gather_batch", "features_first",
                            "transpose",
                            "momentum_updates", "momentum_update", "sgd_update", "adam_update",
                            "rmsprop_update",
                            "scale_by", "unscale_check", "adam_scalars", "update_loss_scale"),
            "loss": ("bias_softmax", "softmax_xent", "bias_softmax_xent",
                     "bias_softmax_xent_grad", "sigmoid_bce", "mse", "argmax"),
            "blas": ("gemv", "gemv_t", "ger", "gemm_split_sum", "activation_bias_grad"),
            "conv": ("im2col", "col2im", "conv_direct", "maxpool", "maxpool_grad", "avgpool",
                     "avgpool_grad", "dropout"),
            "norm": ("batchnorm_train", "batchnorm_infer", "batchnorm_grad")}
FAMILY_OF = {name: family for family, names in FAMILIES.items() for name in names}


class DeviceArray:
    """A device buffer, an offset in elements and a row-major shape. An array made by
    `empty` owns its buffer (base None); a view shares `buf` and keeps its owner alive in
    `base`, so that the buffer stays allocated, and counted, as long as any view uses it."""
    __slots__ = ("buf", "offset", "shape", "dtype", "base", "__weakref__")

    def __init__(self, buf, offset, shape, dtype, base=None):
        self.buf, self.offset, self.shape, self.dtype, self.base = (
            buf, offset, tuple(shape), np.dtype(dtype), base)

    @property
    def size(self):
        return math.prod(self.shape)

    @property
    def nbytes(self):
        return self.size * self.dtype.itemsize

    def __repr__(self):
        return f"DeviceArray(shape={self.shape}, dtype={self.dtype}, offset={self.offset})"


class Recorded:
    """A training step a backend recorded (`capture`); calling it replays the step.
    `current` turns False once the backend has freed something the recording points at
    (its GEMM workspace grew for another product, its kernels were rebuilt): record again."""

    def __init__(self, backend):
        self.backend, self.generation = backend, backend.generation

    @property
    def current(self):
        return self.generation == self.backend.generation


class KernelBackend(Backend):
    """A backend that runs portanet's kernels. Subclasses implement empty (which returns
    `self._track(DeviceArray(buf, ...), nbytes, buf)`), write, download, _free_buffer(buf),
    _kernel(family, name, options) (build once, cached), _launch(kernel, global_size,
    local_size, args), _pointer(array), _gemm_vendor and memory_info, and call
    _load_kernels() once their context is ready."""

    serialised = True           # see Backend.serialised
    trace = None                # a profiler.Trace while `portanet profile` records a step
    _routes = None              # measured paths (auto): GEMM (m, n, k, trans_a, trans_b) ->
    #                             "vendor" | "own" (`_tiling`'s) | "own ..." (another of
    #                             `_candidates`, kept in _route_tilings); ("dense", m, n,
    #                             k) likewise; conv keys -> a conv path; ("gemv", rows,
    #                             cols) -> "whole" | "split"
    _route_tilings = None       # GEMM and dense keys routed to our kernel -> its tiling
    generation = 0              # bumped when what recorded steps point at goes away
    gemv_threads = 256          # work-items of gemv's group (blas.cl), within the limits
    vendor_k = ACC_K            # the longest sum one vendor gemm call may run (accuracy)
    gemm_sizes = {}             # tuned tilings by size class (set_gemm_params)
    _derived = None             # what _per_tiling made from each tiling, by tiling and use
    stages_samples = True
    _turn = 0                   # the half of a staging buffer write_samples used last
    _staged_in = None           # and that buffer: (id of its memory, offset, size)
    tensor_gemm = False         # a tensor-core GEMM of ours computes this backend's products in
    #                             its precision (CUDA's mma.cu in tf32, wgmma.cu in bf16 and
    #                             fp16 on Hopper, `_tensor_takes`): `_gemm_tensor_pieces`,
    #                             "tensor" among routing's paths, and PORTANET_GEMM=own's GEMM
    half_operands = None        # the vendor GEMM's 16-bit input type where it takes one (CUDA's
    #                             bf16 and fp16: the operands rounded into a workspace first)
    _never = None               # the skip flag of updates given none (_skip), made once
    finish_options = None       # build options of gemm's SPLIT_K 2 (a split K added up by its
    #                             last part) where the device orders memory for it, or None

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

    def _load_kernels(self):
        """Kernels are built when first launched, not all at once: a network uses a dozen of
        the thirty, and a first build is slow on some drivers (PoCL compiles each kernel
        again for each work-group size, a second or so each)."""
        self._routes, self._route_tilings = {}, {}
        self._route_file = None             # PORTANET_ROUTES' routes of this backend (_kept_route)
        self._kernels = {}
        self._announced = False
        self._shadows = weakref.WeakKeyDictionary()     # keep_operands: array -> 16-bit copy
        self._keeping, self._fresh = set(), set()
        self.conv_path = config.conv_path()
        # implicit-GEMM kernels with the image sizes compiled in (a build per layer and
        # batch size) on GPUs, where the gathers' divisions cost most; CPUs (PoCL builds
        # slowly) take them as arguments
        self.conv_fixed = self.is_gpu
        # routing times other tilings of our GEMM (`_candidates`) on GPUs, whose drivers
        # build a variant in a second or less; not on CPUs (PoCL takes several), nor on a
        # CPU held to a GPU's limits (PORTANET_CL_LIMITS) in the tests
        self.searches_tilings = self.is_gpu and capped(self) is None
        # SGD's update of up to UPDATE_LAYERS layers in one launch of STEPS elements a
        # work-item on GPUs (a launch costs NVIDIA's OpenCL 6-8 us of host time, and one
        # element a work-item left an H100's bandwidth unused); a launch a layer of one
        # element a work-item on CPUs, where that kernel ran 1.3-4.6 times (PoCL) and 6-220
        # times (Intel's runtime) faster (elementwise.cl, momentum_update)
        self.fused_updates = self.is_gpu

    def gemm_path_asked(self):
        """PORTANET_GEMM's path, "own" where it asks for a vendor GEMM the backend lacks.
        auto without one still routes among our own paths: tilings, gemv's row splits, the
        fused loss, the convolution paths."""
        path = config.gemm_path()
        return "own" if path == "vendor" and not self.vendor_gemm else path

    def build_all(self):
        """Build every kernel family (`portanet devices --check` does, to see that each
        compiles here); seconds taken."""
        start = time.perf_counter()
        for name in FAMILY_OF:
            self._named(name)
        return time.perf_counter() - start

    def _named(self, name, stored=False):
        """The kernel `name` of FAMILIES, built on first use; with stored, its build for
        16-bit storage (copies.h's STORED_HALF: the arrays it declares STORED are 16-bit)."""
        key = (name, "stored") if stored else name
        kernel = self._kernels.get(key)
        if kernel is None:
            kernel = self._kernels[key] = self._build(
                FAMILY_OF[name], name, ["-DSTORED_HALF=1"] if stored else [])
        return kernel

    def _build(self, family, name, options=()):
        """Build through the backend's _kernel (whose driver caches binaries on disk under
        self.cache_dir, keyed by source, options, device and driver), saying so once per
        device the first time this version's kernels are built there: a first build can
        take a minute, and nothing else would explain the wait."""
        if not self._announced:
            self._announced = True
            marker = config.cache_dir() / "built" / self._sources_id()
            if not marker.exists():
                log.info("building kernels for %s (%s): first use, cached in %s", self.name,
                         self.info()["name"], self.cache_dir)
                try:
                    marker.parent.mkdir(parents=True, exist_ok=True)
                    marker.touch()
                except OSError:
                    pass                    # a read-only cache: the note comes each time
        if family in ("blas", "norm", "loss"):  # row groups: their local memory and tree
            options = [*options, f"-DGROUP_THREADS={self.gemv_threads}"]
        start = time.perf_counter()
        kernel = self._kernel(family, name, list(options))
        log.debug("%s: built %s %s in %.2f s", self.name, name, " ".join(options),
                  time.perf_counter() - start)
        return kernel

    @property
    def cache_dir(self):
        """Where this backend's compiled kernels are kept."""
        return config.cache_dir() / f"kernels-{self.kind}"

    def _sources_id(self):
        """A digest of this device (and driver) and of every kernel source."""
        digest = hashlib.sha256(repr(self._device_id()).encode())
        for family in (*FAMILIES, "gemm"):
            digest.update(sources.load(family, self.lang)[1].encode())
        return digest.hexdigest()[:20]

    def _run(self, kernel, global_size, *args, local=None, label=None, stored=False):
        """Launch with arguments packed: a DeviceArray as (pointer, offset), a Python or
        NumPy int as int32, a float as the backend's real. Callers pass reals as floats.
        label names the launch in a profile (default: the kernel's name). A kernel named
        by a string is built on first use, with stored in its 16-bit storage build."""
        if isinstance(kernel, str):
            label, kernel = label or kernel, self._named(kernel, stored)
        packed = []
        for x in args:
            if isinstance(x, DeviceArray):
                packed += [self._pointer(x), np.int32(x.offset)]
            elif isinstance(x, (bool, int, np.integer)):
                packed.append(np.int32(x))
            elif isinstance(x, (float, np.floating)):
                packed.append(self.dtype.type(x))
            else:
                raise TypeError(f"kernel argument {x!r} of type {type(x).__name__}")
        if self.trace is None:
            self._launch(kernel, global_size, local, packed)
        else:
            self.trace.record(self, label, lambda: self._launch(kernel, global_size, local, packed))

    def _oom_text(self, label, shape, nbytes, free, total):
        return (f"cannot allocate {label} {shape} ({nbytes / 2**20:.1f} MiB) on "
                f"{self.info()['name']}: {free / 2**20:.0f} MiB of {total / 2**20:.0f} MiB are "
                f"free; use a smaller batch or network")

    # -- memory --------------------------------------------------------------------------

    def view(self, x, shape, offset=0):
        shape = (shape,) if np.isscalar(shape) else tuple(shape)
        if offset + math.prod(shape) > x.size:
            raise ShapeError(f"view {shape} at {offset} does not fit in {x}")
        return DeviceArray(x.buf, x.offset + int(offset), shape, x.dtype,
                           base=x if x.base is None else x.base)

    def _check_write(self, dst, host):
        if self._stored(dst) and np.asarray(host).dtype != dst.dtype:   # (not its own bits)
            host = to_storage(host, self.precision)
        host = np.ascontiguousarray(host, dtype=dst.dtype)
        if host.size != dst.size:
            raise ShapeError(f"write: host array of {host.shape} into device array {dst.shape}")
        return host

    def fill(self, x, value):
        if self._stored(x):                 # (a kernel writes reals)
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

    # -- BLAS ----------------------------------------------------------------------------

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

    def _transposes(self, flops):
        """Whether routing tries the vendor's GEMM on a transposed copy of a (_gemm_vendor_t)
        for a product of `flops`: float32 operands (16-bit ones are copied anyway), and at
        least TRANSPOSED_FLOPS, where the copy is cheap beside the product; only where
        products are routed and the vendor's GEMM is there."""
        return (self.gemm_path == "auto" and self.vendor_gemm and self.half_operands is None
                and flops >= TRANSPOSED_FLOPS)

    def _transposed_workspace(self, size):
        return self._workspace("_transposed_ws", size, "transposed-operand workspace")[0]

    def operand_bytes(self, products, kept=()):
        itemsize = self.dtype.itemsize
        if self.half_operands is None:      # room for a copy of a, where routing may try it
            needed = max((a for a, b, c in products
                          if self._transposes(2 * math.sqrt(a * b * c))), default=0)
            ws = getattr(self, "_transposed_ws", None)
            held = ws.size if ws is not None else 0
            return {"transposed operands": (needed * itemsize, held * itemsize,
                                            self.dtype)} if needed else {}
        needed = max((_whole16(a) + _whole16(b) for a, b, c in products), default=0)
        needed += sum(_whole16(n) for n in kept)
        ws = getattr(self, "_half_ws", None)
        held = sum(x.size for x in (ws, *self._shadows.values()) if x is not None)
        dtype = np.dtype(self.half_operands)
        return {"16-bit operands": (needed * dtype.itemsize, held * dtype.itemsize,
                                    dtype)} if needed else {}

    def keep_operands(self, *arrays):
        """Where products copy their inputs to 16 bits (half_operands), the next copy of
        each array goes into a buffer of its own, made the first time and freed with the
        array (`_shadow`), and later products read it instead of copying again, until
        drop_operands; the kernels that write a layer's output (bias_activation, and
        activation_grad and activation_bias_grad in place) write that copy beside it
        (`_copy_beside`), so that no product copies it at all. The caller vouches that
        nothing else writes the array in between. Keeping a kept array changes nothing."""
        if self.half_operands is not None:
            for key in map(_kept_key, (x for x in arrays if not self._stored(x))):
                if key not in self._keeping:
                    self._keeping.add(key)
                    self._fresh.discard(key)

    def drop_operands(self, *arrays):
        for key in map(_kept_key, arrays):
            self._keeping.discard(key)
            self._fresh.discard(key)

    def drop_all_operands(self):
        self._keeping.clear()
        self._fresh.clear()

    def _shadow(self, x):
        """x's kept 16-bit copy (a view of its owner's shadow, at x's place in the owner),
        and whether it holds x now; None where x is not kept, or does not start at whole
        16 bytes of its owner."""
        key = _kept_key(x)
        owner = x.base or x
        place = x.offset - owner.offset
        if key not in self._keeping or place % 8:
            return None, False
        shadow = self._shadows.get(owner)
        if shadow is None:
            shadow = self._shadows[owner] = self.empty((owner.size,), self.half_operands,
                                                       label="kept 16-bit operands")
        return self.view(shadow, x.shape, place), key in self._fresh

    def _copy_beside(self, x):
        """(h, shadow) for a kernel that writes x and can write its 16-bit copy beside it
        (STORE_HALF): x's kept copy and 1, which then holds x; else x itself (never
        written through h) and 0."""
        kept, _ = self._shadow(x) if self._keeping else (None, False)
        if kept is None:
            return x, 0
        self._fresh.add(_kept_key(x))
        return kept, 1

    def free(self, x):
        shadow = self._shadows.pop(x, None) if x.base is None else None
        if shadow is not None:
            super().free(shadow)
            self.generation += 1            # recorded steps read it
        if x.base is None and self._keeping:    # a later array may get its id
            self._keeping = {key for key in self._keeping if key[0] != id(x)}
            self._fresh = {key for key in self._fresh if key[0] != id(x)}
        super().free(x)

    def _half_workspace(self, size):
        """The 16-bit operand workspace, grown to at least `size` elements: the copies of
        one product's inputs, whichever GEMM reads them (the vendor's, or our tensor-core
        one where it takes 16-bit inputs)."""
        return self._workspace("_half_ws", size, "16-bit operand workspace",
                               self.half_operands)[0]

    def _workspace(self, attr, size, label, dtype=None):
        """(the workspace kept in `attr`, whether it was made now): made anew with `size`
        elements where it has fewer, the old one freed, so that recorded steps that used it
        are stale."""
        ws = getattr(self, attr, None)
        if ws is not None and ws.size >= size:
            return ws, False
        if ws is not None:
            self.free(ws)
            self.generation += 1
        ws = self.empty((size,), dtype, label=label)
        setattr(self, attr, ws)
        return ws, True

    def _operands16(self, a, b):
        """a and b as the vendor's 16-bit GEMM takes them (half_operands): each rounded as our
        own kernels round a product's inputs (prelude.h's half_bits), laid out as it was,
        in the operand workspace, which grows to the largest product's pair. The kernel
        writes two elements a word, and each copy starts at a whole 16 bytes (`_whole16`,
        as the tensor path's copies in the same workspace do)."""
        ws = self._half_workspace(_whole16(a.size) + _whole16(b.size))
        kernel = self._kernels.get("half_operands")
        if kernel is None:
            kernel = self._kernels["half_operands"] = self._build("elementwise", "half_operands")
        out = []
        for x, start in ((a, 0), (b, _whole16(a.size))):
            if self._stored(x):             # 16 bits already: read where it is
                out.append(x)
                continue
            kept, fresh = self._shadow(x)
            y = kept if kept is not None else self.view(ws, x.shape, start)
            if not fresh:
                n = min(x.size, _extent(x))     # (a chunk's columns: to its array's end)
                self._run(kernel, ((n + 1) // 2,), y, x, n, label=f"{self.precision} operands")
                if kept is not None:
                    self._fresh.add(_kept_key(x))
            out.append(y)
        return out

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

    def _route(self, a, b, beta, c, trans_a, trans_b, m, n, k):
        """The faster path for this shape, measured now on the real operands (`_fastest`)
        and remembered for the life of the backend. Neither library wins everywhere:
        CLBlast has no split K, so a conv layer's weight gradient (32 x 144, K = 147456) ran
        17 times slower there than our split-K kernel on an H100, while it wins the large
        square products."""
        def own(tiling=None):
            self._gemm_own(1.0, a, b, beta, c, trans_a, trans_b, m, n, k, tiling=tiling)

        def vendor():
            self._gemm_vendor_pieces(1.0, a, b, beta, c, trans_a, trans_b, m, n, k)

        def vendor_t():
            self._gemm_vendor_t(1.0, a, b, beta, c, trans_a, trans_b, m, n, k)

        def tensor():
            self._gemm_tensor_pieces(1.0, a, b, beta, c, trans_a, trans_b, m, n, k)
        return self._fastest_tiling((m, n, k, trans_a, trans_b), m, n, k, own, vendor, tensor,
                                    restore=[c] if beta != 0 else [], vendor_t=vendor_t)

    def _fastest_tiling(self, key, m, n, k, own, vendor, tensor, restore=(), vendor_t=None):
        """The fastest of the vendor's call, own(tiling) on each of `_candidates`, where
        the product is large (`_transposes`) vendor_t(): the vendor's on a transposed copy
        of a, and where the backend has one (`tensor_gemm`), tensor(): our tensor-core
        GEMM, measured (`_fastest`) and remembered: the path's name in _routes[key], its
        tiling in _route_tilings[key]."""
        tilings = self._candidates(m, n, k)
        paths = {name: functools.partial(own, t) for name, t in tilings.items()}
        ws = max(t[1] * m * n for t in tilings.values())
        if ws > m * n:
            self._split_workspace(ws)      # grown first: the trials' replays all point at it
        if self.vendor_gemm:
            paths["vendor"] = vendor
        if vendor_t is not None and self._transposes(2 * m * n * k):
            self._transposed_workspace(m * k)                   # likewise
            paths["vendor_t"] = vendor_t
        if self.tensor_gemm and any(self._tensor_takes(kp) for _, kp in _k_pieces(k)):
            paths["tensor"] = tensor
        best = self._fastest(key, paths, restore)
        if best in tilings:
            self._route_tilings[key] = tilings[best]
        return best

    def _kept_route(self, key, paths):
        """The path PORTANET_ROUTES' file keeps for key among `paths` under this backend's
        scope (see backends/routes.py), or None."""
        path = config.routes_file()
        if path is None:
            self._route_file = None
            return None
        if self._route_file is None or self._route_file.path != path:
            self._route_file = routes.RouteFile(path, routes.scope(
                self._sources_id(), routes.code_id(), str(self.dtype), self.precision,
                self.gemm_path, self.conv_path, self.gemm_params,
                sorted(self.gemm_sizes.items()), self.vendor_k, config.graphs(),
                self.gemv_threads, self.compute_units, getattr(self, "gemm_limits", None),
                _steady(getattr(self, "limits", None)), bool(self.vendor_gemm),
                routes.versions("pyclblast", "nvmath-python")))
        return self._route_file.get(_file_key(key, paths))

    def _fastest(self, key, paths, restore=()):
        """The fastest of `paths` ({name: call}), each timed now on the real operands as a
        recorded training step runs it, where the backend records steps: replayed, without
        the Python around each launch (on NVIDIA's OpenCL an mlp-small step took 0.43 ms on
        the paths eager timing chose, CLBlast, and 0.27 on ours). Remembered in _routes[key]
        for the life of the backend, each path's time its fastest of ROUTING_ROUNDS. The
        trials write into the outputs themselves, so routing allocates nothing (but the
        split-K workspace, grown to the largest trial's first: _fastest_tiling); the arrays
        in `restore` (outputs the call also reads) are put back afterwards."""
        if len(paths) == 1:                 # nothing to choose between
            self._routes[key] = best = next(iter(paths))
            return best
        stored = self._kept_route(key, paths)
        if stored in paths:                 # measured by an earlier process (PORTANET_ROUTES)
            self._routes[key] = stored
            return stored
        saved = [(x, self.download(x)) for x in restore]
        kept = set(self._fresh)         # each trial copies what the step's call would copy
        paths = {name: functools.partial(self._with_fresh, kept, call)
                 for name, call in paths.items()}
        runs, seconds = {}, {}
        for name, call in paths.items():
            call()                                          # builds, warms up
            self.synchronize()
            replay = self.capture(call) if config.graphs() and self.trace is None else None
            runs[name] = replay or call
            seconds[name] = self._timed(runs[name], 1)
        # a simulator's times say nothing of a device: each path is timed once, so that
        # routing there runs every path under the simulator's checks at little cost. On a
        # device, a path whose one call took ROUTING_MARGIN times the best's, and a
        # millisecond more, is out at once (a CPU's slow way to a large conv takes seconds);
        # the rest are timed in ROUTING_ROUNDS rounds, of ROUTING_REPEATS calls each where
        # a call is short enough for the launch's own time to blur it
        best = min(seconds.values())
        close = [name for name, t in seconds.items()
                 if t <= ROUTING_MARGIN * best or t - best < ROUTING_CLEAR]
        if not self.simulator and len(close) > 1:
            repeats = ROUTING_REPEATS if best < ROUTING_CLEAR else 1
            for _ in range(ROUTING_ROUNDS):     # rounds in turn: a clock that ramps up, or a
                for name in close:              # neighbour's burst, reaches every path alike
                    run = runs[name]
                    if not getattr(run, "current", True):   # a later path freed its memory
                        runs[name] = run = self.capture(paths[name])
                    seconds[name] = min(seconds[name], self._timed(run, repeats))
        for x, host in saved:
            self.write(x, host)
        self._fresh = kept
        best = min(seconds, key=seconds.get)
        if self._route_file is not None:    # another process's, where it was first
            first = self._route_file.put(_file_key(key, paths), best)
            best = first if first in paths else best
        self._routes[key] = best
        log.debug("%s on %s: %s -> %s", _key_text(key), self.name,
                  ", ".join(f"{name} {1e6 * t:.0f} us"
                            for name, t in seconds.items()), best)
        return best

    def _with_fresh(self, fresh, call):
        self._fresh = set(fresh)
        call()

    def _timed(self, run, repeats):
        """Seconds a call of run takes, the mean of `repeats` calls in a row."""
        self.synchronize()
        start = time.perf_counter()
        for _ in range(repeats):
            run()
        self.synchronize()
        return (time.perf_counter() - start) / repeats

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

    def _tiling(self, m, n, k, conv=None):
        """(params, parts, k_chunk): the tiling of our GEMM for an m x n x k product, the
        parts its K is split in and the terms of each. In order (docs/gemm.md has
        the reasons behind each step):
          - the tuned size class nearest the output (`_size_class`), or the device's one
            tiling; run as tuned (one group per tile, K unsplit) where the output fills as
            many of its tiles as the class's own product;
          - thinner tiles where the output fills at most half of a tile's rows or columns
            (`_thin`: a conv layer's 16 x 6760000 forward output);
          - else, where the tiles leave compute units idle, down a ladder of smaller tilings
            (`_halved`) until they fill the device, or SMALL_TILES for an output smaller
            than one tile (a conv weight gradient: 16 x 9, K = 173056);
          - then K split in parts until the groups hold WORK_ITEMS_PER_UNIT work-items per
            compute unit, no part longer than ACC_K."""
        thin, as_tuned = self._tuned_for(m, n, conv)
        rungs = self._tilings(thin)
        p = rungs[0][0]
        small = (not as_tuned and _tiles(p, m, n) < self.compute_units
                 and (m < p["TSM"] or n < p["TSN"]) and p["TSM"] * p["TSN"] > 256)
        if small:
            p = SMALL_TILES
        elif not as_tuned:
            for p, _ in rungs:              # down to the first whose tiles fill the device
                if _tiles(p, m, n) >= self.compute_units:
                    break
        if as_tuned:
            return p, 1, k
        groups = self.compute_units * max(
            2, WORK_ITEMS_PER_UNIT // ((p["TSM"] // p["WPTM"]) * (p["TSN"] // p["WPTN"])))
        parts, k_chunk = split_k(_tiles(p, m, n), k, p["TSK"], groups)
        if parts > 1 and k_chunk > ACC_K:           # no part sums more than ACC_K terms
            parts, k_chunk = -(-k // ACC_K), ACC_K
        return p, parts, k_chunk

    def _tuned_for(self, m, n, conv=None):
        """(params, as_tuned): the tuned tiling of the size class nearest an m x n output
        (the device's one tiling where untuned; CONV_TILES for a convolution on a GPU),
        thinned to it (`_thin`), and whether it runs as tuned: a tiling tuned for a size
        class runs as it was measured (alone, unsplit) wherever the output fills as many
        of its tiles as at that size."""
        size = None if conv else self._size_class(m, n)
        tuned = self.gemm_sizes.get(size, self.gemm_params)
        if conv and self.is_gpu and self.gemm_fits(CONV_TILES):
            tuned = CONV_TILES
        thin = self._thin(tuned, m, n)
        return thin, (size is not None and thin is tuned
                      and _tiles(tuned, m, n) >= _tiles(tuned, size, size))

    def _candidates(self, m, n, k):
        """{name: tiling} that auto routing times for an m x n x k product: "own", what
        `_tiling` chooses, and where the backend searches_tilings (GPUs) and that is not a
        tuned tiling run as tuned, each rung of each tuned tiling's ladder (thinned to the
        output) and SMALL_TILES, with K whole and in SEARCH_PARTS parts (each at least 4
        slabs, at most 16 groups per compute unit in all), one of each tile shape and
        split: the nearest size class's first. Where the rules split K in more parts than
        SEARCH_PARTS (a weight gradient's K of the batch's pixels) they are kept. The rules
        missed by up to 8 us a product on the H100's mlp-small step (docs/routing.md).
        Where the last part may add a split up (finishes_splits),
        each split is tried that way and summed after as well ("... summed")."""
        chosen = self._tiling(m, n, k)
        found = {"own": chosen}
        if (not self.searches_tilings or self._tuned_for(m, n)[1]
                or chosen[1] > SEARCH_PARTS[-1]):
            return self._with_summed(found)     # tuned as it runs, or K long for its output
        seen = {(chosen[0]["TSM"], chosen[0]["TSN"], chosen[1])}
        room = max(chosen[1] * m * n, SEARCH_WORKSPACE)
        nearest = self.gemm_sizes.get(self._size_class(m, n), self.gemm_params)
        roots = [nearest, self.gemm_params, *self.gemm_sizes.values()]
        tilings = [r for root in roots for r, _ in self._tilings(self._thin(root, m, n))]
        for p in tilings + ([SMALL_TILES] if self.gemm_fits(SMALL_TILES) else []):
            for parts in SEARCH_PARTS:
                if parts > 1 and (k < 4 * p["TSK"] * parts or parts * m * n > room
                                  or _tiles(p, m, n) * parts > 16 * self.compute_units):
                    continue
                count, k_chunk = k_parts(k, parts, p["TSK"])
                shape = (p["TSM"], p["TSN"], count)     # the nearest class's of a shape
                if shape not in seen and k_chunk <= ACC_K:
                    seen.add(shape)
                    found[f"own {p['TSM']}x{p['TSN']}" + (
                        f" split-K {count}" if count > 1 else "")] = (p, count, k_chunk)
        return self._with_summed(found)

    def _with_summed(self, found):
        """found ({name: tiling}) and, beside each split that its last part would add up
        (`_finishes`), the same split summed by gemm_split_sum, as name + " summed"."""
        return {**found, **{name + " summed": (*t, False) for name, t in found.items()
                            if t[1] > 1 and self._finishes(t[1])}}

    def _finishes(self, parts):
        """Whether a split K of `parts` parts is added up by its last part (gemm.cl's
        SPLIT_K 2) here, rather than by gemm_split_sum."""
        return parts <= FINISH_PARTS and self.finishes_splits

    def _thin(self, params, m, n):
        """params, or where the output fills at most half of its tile's rows (columns),
        params with the tile that many times shorter (`_thinned`): a 16 x 6760000 x 9
        product (a conv layer's forward pass on 10000 images) spent 7/8 of its 128-row tiles
        on padding. Made once per tiling and shape of tile, not per product."""
        want = {}
        for side, length in (("M", m), ("N", n)):
            ts = params["TS" + side]
            while ts // 2 >= max(length, 16):
                ts //= 2
            want[side] = ts
        if want["M"] == params["TSM"] and want["N"] == params["TSN"]:
            return params

        def thinned():
            thin = params
            for side in ("M", "N"):
                thin = _thinned(thin, side, want[side], self.gemm_fits)
            return thin
        return self._per_tiling(params, ("thin", want["M"], want["N"]), thinned)

    def _size_class(self, m, n):
        """The size n' of the tuned tilings (gemm_sizes) nearest an m x n output, m n
        against n'^2 on a log scale (the larger of two as near), or None where there are
        none (untuned: gemm_params for every product)."""
        if not self.gemm_sizes:
            return None
        return min(self.gemm_sizes, key=lambda s: (abs(math.log(m * n / (s * s))), -s))

    def _tilings(self, params):
        """The ladder of tilings _gemm_own steps down from `params` (the device's, or one
        of its size classes'): params, then each `_halved` from it while they fit here, with
        the frozen items that key their kernels. Made once per tiling, not per product."""
        def ladder():
            rungs, p = [], params
            while p is not None and (not rungs or self.gemm_fits(p)):
                rungs.append((p, tuple(sorted(p.items()))))
                p = _halved(p)
            return rungs
        return self._per_tiling(params, ("ladder",), ladder)

    def _per_tiling(self, params, use, make):
        """make(), made once for the tiling `params` (by identity) and `use`, kept until
        set_gemm_params; each entry holds params, so no other tiling takes its id."""
        if self._derived is None:
            self._derived = {}
        key = (id(params), *use)
        if key not in self._derived:
            self._derived[key] = (params, make())
        return self._derived[key][1]

    def _register_cap(self, params):
        """Build options that hold our GEMM kernel to registers for MIN_GROUPS work-groups
        per compute unit where the device compiler takes such a cap beyond the kernel's own
        (CUDA's __launch_bounds__ does it in gemm.cu)."""
        return []

    def _split_workspace(self, size):
        """A view of `size` elements of the split-K workspace, grown when too small."""
        ws, _ = self._workspace("_split_ws", size, "split-K workspace")
        if self.finishes_splits:
            self._split_counts(0)               # made with the first workspace
        return self.view(ws, (size,))

    def _split_counts(self, tiles):
        """A view of `tiles` counts of split K's parts done (gemm.cl's SPLIT_K 2), zeros;
        made for 16 tiles per compute unit (a split's tiles are fewer than its groups),
        grown where a product has more. The last part of each tile puts its count back to
        0, so one set serves every product, launch after launch on the backend's queue."""
        counts, made = self._workspace("_split_done", max(tiles, 16 * self.compute_units),
                                       "split-K counts", np.int32)
        if made:
            self.write(counts, np.zeros(counts.size, np.int32))
        return self.view(counts, (tiles,))

    def set_gemm_params(self, params, sizes=None):
        """Use other tile sizes for our GEMM kernel: `params` for every product, or, with
        sizes {n: tiling} (what `portanet tune` measured fastest on n x n x n products),
        the tiling of the size class nearest each output (_size_class), params where there
        is none. Tilings that do not fit here (gemm_fits) are the caller's to leave out."""
        self.gemm_params = {**GEMM_DEFAULTS, **params}
        self.gemm_sizes = {int(n): {**GEMM_DEFAULTS, **p} for n, p in (sizes or {}).items()}
        self._derived = {}
        self._routes, self._route_tilings = {}, {}      # measured with the old tiling
        self._route_file = None                         # another scope (_kept_route)
        self.generation += 1                # recorded steps launch the old kernels
        for key in [k for k in self._kernels if isinstance(k, tuple) and k[0] == "gemm"]:
            del self._kernels[key]

    @property
    def gemm_default(self):
        """The tiling this device's limits give (gemm_params), tuned or not: what
        `portanet tune` compares against."""
        return gemm_params(self.is_gpu, *self.gemm_limits)

    def gemm_fits(self, params):
        """Whether our GEMM kernel builds and runs with these parameters here (GEMM_SPACE)."""
        return gemm_fits(params, *self.gemm_limits)

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

    def activation_bias_grad(self, kind, z, da, alpha, beta, gb, ones):
        """activation_grad and the bias gradient gemv(alpha, z, ones, beta, gb) in one
        kernel (activation_bias_grad in blas.cl): gemv's row groups. Few long rows (a conv
        layer's channels) are routed as gemv's are, whole or in pieces, and against the two
        kernels apart: one group per row and piece has less parallelism than
        activation_grad's one work-item per element (an H100 under ncu: 133 us fused
        against 73 apart for 32 rows of 147456, in pieces; the launch it saves decides
        short rows)."""
        check_activation(kind)
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

    def _row_way(self, name, rows, cols, run, restore, **others):
        """The call that a kernel of gemv's row groups, run(parts), makes on a rows x cols
        matrix: one group per row where the rows fill the device or routing is not auto;
        else the fastest of one group per row, the gemv_parts pieces of each (then a split
        sum) and the calls in `others`, measured per shape (_fastest) and remembered."""
        parts = gemv_parts(rows, cols, self.gemv_threads, self.compute_units)
        whole = functools.partial(run, 1)
        if parts == 1 or self.gemm_path != "auto":
            return whole
        ways = {"whole": whole, "split": functools.partial(run, parts), **others}
        key = (name, rows, cols)
        return ways[self._routes.get(key) or self._fastest(key, ways, restore)]

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

    def ger(self, alpha, x, y, a):
        rows, cols = a.shape
        if x.size != rows or y.size != cols:
            raise ShapeError(f"ger: x {x.shape}, y {y.shape} do not fit a {a.shape}")
        self._run("ger", (cols, rows), a, x, y, float(alpha), rows, cols)

    def axpy(self, alpha, x, y):
        self._run("axpy", (y.size,), y, x, float(alpha), y.size)

    def scal(self, alpha, x):
        self._run("scal", (x.size,), x, float(alpha), x.size)

    def _skip(self, op, skip):
        """An update's skip flag; None: one of the backend's own that stays 0, made at the
        first update that needs it (training always gives its own: see OptimizerState)."""
        check_skip(op, skip)
        if skip is None:
            if self._never is None:
                self._never = self.empty((1,), np.int32, "never skip")
                self.write(self._never, np.zeros(1, np.int32))
            skip = self._never
        return skip

    def momentum_update(self, w, v, decay, n_decay, skip=None):
        self.momentum_updates([(w, v, n_decay)], decay, skip)

    def momentum_updates(self, layers, decay, skip=None):
        """momentum_updates' kernel on UPDATE_LAYERS layers a launch, or where updates are
        not fused (CPUs) momentum_update's a layer at a time."""
        for w, v, n_decay in layers:
            check_update("momentum_update", n_decay, w, v)
        skip = self._skip("momentum_update", skip)
        if not self.fused_updates:
            for w, v, n_decay in layers:
                self._run("momentum_update", (w.size,), skip, float(decay), w, v, w.size,
                          n_decay)
            return
        for first in range(0, len(layers), UPDATE_LAYERS):
            group = layers[first:first + UPDATE_LAYERS]
            args = [a for w, v, n_decay in group for a in (w, v, w.size, n_decay)]
            w, v = group[0][:2]             # stand-ins for the layers not given (n_p = 0)
            args += [w, v, 0, 0] * (UPDATE_LAYERS - len(group))
            work_items = sum(-(-w.size // STEPS) for w, _, _ in group)
            self._run("momentum_updates", (work_items,), skip, float(decay), *args)

    def sgd_update(self, w, g, v, lr, momentum, weight_decay, n_decay, nesterov, skip=None):
        check_update("sgd_update", n_decay, w, g, v)
        self._run("sgd_update", (w.size,), self._skip("sgd_update", skip), w, v, g,
                  float(lr), float(momentum), float(weight_decay), bool(nesterov), n_decay,
                  w.size)

    def adam_update(self, w, g, m, v, scalars, beta1, beta2, eps, l2, shrink, n_decay,
                    skip=None):
        check_adam(scalars, n_decay, w, g, m, v)
        # 1 - beta and 1 - shrink in double, as PyTorch and the reference form them
        beta1, beta2, shrink = float(beta1), float(beta2), float(shrink)
        self._run("adam_update", (w.size,), self._skip("adam_update", skip), w, m, v, g,
                  scalars, beta1, 1.0 - beta1, beta2, 1.0 - beta2, float(eps), float(l2),
                  1.0 - shrink, n_decay, w.size)

    def rmsprop_update(self, w, g, v, buf, gavg, lr, alpha, eps, l2, momentum, n_decay,
                       skip=None):
        check_update("rmsprop_update", n_decay, w, g, v, buf, gavg)
        # an absent buf or gavg is w, never touched: its flag is off
        alpha = float(alpha)
        self._run("rmsprop_update", (w.size,), self._skip("rmsprop_update", skip), w, v,
                  w if buf is None else buf, w if gavg is None else gavg, g, float(lr), alpha,
                  1.0 - alpha, float(eps), float(l2), float(momentum), buf is not None,
                  gavg is not None, n_decay, w.size)

    def scale_by(self, x, s):
        check_loss_scale("scale_by", s)
        self._run("scale_by", (x.size,), x, s, x.size)

    def unscale_check(self, g, s, found):
        check_loss_scale("unscale_check", s)
        check_found("unscale_check", found)
        self._run("unscale_check", (g.size,), g, s, found, g.size)

    def adam_scalars(self, s, t, found, lr, beta1, beta2):
        check_found("adam_scalars", found)
        self._run("adam_scalars", (1,), s, t, found, float(lr), log_beta(float(beta1)),
                  log_beta(float(beta2)))

    def update_loss_scale(self, s, found, growth_interval, low, high):
        check_loss_scale("update_loss_scale", s)
        check_found("update_loss_scale", found)
        self._run("update_loss_scale", (1,), s, found, int(growth_interval), float(low),
                  float(high))

    def _reclaim(self, key, nbytes, buf):
        self._staged_in = None          # the memory may come back as another staging buffer
        super()._reclaim(key, nbytes, buf)

    def write_samples(self, dst, host, staging=None, bad=None, first=0):
        """The batch in parts of whole samples. Each (of LANE_BYTES or more: a smaller one
        goes by a plain write) is copied by the host into
        pinned memory, sent up on the backend's copy lane (_send) into one half of staging
        while the device lays out the part before from the other half, then laid out by
        features_first into its columns of dst, in order with the work on the device,
        which also looks for NaN and inf where asked (bad): the host reads host once."""
        if staging is None:
            return super().write_samples(dst, host, None, bad, first)
        rows, m = dst.shape
        host = np.asarray(host)
        if host.size != dst.size or len(host) != m:
            raise ShapeError(f"write_samples: host array of {host.shape} into device array "
                             f"{dst.shape} (features, samples)")
        host = host.reshape(m, rows)
        if self._staged_in != (id(staging.buf), staging.offset, staging.size):
            # other memory than the lane's events speak for: its first send in each half
            # waits for all the device has been given (a fill, another use of the memory)
            self._staged_in = (id(staging.buf), staging.offset, staging.size)
            for turn in (0, 1):
                self._laid_out(turn, False)
        halves = 2 if staging.size >= 2 * rows else 1
        step = max(1, min(staging.size // (halves * rows), STAGED_SAMPLES))
        for j in range(0, m, step):
            part = host[j:j + step]
            self._turn = turn = (self._turn + 1) % halves
            slot = self.view(staging, (part.size,), turn * step * rows)
            laned = part.nbytes >= LANE_BYTES
            if laned:
                self._send(slot, part, turn)
            else:
                self.write(slot, part)
            self._features_first(dst, slot, bad, first, j, len(part))
            self._laid_out(turn, laned)

    def stage_samples(self, staging, host):
        """By a plain write into the first half of staging, in order after the launches
        that read it last; None for a batch of LANE_BYTES or more (write_samples sends it
        through the copy lane) or one that staging does not hold."""
        host = np.asarray(host)
        if staging is None or host.size > staging.size or \
                host.size * staging.dtype.itemsize >= LANE_BYTES:
            return None
        staged = self.view(staging, (host.size,))
        self.write(staged, host.reshape(-1))
        self._turn = 0
        self._laid_out(0, False)
        return staged

    def lay_out(self, dst, staged):
        rows, m = dst.shape
        self._features_first(dst, staged, None, 0, 0, m)

    def write_samples_device(self, dst, src, bad=None, first=0):
        """dst (features, m) <- src (m, features), samples first in device memory (another
        library's, through DLPack: src.buf an address), laid out by features_first straight
        from where it is, with no copy on the way; NaN and inf flagged in bad as
        write_samples does."""
        rows, m = dst.shape
        if tuple(src.shape) != (m, rows):
            raise ShapeError(f"write_samples_device: samples {src.shape} into device array "
                             f"{dst.shape} (features, samples)")
        for j in range(0, m, STAGED_SAMPLES):
            n = min(STAGED_SAMPLES, m - j)
            self._features_first(dst, self.view(src, (n * rows,), j * rows), bad, first, j, n)

    def _features_first(self, dst, part, bad, first, j, n):
        """Columns j .. j + n of dst (features, m) <- part, n samples first."""
        rows, m = dst.shape
        # without bad, dst stands in for it (check 0: never written)
        self._run("features_first", (rows, n), dst, part, dst if bad is None else bad,
                  bad is not None, first, rows, n, m, j, stored=self._stored(dst))

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

    # -- NN ------------------------------------------------------------------------------

    def bias_activation(self, kind, z, b, a, stored=None):
        check_activation(kind)
        rows, cols = z.shape
        if stored is not None or self._stored(a):
            check_stored(self, z, a, stored)
            self._run("bias_activation_stored", (cols, -(-rows // STEPS)), a, stored, z, b,
                      ACT[kind], rows, cols, stored=True)
            return
        if kind == "softmax":
            self._fresh.discard(_kept_key(a))
            self._run("bias_softmax", (cols,), a, z, b, rows, cols)
        else:
            self._run("bias_activation", (cols, -(-rows // STEPS)), a, z, b,
                      *self._copy_beside(a), ACT[kind], rows, cols)

    def activation_grad(self, kind, z, da, delta=None):
        check_activation_grad(self, kind, z, da, delta)
        if delta is not None:
            self._run("activation_delta", (z.size,), delta, z, da, ACT[kind], z.size,
                      stored=self._stored(z))
            return
        self._run("activation_grad", (z.size,), z, da, *self._copy_beside(z), ACT[kind],
                  z.size)

    def add_activation(self, kind, z, x, a):
        check_add_activation(kind, z, x, a)
        self._run("add_activation", (z.size,), a, z, x, ACT[kind], z.size,
                  stored=self._stored(z))

    def softmax_xent(self, delta, loss, hit, a, labels):
        self._run("softmax_xent", (a.shape[1],), delta, loss, hit, a, labels, *a.shape)

    def bias_softmax_xent(self, z, b, a, loss, hit, labels):
        self._run("bias_softmax_xent", (a.shape[1],), loss, hit, a, z, b, labels, *a.shape)

    def bias_softmax_xent_grad(self, z, b, a, loss, hit, labels, alpha, beta, gb, ones):
        """bias_softmax_xent and the bias gradient's gemv in one launch of one work-group
        (loss.cl) where auto routing measures it faster than the two apart, per shape: a
        batch of few samples, where the launch saved outweighs the parallelism one group
        gives up. More than FUSED_LOSS_SAMPLES samples a work-item, or a routing other than
        auto, go apart untried."""
        rows, cols = a.shape
        if gb.size != rows or ones.size != cols:
            raise ShapeError(f"bias_softmax_xent_grad: a {a.shape}, gb {gb.shape}, ones "
                             f"{ones.shape}")
        apart = functools.partial(super().bias_softmax_xent_grad, z, b, a, loss, hit, labels,
                                  alpha, beta, gb, ones)
        threads = self.gemv_threads
        if self.gemm_path != "auto" or not 0 < cols <= FUSED_LOSS_SAMPLES * threads:
            apart()
            return
        fused = functools.partial(self._run, "bias_softmax_xent_grad", (threads,), loss, hit,
                                  a, z, b, labels, gb, float(alpha), float(beta), rows, cols,
                                  local=(threads,))
        ways, key = {"fused": fused, "apart": apart}, ("bias_softmax_xent_grad", rows, cols)
        ways[self._routes.get(key) or self._fastest(key, ways, [z, a, loss, hit, gb])]()

    def sigmoid_bce(self, delta, loss, hit, a, y):
        self._run("sigmoid_bce", (a.shape[1],), delta, loss, hit, a, y, *a.shape)

    def mse(self, delta, loss, hit, a, y):
        self._run("mse", (a.shape[1],), delta, loss, hit, a, y, *a.shape)

    def argmax(self, out, a):
        self._run("argmax", (a.shape[1],), out, a, *a.shape)

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

    # -- convolution: each of the three products on the fastest of its paths, measured per
    # shape as GEMMs are (`_fastest`; PORTANET_GEMM=own keeps to our kernels, vendor takes
    # im2col where the workspace allows):
    #   implicit  our GEMM kernel gathering patches tile by tile (gemm.cl's CONV): no
    #             patch matrix; the forward's bias and activation in its epilogue
    #   direct    conv_direct, the definition, for short patches (C.k.k <= DIRECT_ROWS)
    #   im2col    patch matrices in chunks the workspace holds, and the vendor's GEMM
    # Images and a delta in 16-bit storage are read as they are (gemm's A_HALF and B_HALF,
    # conv.cl's STORED); with `stored`, the forward's z + b and a are stored in 16 bits.

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

    def dropout(self, out, x, key, rate):
        check_alike("dropout", out=out, x=x)
        self._run("dropout", (out.size,), out, x, key, float(rate), 1.0 / (1.0 - rate),
                  out.size, stored=self._stored(x))


    # -- batch normalization (norm.cl): one work-group of gemv_threads per row ------------

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

    def _norm_pieces(self, rows, n, phases, placeholder):
        """(parts, ws, phases) of a row-wise norm.cl call: one group per row (BN_WHOLE) where
        the rows fill the device, ws then a placeholder (any real array of the call: the
        kernel does not touch it); else norm_parts pieces of each row in the launches of
        `phases`, their sums in the split workspace."""
        parts = norm_parts(rows, n, self.gemv_threads, self.compute_units)
        if parts == 1:
            return 1, placeholder, (BN_WHOLE,)
        return parts, self._split_workspace(2 * rows * parts), phases


FINISH_PARTS = 16           # the most parts gemm.cl's last part adds up itself (SPLIT_K 2)
ROUTING_REPEATS = 3        # timed calls per path and round when auto routing meets a new
ROUTING_ROUNDS = 3         # shape; the path's time is its fastest round
ROUTING_MARGIN = 1.5       # a path this much slower than the best at its first call, and
ROUTING_CLEAR = 1e-3       # this many seconds, is not timed again
TRANSPOSED_FLOPS = 2**34   # the least product routing tries on a transposed copy of a (17 GFLOP)
TILE, TILE_ROWS = 32, 8    # transpose's tiles and work-groups (elementwise.cl)
UPDATE_LAYERS = 4          # the layers one momentum_updates launch takes (elementwise.cl)
STEPS = 4                  # elements a work-item of bias_activation and momentum_updates takes
                           # (elementwise.cl's STEPS; test_kernel_sources holds them equal)
FUSED_LOSS_SAMPLES = 1      # the most samples a work-item of the fused loss and bias
                            # gradient takes (bias_softmax_xent_grad) for it to be tried: at
                            # 4 (mlp-small) one group lost to the two launches by 6-16 us on
                            # an H100 and PoCL, and routing's few trials can misjudge it
SEARCH_PARTS = (1, 2, 4, 8, 16)     # the K splits routing tries with each tiling (GPUs)
SEARCH_WORKSPACE = 2**22   # split-K workspace (reals) routing may grow to for a candidate
DIRECT_F = 8               # filters per work-item of conv_direct (as in conv.cl)
DIRECT_ROWS = 64           # the longest patch (C.k.k) conv_direct is tried for
MIN_CHUNK = 1024           # the fewest patch-matrix columns a chunk of im2col may have
def _kept_key(x):
    """What keep_operands knows an array by: its owner, its place there and its shape."""
    return id(x.base or x), x.offset, x.shape


def _whole16(n):
    """n 16-bit elements rounded up to whole 16 bytes (where each 16-bit copy starts)."""
    return -(-n // 8) * 8


def operand_options(precision):
    """Build options that round every product's inputs as `precision` multiplies them
    (prelude.h's OPERAND: its stored mantissa bits, and IEEE half's range for fp16); none
    for fp32 and fp64, whose kernels are the plain ones."""
    bits = PRECISIONS[precision].mantissa
    if bits >= PRECISIONS["fp32"].mantissa:
        return []
    return [f"-DOPERAND_BITS={bits}"] + (["-DOPERAND_HALF=1"] if precision == "fp16" else [])


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


def _extent(x):
    """Elements from x's offset to the end of the array it is a view of (its base's), or
    of x itself: where a copy of a `_columns` view, whose shape runs past it, stops."""
    owner = x if x.base is None else x.base
    return owner.offset + owner.size - x.offset


def _key_text(key):
    """A routing key in the log: 'gemm NT 32x144x147456' or 'conv_weight_grad (...)'."""
    if isinstance(key[0], str):
        return f"{key[0]} {key[1:]}"
    return "gemm " + _shape_text(*key)


def _storage_key(bk, *arrays):
    """What a convolution's route key adds for arrays in 16-bit storage (their paths read
    other kernels): which of them are, or nothing where none is."""
    stored = tuple(bk._stored(x) for x in arrays)
    return ("16-bit", stored) if any(stored) else ()


def _conv_sizes(x, k, stride, pad):
    """The size arguments of conv.cl's kernels for images x (C, H, W, N)."""
    C, H, W, N = x.shape
    return C, H, W, N, k, stride, pad, conv_out(H, k, stride, pad), conv_out(W, k, stride, pad)


def _pool_sizes(x, pool, stride):
    C, H, W, N, pool, stride, _, Ho, Wo = _conv_sizes(x, pool, stride, 0)
    return C, H, W, N, pool, stride, Ho, Wo


def default_local(global_size, work_group):
    """The work-group of a launch that does not ask for one: 256 work-items in a row, or
    32 x 8 in two dimensions (dimension 0 runs along the batch), fewer where the device
    allows fewer. Fixed rather than left to the driver, which picks one per global size:
    PoCL compiles a kernel again for each group size it meets (a second or more each)."""
    if len(global_size) == 1:
        return (min(256, work_group),)
    x = min(32, work_group)
    return (x, max(1, min(8, work_group // x))) + (1,) * (len(global_size) - 2)


def _file_key(key, paths):
    """A routing key as the routes file keeps it: with the names of the paths there were
    to choose from (which paths exist can differ between processes and networks: a vendor
    library, a conv workspace's room), and numbers and flags as Python's own, so that its
    text is the same in every process."""
    def plain(x):
        if isinstance(x, tuple):
            return tuple(plain(v) for v in x)
        if isinstance(x, (bool, np.bool_)):
            return bool(x)
        return int(x) if isinstance(x, np.integer) else x
    return plain(key) + (tuple(sorted(paths)),)


def _steady(limits):
    """An OpenCL backend's limits without the memory sizes, which PoCL takes from the
    memory free when it starts (they moved between two processes on the H100's host, and
    the routes file then held none for the second); None elsewhere."""
    if limits is None:
        return None
    return {k: v for k, v in dataclasses.asdict(limits).items()
            if k not in ("memory", "max_alloc")}
