"""What the OpenCL and CUDA backends share: `KernelBackend`, which builds and launches the
kernel families (kernels_cl/, and kernels_cu/ for CUDA's own), stages batches and runs the
elementwise, loss, pooling and normalization ops. Its other parts are their own modules:
GEMM routing (gemm/router.py), the GEMM paths (gemm/paths.py), convolutions
(conv.py), the 16-bit operand copies (shadows.py) and the updates (updates.py). Each
backend supplies memory, `_launch` and its vendor GEMM."""
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
from . import sources
from .arrays import ACT, DeviceArray
from .base import ACC_K, Backend
from .checks import (check_activation, check_activation_grad, check_add_activation, check_alike,
                     check_gather, check_norm_grad, check_norm_kind, check_pool, check_rows,
                     check_stored, check_transpose)
from .conv import ConvPaths, _conv_sizes
from .gemm.paths import GemmPaths
from .gemm.router import GemmRouting
from .gemm.tiling import norm_parts
from .shadows import Shadows, _kept_key
from .gemm.tuned import capped
from .updates import STEPS, Updates

log = logging.getLogger("portanet")

# how norm.cl's kernels share a row (BN_* there): one group, or pieces in these launches
BN_WHOLE, BN_SUMS, BN_SQUARES, BN_APPLY = 0, 1, 2, 3


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


class Recorded:
    """A training step a backend recorded (`capture`); calling it replays the step.
    `current` turns False once the backend has freed something the recording points at
    (its GEMM workspace grew for another product, its kernels were rebuilt): record again."""

    def __init__(self, backend):
        self.backend, self.generation = backend, backend.generation

    @property
    def current(self):
        return self.generation == self.backend.generation


class KernelBackend(GemmRouting, GemmPaths, ConvPaths, Shadows, Updates, Backend):
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

    def free(self, x):
        shadow = self._shadows.pop(x, None) if x.base is None else None
        if shadow is not None:
            super().free(shadow)
            self.generation += 1            # recorded steps read it
        if x.base is None and self._keeping:    # a later array may get its id
            self._keeping = {key for key in self._keeping if key[0] != id(x)}
            self._fresh = {key for key in self._fresh if key[0] != id(x)}
        super().free(x)

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

    def axpy(self, alpha, x, y):
        self._run("axpy", (y.size,), y, x, float(alpha), y.size)

    def scal(self, alpha, x):
        self._run("scal", (x.size,), x, float(alpha), x.size)

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

    # -- convolution: each of the three products on the fastest of its paths, measured per
    # shape as GEMMs are (`_fastest`; PORTANET_GEMM=own keeps to our kernels, vendor takes
    # im2col where the workspace allows):
    #   implicit  our GEMM kernel gathering patches tile by tile (gemm.cl's CONV): no
    #             patch matrix; the forward's bias and activation in its epilogue
    #   direct    conv_direct, the definition, for short patches (C.k.k <= DIRECT_ROWS)
    #   im2col    patch matrices in chunks the workspace holds, and the vendor's GEMM
    # Images and a delta in 16-bit storage are read as they are (gemm's A_HALF and B_HALF,
    # conv.cl's STORED); with `stored`, the forward's z + b and a are stored in 16 bits.

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


TILE, TILE_ROWS = 32, 8    # transpose's tiles and work-groups (elementwise.cl)
FUSED_LOSS_SAMPLES = 1      # the most samples a work-item of the fused loss and bias
                            # gradient takes (bias_softmax_xent_grad) for it to be tried: at
                            # 4 (mlp-small) one group lost to the two launches by 6-16 us on
                            # an H100 and PoCL, and routing's few trials can misjudge it


def operand_options(precision):
    """Build options that round every product's inputs as `precision` multiplies them
    (prelude.h's OPERAND: its stored mantissa bits, and IEEE half's range for fp16); none
    for fp32 and fp64, whose kernels are the plain ones."""
    bits = PRECISIONS[precision].mantissa
    if bits >= PRECISIONS["fp32"].mantissa:
        return []
    return [f"-DOPERAND_BITS={bits}"] + (["-DOPERAND_HALF=1"] if precision == "fp16" else [])


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


