"""What the OpenCL and CUDA backends share: `KernelBackend`, which builds and launches the
kernel families (kernels_cl/, and kernels_cu/ for CUDA's own) and stages batches. Its other
parts are their own modules: the op families' launches (ops/: blas, activations, loss,
pool, norm, optim), GEMM routing (gemm/router.py), the GEMM paths (gemm/paths.py),
convolutions (conv.py) and the 16-bit operand copies (shadows.py). The device
is reached through a runtime (runtime/: memory, copies, builds, launches, recorded steps);
each backend supplies its runtime and its vendor GEMM."""
import hashlib
import logging
import math
import sys
import time
import weakref

import numpy as np

from .. import config, progress
from ..errors import ShapeError
from ..precision import PRECISIONS, to_storage
from . import sources
from .arrays import MAX_GROUPS_1, DeviceArray
from .base import ACC_K, Backend
from .conv import ConvPaths
from .gemm.paths import GemmPaths
from .gemm.router import GemmRouting
from .gemm.tiling import norm_parts
from .foresight import Foresight
from .runtime import serialised_verb
from .shadows import Shadows
from .gemm.tuned import capped
from .ops.activations import ActivationKernels
from .ops.attention import AttentionKernels
from .ops.blas import BlasKernels
from .ops.embed import EmbedKernels
from .ops.loss import LossKernels
from .ops.norm import BN_WHOLE, NormKernels
from .ops.optim import UpdateKernels
from .ops.pool import PoolKernels

log = logging.getLogger("portanet")

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
                            "scale_by", "unscale_check", "clip_scale", "adam_scalars",
                            "update_loss_scale"),
            "loss": ("bias_softmax", "softmax_xent", "bias_softmax_xent",
                     "bias_softmax_xent_grad", "sigmoid_bce", "mse", "argmax"),
            "blas": ("gemv", "gemv_t", "ger", "gemm_split_sum", "activation_bias_grad"),
            "conv": ("im2col", "col2im", "conv_direct", "maxpool", "maxpool_grad", "avgpool",
                     "avgpool_grad", "dropout"),
            "norm": ("batchnorm_train", "batchnorm_infer", "batchnorm_delta", "batchnorm_grad",
                     "layernorm", "layernorm_params_grad", "layernorm_dx"),
            "embed": ("embedding", "embedding_grad", "embedding_pos_grad"),
            "attention": ("attention_forward", "attention_dsum", "attention_grad_q",
                          "attention_grad_kv")}
FAMILY_OF = {name: family for family, names in FAMILIES.items() for name in names}
REAL_ONLY = ("embed", "attention")  # families whose arrays are real in every precision
STORED = ["-DSTORED_HALF=1"]    # a family's build for 16-bit storage (copies.h's STORED_HALF)


