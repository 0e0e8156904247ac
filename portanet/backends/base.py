"""The Backend interface: everything a layer, loss or optimizer may ask of a device.

Layers are written once against this class. Device arrays are row-major and
activations are stored (features, batch): a column per sample. Every operation works in
place on arrays the caller allocated, so a training step allocates nothing.

One Backend serves every network built on its device string, from any thread; see
`Backend.serialised` for how its operations are kept apart, and `_track` for how its
memory accounting follows the lifetime of the arrays it hands out.
"""
import inspect
import threading
import weakref
from functools import wraps

import numpy as np

from .. import precision as precisions
from ..errors import DeviceError, PrecisionError, ShapeError
from . import lending
# the activations and the convolution's sizes live with the checks that use them; layers,
# tools and tests take them from here too
from .arrays import ACTIVATIONS  # noqa: F401
from .checks import ConvShape, conv_out  # noqa: F401
from .ops.activations import ActivationOps
from .ops.attention import AttentionOps
from .ops.blas import BlasOps
from .ops.embed import EmbedOps
from .ops.loss import LossOps
from .ops.norm import NormOps
from .ops.optim import UpdateOps
from .ops.pool import PoolOps


# no float sum of a product runs longer than this many terms (a GEMM's split-K parts and
# launches over pieces of K, vendor GEMM calls in pieces, gemv_t and the reference's gemv in
# pieces): a K = 150000 product of uniform [0, 1) inputs then errs by 1.3e-7 against float64
# (normwise), not by 8e-6 as one running sum does, and K = 10000 by 2.5e-7, not 1.4e-6
ACC_K = 2048

# the most a network's conv workspace (patch matrices, im2col) may take: larger ones are
# made and used chunk by chunk, so the workspace does not grow with the batch (on an
# H100, lenet-infer on 10000 images had needed 5.8 GiB for one patch matrix)
CONV_WORKSPACE_BYTES = 64 * 2**20


class Backend(BlasOps, ActivationOps, LossOps, PoolOps, NormOps, EmbedOps, AttentionOps,
              UpdateOps):
    """One device: its memory, accounting and products here, its op families' interfaces
    (backends/ops) as bases. Subclasses implement the methods that raise
    NotImplementedError."""

    kind = "abstract"           # "cpu", "opencl", "cuda"
    is_gpu = False
    vendor_gemm = False         # a vendor GEMM (CLBlast, cuBLAS) beside our own kernel
    simulator = False           # checks kernels (Oclgrind) rather than running them fast
    # True: every public method runs holding the backend's re-entrant lock, so operations
    # from several threads follow one another whole. A device backend needs it: its
    # operations share kernel objects (arguments are set, then the kernel is enqueued), a
    # split-K workspace (written by one launch, summed by the next), a queue or stream and
    # the vendor BLAS handle. The NumPy backend shares nothing but its accounting.
    serialised = False
    max_alloc_bytes = None      # the largest single buffer, where the device has a limit
    stages_samples = False      # write_samples lays batches out on the device (staging)
    dry = False                 # a dry run is going: nothing reaches the device (`prebuild`)

    def __init__(self, name, dtype=np.float32, precision=None):
        self.name = name                     # the device string that selects it
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.float32, np.float64):
            raise ShapeError(f"dtype {self.dtype} is not supported: use float32 or float64")
        # what the products round to (portanet/precision.py); the dtype stays the storage
        self.precision = precisions.resolve(precision, self.dtype)
        self.allocations = 0                 # number of allocations so far
        self.allocated_bytes = 0             # live bytes now
        self.peak_bytes = 0
        self.gemm_path = "reference"         # "own" or "vendor" on GPU backends
        self._lock = threading.RLock()       # see `serialised`; always guards accounting
        self._owned = {}                     # id(array) -> its weakref.finalize, see _track

    def __init_subclass__(cls, **kwargs):
        """Wrap every public method of a serialised backend, its inherited ones included,
        in the lock: one place that every operation passes through."""
        super().__init_subclass__(**kwargs)
        if not cls.serialised:
            return
        for name in dir(cls):
            method = inspect.getattr_static(cls, name)     # staticmethods, properties: not
            if (not name.startswith("_") and inspect.isfunction(method)
                    and not getattr(method, "serialised", False)):
                setattr(cls, name, _serialised(method))

    def prebuild(self, *works):
        """Make, several at once, every kernel build that the calls `works` will need, before
        they run (a device backend's: backends/foresight.py). The number made; the NumPy
        reference builds nothing."""
        return 0

    @property
    def precisions(self):
        """The precisions this device computes for this dtype (portanet/precision.py)."""
        return ("fp64",) if self.dtype == np.float64 else ("fp32",)

    def check_precision(self):
        """A DeviceError naming the device and the precisions it computes, where its own
        is not one of them (a PrecisionError). Called by each backend before it takes device
        resources."""
        if self.precision not in self.precisions:
            raise PrecisionError(f"{self.name} ({self.device_text()}) does not compute in "
                              f"{self.precision}: it has {', '.join(self.precisions)}"
                              f"{self.precision_hint()}")

    def device_text(self):
        """The device's name in words, for messages."""
        return self.kind

    def precision_hint(self):
        """Why the device lacks its precision (self.precision), and where to find it."""
        return ""

    # -- accounting, shared by every backend ---------------------------------------------

    def _track(self, array, nbytes, buf=None):
        """Count `nbytes` as allocated until `array` (which owns its memory) is freed or
        garbage-collected, whichever comes first; then free `buf`, its device buffer.
        A network dropped without free() gives its memory back when it is collected."""
        with self._lock:
            self.allocations += 1
            self.allocated_bytes += nbytes
            self.peak_bytes = max(self.peak_bytes, self.allocated_bytes)
            finalizer = weakref.finalize(array, self._reclaim, id(array), nbytes, buf)
            finalizer.atexit = False         # at exit the driver frees everything anyway
            self._owned[id(array)] = finalizer
        return array

    def _untrack(self, array):
        """Release `array` now if the backend made it and it is not released yet (a view,
        a second free: nothing); its finalizer then does nothing when it is collected."""
        with self._lock:
            finalizer = self._owned.pop(id(array), None)
            if finalizer is not None:
                finalizer()

    def _reclaim(self, key, nbytes, buf):
        """The finalizer of a tracked array: it runs once, from free() or from the garbage
        collector in whatever thread dropped the array, so it takes the lock (which also
        makes a CUDA context current for _free_buffer)."""
        with self._lock:
            self._owned.pop(key, None)
            if buf is not None:
                self._free_buffer(buf)
            self.allocated_bytes -= nbytes

    def _free_buffer(self, buf):
        """Give a device buffer back to the driver (device backends)."""

    # -- memory --------------------------------------------------------------------------

    def empty(self, shape, dtype=None, label="buffer"):
        """Uninitialised array of `shape`; `label` names it in out-of-memory errors."""
        raise NotImplementedError

    def clear(self, x):
        """x <- 0, where the device can without a kernel (CUDA's memset): what a network's
        creation and its optimizer's state use, so that a first use there builds nothing
        before the first step, whose builds are made together (`prebuild`). Else `fill`.
        Not inside recorded work (OpenCL's launch lists replay kernels only)."""
        self.fill(x, 0.0)

    def zeros(self, shape, dtype=None, label="buffer"):
        x = self.empty(shape, dtype, label)
        self.fill(x, 0)
        return x

    def upload(self, host, label="buffer"):
        host = np.ascontiguousarray(host, dtype=_device_dtype(host.dtype, self.dtype))
        x = self.empty(host.shape, host.dtype, label)
        self.write(x, host)
        return x

    def write(self, dst, host, wait=True):
        """Copy the host array into the existing device array `dst` (same size). wait=False
        lets the copy go on after the call where the device can: host must then stay as it
        is until the next synchronize or download."""
        raise NotImplementedError

    def write_samples(self, dst, host, staging=None, bad=None, first=0):
        """dst (features, m) <- host (m, ...): a batch as users hold it, samples first, in
        the device layout; host is read before the call returns. Kernel backends send it as
        it is, through `staging` (a flat device buffer of at least one sample, planned
        where `stages_samples`), and lay it out there, while the device goes on with the
        work before it; without staging, or here, the host transposes it. bad: a device
        int32 array of one element that takes the least index (first + sample) of a sample
        holding NaN or inf, where it is less: read when the caller waits anyway."""
        if bad is not None:
            self._flag_nonfinite(bad, host, first)
        dtype = self.dtype if self._stored(dst) else dst.dtype   # (write rounds into storage)
        self.write(dst, features_first(host, dtype), wait=False)    # a copy: ours

    def stage_samples(self, staging, host):
        """host (m, ...), a batch samples first, into the start of `staging` as it is, for
        lay_out to put in the device layout inside the step that reads it (fit's recorded
        step); the staged view, or None where write_samples takes the batch instead (here:
        there is no staging)."""
        return None

    def lay_out(self, dst, staged):
        """dst (features, m) <- staged, the m samples that stage_samples put there."""
        raise NotImplementedError

    def _flag_nonfinite(self, bad, host, first):
        finite = np.isfinite(np.asarray(host).reshape(len(host), -1)).all(axis=1)
        if not finite.all():
            least = min(int(self.download(bad)[0]), first + int(np.argmin(finite)))
            self.write(bad, np.array([least], np.int32))

    def write_samples_device(self, dst, src, bad=None, first=0):
        """write_samples from src (m, features), a batch samples first that is in device
        memory already (another library's, through DLPack: see dlpack_source), laid out
        from where it is."""
        raise NotImplementedError

    def dlpack_source(self):
        """(DLPack device, stream) of the memory besides the host's that this backend's
        kernels read in place (portanet/dlpack.py), or None: host memory only."""
        return None

    def dlpack_view(self, x):
        """x lent to other libraries through DLPack, without a copy (pn.to_dlpack)."""
        raise DeviceError(f"{self.name} cannot lend its arrays through DLPack: copy them to "
                          f"the host instead (net.get_weights())")

    def download(self, x):
        """A new NumPy array with the contents of device array `x`."""
        raise NotImplementedError

    def download_into(self, x, out):
        """Copy device array `x` into the host array `out` (of x's size), in order after the
        work queued before it; out is whole after the next synchronize (at once where the
        device cannot copy in the background). Fastest into a `host_empty` array."""
        out = self._check_download(x, out)
        out[...] = self.download(x).reshape(out.shape)

    def fetch(self, x, out):
        """download_into(x, out), and a ticket for `landed`: out holds x once
        landed(ticket) returns (here at once: the copy is done)."""
        self.download_into(x, out)

    def landed(self, ticket):
        """Wait until the copy of the `fetch` that gave ticket is in host memory. Any
        thread may wait here while others use the backend (host staging's worker does)."""
    landed.serialised = True        # waits outside the lock (Backend.serialised)

    @staticmethod
    def _check_download(x, out):
        if out.size != x.size or out.dtype != x.dtype or not out.flags.c_contiguous:
            shape = getattr(x, "shape", None)
            raise ShapeError(f"download_into: an array of {shape} {x.dtype} into a host array "
                             f"of {out.shape} {out.dtype}: give a C-contiguous one of its "
                             f"size and dtype")
        return out

    def host_empty(self, shape, dtype=None):
        """A host array that the device copies into fastest (pinned memory on CUDA)."""
        return np.empty(shape, dtype or self.dtype)

    def host_pin(self, array):
        """array (C-contiguous host memory that outlives the pin), which the device then
        copies from and into fastest and in the background, until host_unpin(array)
        (registered with CUDA's driver; elsewhere nothing changes)."""
        return array

    def host_unpin(self, array):
        """Give back host_pin's pin of array, before its memory goes."""

    def view(self, x, shape, offset=0):
        """The prod(shape) elements of `x` from `offset` on, as an array of `shape`; no copy."""
        raise NotImplementedError

    def free(self, x):
        """Give back the memory of `x` now. A view, or an array freed already: nothing.
        Arrays that are simply dropped give theirs back when they are collected. Memory
        lent to another library through DLPack goes back when the last lend is let go."""
        if not lending.free_later(self, x):
            self._untrack(x)

    def synchronize(self):
        pass

    def capture(self, work):
        """A callable that replays what work() launches, recorded once (CUDA graphs), or
        None where the device cannot record (work() is then not run). The callable's
        `current` turns False when the backend frees something it points at."""
        return None

    def memory_info(self):
        """(free_bytes, total_bytes) of the device's memory now; `max_alloc_bytes` is the
        largest single buffer where the device limits it (OpenCL), else None."""
        raise NotImplementedError

    def operand_bytes(self, products, kept=()):
        """The workspaces this backend's matrix products [(elements of a, of b, of c)]
        need beside their operands, {name: (bytes needed, bytes held now, dtype)}, with
        the copies of arrays of `kept` elements each that layers keep (keep_operands):
        none here. Kernel backends copy the inputs of a vendor GEMM to 16 bits in bf16 and
        fp16 ("16-bit operands"), and may run a large float32 product on a transposed copy
        of a ("transposed operands"). A network's memory plan counts them; the backend
        grows them at the first product that needs more."""
        return {}

    def keep_operands(self, *arrays):
        """A layer's word that `arrays` are not written until drop_operands: a backend that
        copies a product's inputs (CUDA's bf16 and fp16) copies each once for every
        product that reads it in between. Here, nothing."""

    def drop_operands(self, *arrays):
        """The end of keep_operands' word for `arrays`."""

    def drop_all_operands(self):
        """The end of every keep_operands' word: a forward pass starts with none, so that a
        step stopped midway (an interrupt, an error) leaves no word that the next one would
        take for its own."""

    # -- BLAS-like, in place -------------------------------------------------------------

    def gemm(self, alpha, a, b, beta, c, trans_a=False, trans_b=False):
        """c <- alpha op(a) op(b) + beta c."""
        raise NotImplementedError

    def gemv(self, alpha, a, x, beta, y, trans_a=False):
        """y <- alpha op(a) x + beta y."""
        raise NotImplementedError

    def ger(self, alpha, x, y, a):
        """a <- alpha x y^T + a."""
        raise NotImplementedError

    # -- 16-bit storage, and the products fused with their neighbours --------------------

    @property
    def storage_dtype(self):
        """The dtype of this precision's 16-bit storage (precision.STORAGE), or None: none
        in fp32, tf32 and fp64."""
        return precisions.STORAGE.get(self.precision)

    def _stored(self, x):
        """Whether the array x is held in this precision's 16-bit storage."""
        storage = self.storage_dtype        # (None == float64 in NumPy: compared only if set)
        return storage is not None and x.dtype == storage

    def dense(self, kind, w, x, b, z, a):
        """A dense layer's forward: z <- w x + b 1^T; a <- f(z). Here the product and
        bias_activation; kernel backends fuse them where their GEMM allows."""
        self.gemm(1.0, w, x, 0.0, z)
        self.bias_activation(kind, z, b, a)

    def activation_bias_grad(self, kind, z, da, alpha, beta, gb, ones):
        """A layer's delta and its bias gradient: z <- f'(z) * da (in place), then
        gb <- alpha z ones + beta gb (ones: the layer's vector of z's columns). Here the
        two calls; kernel backends make it one pass over z. z may be in 16-bit storage
        (storage_dtype): the delta is then stored rounded, and gb sums it before it
        rounds."""
        self.activation_grad(kind, z, da)
        self.gemv(alpha, z, ones, beta, gb)

    # images are (C, H, W, N), batch innermost; the shapes of the arguments say the sizes

    def im2col(self, cols, x, k, stride, pad):
        """cols (C.k.k, Ho.Wo.N) <- the k x k patches of x (C, H, W, N), zero padded."""
        raise NotImplementedError

    def col2im(self, x, cols, k, stride, pad):
        """x (C, H, W, N) <- the adjoint of im2col: each pixel sums the cols entries of it."""
        raise NotImplementedError

    # convolution: x (C, H, W, N) images, w (F, C.k.k) filters (row (c, ki, kj) order),
    # outputs (F, Ho, Wo, N), any shapes of those sizes. `workspace` (a 1-D array, or None)
    # is the room a backend may use for patch matrices (im2col), chunk by chunk when it is
    # smaller than the whole: the network sizes it at most CONV_WORKSPACE_BYTES, so patch
    # matrices never grow with the batch. Backends that gather patches inside their GEMM
    # (implicit GEMM) need none.

    def conv(self, kind, w, x, b, z, a, k, stride, pad, workspace=None, stored=None):
        """z <- w * x + b (the convolution, a bias per filter); a <- f(z), kind an
        activation (softmax: over the filters of each position). a may be z. Returns True
        where the workspace holds x's whole patch matrix afterwards (see conv_weight_grad),
        else False. x may be in 16-bit storage (storage_dtype). With `stored` (a layer that
        stores its outputs in 16 bits), z takes the product's float32 sums and stored and a
        the rounded z + b and f(z + b), as bias_activation's `stored`."""
        raise NotImplementedError

    def conv_weight_grad(self, alpha, dz, x, beta, gw, k, stride, pad, workspace=None,
                         patches=False):
        """gw (F, C.k.k) <- alpha dz * patches(x)^T + beta gw: dz (F, Ho, Wo, N), the
        gradient of the convolution's output; x its input; either may be in 16-bit storage.
        patches=True: the workspace still holds x's patch matrix, as the conv that returned
        True left it."""
        raise NotImplementedError

    def conv_input_grad(self, dx, w, dz, k, stride, pad, workspace=None, add=False):
        """dx (C, H, W, N) <- the adjoint of the convolution applied to dz (F, Ho, Wo, N):
        col2im(w^T dz), overwriting dx, or with add added to it (a Residual block's
        projection adds its part of dL/dx to the inner layers'); dz may be in 16-bit
        storage, dx is real."""
        raise NotImplementedError

    # -- description ---------------------------------------------------------------------

    def info(self):
        """dict with at least name, vendor, memory_bytes."""
        raise NotImplementedError

    def __repr__(self):
        return f"<{type(self).__name__} {self.name} {self.dtype} {self.precision}>"


def _serialised(method):
    """`method`, run holding its backend's lock (see Backend.serialised)."""
    @wraps(method)
    def locked(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)
    locked.serialised = True
    return locked


def features_first(x, dtype, out=None, block=256):
    """Samples-first x (N, ...) as a C-contiguous (features, N) array of dtype (or into
    out), copied `block` samples at a time so that the rows read stay in the cache: 7 ms
    for 10000 images of 784 pixels, where NumPy's copy of the transposed view took 22 ms
    (and 171 against 712 ms for 10000 x 10000)."""
    rows = np.asarray(x).reshape(len(x), -1)
    if out is None:
        out = np.empty((rows.shape[1], len(x)), dtype)
    elif out.shape != (rows.shape[1], len(x)):
        raise ShapeError(f"write_samples: {len(x)} samples of {rows.shape[1]} features into "
                         f"an array of {out.shape}")
    for i in range(0, len(x), block):
        out[:, i:i + block] = rows[i:i + block].T
    return out


def _device_dtype(host_dtype, real_dtype):
    """Integer host data (labels) stays int32 on the device; floats become the real dtype."""
    return np.int32 if np.issubdtype(host_dtype, np.integer) else real_dtype