class KernelBackend(Foresight, GemmRouting, GemmPaths, ConvPaths, Shadows, BlasKernels,
                    ActivationKernels, LossKernels, PoolKernels, NormKernels, EmbedKernels,
                    AttentionKernels, UpdateKernels, Backend):
    """A backend that runs portanet's kernels on a device's `runtime` (runtime/Runtime).
    Subclasses make their runtime, take its verbs (`_attach`), implement _gemm_vendor and
    call _load_kernels() once the runtime is ready."""

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

    # the runtime's public verbs, each run holding the backend's lock (Backend.serialised)
    empty, write, download, download_into = (serialised_verb(name) for name in (
        "empty", "write", "download", "download_into"))
    synchronize, capture, memory_info, profiling, fetch = (serialised_verb(name) for name in (
        "synchronize", "capture", "memory_info", "profiling", "fetch"))
    host_pin, host_unpin = serialised_verb("host_pin"), serialised_verb("host_unpin")

    def landed(self, ticket):
        self.runtime.landed(ticket)
    landed.serialised = True        # waits outside the lock (Backend.serialised)
    landed.__doc__ = Backend.landed.__doc__

    def _attach(self, runtime):
        """Take `runtime`'s verbs as this backend's own: the ones the ops call in their
        launches (`_run`) are the runtime's bound methods set on the backend, so that no
        frame of the backend's stands between an op and the device."""
        self.runtime = runtime
        self._launch, self._kernel, self._pointer = runtime.launch, runtime.kernel, runtime.pointer
        self._free_buffer, self._device_id = runtime.free_buffer, runtime.device_id
        self._send, self._laid_out = runtime.send, runtime.laid_out
        self._marker, self._elapsed = runtime.marker, runtime.elapsed

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
        # a step's builds, routing's trials' included, made together before it runs
        # (foresight.py) where threads help: a GPU driver's compiles, nvcc's, NVRTC's; a CPU
        # runtime compiles one at a time
        self.prebuilds = self.is_gpu
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

    def build_all(self, done=None):
        """Build every kernel this backend may launch whose build does not follow a
        product's shape (`builds`), several at once (the runtime's build_many), each once;
        done(build) as each is ready (a progress bar). `portanet devices --check` and
        `portanet warmup` call it. Seconds taken."""
        start = time.perf_counter()
        self._announce()
        self.runtime.build_many(self.builds(), done)
        for name in FAMILY_OF:
            self._named(name)
            if self.storage_dtype is not None:
                self._named(name, stored=True)
        return time.perf_counter() - start

    def builds(self):
        """(family, options, arch) of each build `build_all` makes: every family of FAMILIES
        with the options `_named` gives it, again in its 16-bit storage build where this
        precision stores 16 bits (but REAL_ONLY's), and the backend's own (`_own_builds`). Not the GEMM's,
        whose builds follow the products' shapes and tilings (`portanet warmup --model`
        makes those a network needs)."""
        out = []
        for family in FAMILIES:
            out.append((family, self._options(family, ()), None))
            if self.storage_dtype is not None and family not in REAL_ONLY:
                out.append((family, self._options(family, STORED), None))
        return out + list(self._own_builds())

    def _own_builds(self):
        """Builds of the backend's own kernels this precision launches, as `builds` gives
        them (CUDA's tensor-core GEMMs)."""
        return ()

    def _named(self, name, stored=False):
        """The kernel `name` of FAMILIES, built on first use; with stored, its build for
        16-bit storage (copies.h's STORED_HALF: the arrays it declares STORED are 16-bit)."""
        key = (name, "stored") if stored else name
        kernel = self._kernels.get(key)
        if kernel is None:
            kernel = self._kernels[key] = self._build(
                FAMILY_OF[name], name, STORED if stored else [])
        return kernel

    def _options(self, family, options):
        """A family's build options: `options` and, for the row groups' families, their
        local memory and tree's size."""
        if family in ("blas", "norm", "loss"):
            return [*options, f"-DGROUP_THREADS={self.gemv_threads}"]
        return list(options)

    def _announce(self):
        """Say, once per device, that this version's kernels are being built there for the
        first time: a first build can take a minute, and nothing else would explain the
        wait. Through the "portanet" logger where logging has a handler (the command line's
        prints on stderr), else straight on stderr."""
        if self._announced:
            return
        self._announced = True
        marker = config.cache_dir() / "built" / self._sources_id()
        if not marker.exists():
            note = (f"building kernels for {self.name} ({self.info()['name']}): first use, "
                    f"cached in {self.cache_dir}")
            if log.hasHandlers():
                log.info(note)
            else:       # logging left as it came (a script, a notebook): said on stderr
                bar = progress._tqdm()      # above a bar being drawn, where there is one
                (bar.write if bar else print)(note, file=sys.stderr)
            try:
                marker.parent.mkdir(parents=True, exist_ok=True)
                marker.touch()
            except OSError:
                pass                    # a read-only cache: the note comes each time

    def _build(self, family, name, options=()):
        """Build through the backend's _kernel (the binaries kept on disk under
        self.cache_dir: by the OpenCL driver, keyed by source, options, device and driver;
        CUDA's by cubins.py), announced the first time on this device (`_announce`).
        In a dry run (foresight.py) the build is noted instead."""
        options = self._options(family, options)
        if self.dry:
            return self._kernel(family, name, options)
        self._announce()
        start = time.perf_counter()
        kernel = self._kernel(family, name, options)
        log.debug("%s: built %s %s in %.2f s", self.name, name, " ".join(options),
                  time.perf_counter() - start)
        return kernel

    @property
    def cache_dir(self):
        """Where this backend's compiled kernels are kept (its runtime says where)."""
        return self.runtime.cache_dir

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
        by a string is built on first use, with stored in its 16-bit storage build. A dry
        run (foresight.py) launches nothing."""
        if isinstance(kernel, str):
            label, kernel = label or kernel, self._named(kernel, stored)
        if self.dry:
            return
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

    # -- how batch normalization's rows (ops/norm.py) are shared out on this device --------

    def _norm_pieces(self, rows, n, phases, placeholder):
        """(parts, ws, phases) of a row-wise norm.cl call: one group per row (BN_WHOLE) where
        the rows fill the device, ws then a placeholder (any real array of the call: the
        kernel does not touch it); else norm_parts pieces of each row in the launches of
        `phases`, their sums in the split workspace."""
        parts = norm_parts(rows, n, self.gemv_threads, self.compute_units)
        if parts == 1:
            return 1, placeholder, (BN_WHOLE,)
        return parts, self._split_workspace(2 * rows * parts), phases


def operand_options(precision):
    """Build options that round every product's inputs as `precision` multiplies them
    (prelude.h's OPERAND: its stored mantissa bits, and IEEE half's range for fp16); none
    for fp32 and fp64, whose kernels are the plain ones."""
    bits = PRECISIONS[precision].mantissa
    if bits >= PRECISIONS["fp32"].mantissa:
        return []
    return [f"-DOPERAND_BITS={bits}"] + (["-DOPERAND_HALF=1"] if precision == "fp16" else [])
