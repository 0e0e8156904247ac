"""The narrow device contract under the kernel backends: `Runtime` names what a device must
do for portanet's kernels to run on it (allocate, free, copy in and out, compile, launch,
synchronize, record and replay, profile, say how much memory is left), and opencl.py
(`OpenCLRuntime`, pyopencl) and cuda.py (`CudaRuntime`, pycuda) implement it. Everything
above (the op families, GEMM routing, convolutions, the vendor GEMMs) reaches the device
only through these verbs, which a backend takes as its own (`KernelBackend._attach`).

A runtime keeps a reference to its backend for what the backend owns: the accounting of
live bytes (`_track`), the checks of what is written (`_check_write`), the texts of errors
(`_oom_text`) and the recorded steps' `generation`."""


class Runtime:
    """A device's verbs. Arrays are `DeviceArray`s (arrays.py): `buf` the runtime's buffer,
    `offset` in elements. Every verb runs holding the backend's lock (`lock`), which the
    backend takes before it calls one; none takes it again on a launch."""

    name = None                 # the backend's device string, for messages
    lock = None                 # the backend's lock (CUDA: it makes the context current)
    options = ()                # build options every kernel gets (REAL, OPERAND_BITS, ...)

    def empty(self, shape, dtype=None, label="buffer"):
        """allocate: an uninitialised DeviceArray of `shape` owning a new buffer, counted by
        the backend (`_track`) until it is freed or collected; an OutOfMemoryError naming
        `label`, the sizes and what is free where the device cannot hold it."""
        raise NotImplementedError

    def free_buffer(self, buf):
        """free: give a buffer back to the driver (the backend's accounting calls it once,
        from free() or the array's finalizer); kernels bound to it are forgotten."""
        raise NotImplementedError

    def write(self, dst, host, wait=True):
        """copy in: dst <- host (checked and converted by the backend's `_check_write`), in
        order after the work queued before; wait=False lets the copy go on after the call
        where the device can (host then stays as it is until the next synchronize)."""
        raise NotImplementedError

    def download(self, x):
        """copy out: a new NumPy array with x's contents, once the work before is done."""
        raise NotImplementedError

    def download_into(self, x, out):
        """copy out into `out` (a C-contiguous host array of x's size and dtype), whole
        after the next synchronize."""
        raise NotImplementedError

    def fetch(self, x, out):
        """download_into(x, out) in the background, and what `landed` waits on: an event
        after the copy, the queue sent on so that another thread may wait for it."""
        raise NotImplementedError

    def landed(self, ticket):
        """Wait for fetch's copy (from any thread, without the backend's lock)."""
        raise NotImplementedError

    def host_pin(self, array):
        """Backend.host_pin: array, registered with the driver where it pins host memory."""
        raise NotImplementedError

    def host_unpin(self, array):
        """Backend.host_unpin: give back host_pin's registration of array."""
        raise NotImplementedError

    def kernel(self, family, name, options=()):
        """compile: kernel `name` of the kernel family `family` (a file stem of kernels_cl/
        or kernels_cu/, sources.load) built with `options` besides the runtime's own; each
        family and options built once per runtime (the driver caches binaries on disk,
        under `cache_dir`); a KernelBuildError naming the file and the compiler's log."""
        raise NotImplementedError

    def built(self, family, options, arch=None):
        """Whether the family is built with `options` (for `arch`) in this process already,
        so that `kernel` asks no compiler for it."""
        raise NotImplementedError

    def build_many(self, builds, done=None, threads=None):
        """compile ahead: the families `builds` ((family, options, arch or None) each),
        several at once where the driver allows (`builds.in_threads`), each once, as
        `kernel` would build them; done(build) as each is ready; the first failure's
        KernelBuildError once the others are done."""
        raise NotImplementedError

    def launch(self, kernel, global_size, local_size, args):
        """launch: kernel over `global_size` work-items (OpenCL's terms, whatever the
        device) in groups of `local_size` (None: `default_local`), with `args` already
        packed (`pointer` for arrays, NumPy scalars), in order on the runtime's queue; while
        `capture` records, recorded instead. The hot path: no allocation, no wait."""
        raise NotImplementedError

    @staticmethod
    def pointer(x):
        """What a kernel takes for array x's buffer (its offset goes as an int beside it)."""
        raise NotImplementedError

    def synchronize(self):
        """Wait until all work given to the device is done."""
        raise NotImplementedError

    def capture(self, work):
        """capture: run work() once, recording its launches, and return a `Recorded` whose
        call replays them; None where work() did something a replay cannot repeat (a copy,
        a wait: it then ran eagerly, or not at all where the device records without
        running)."""
        raise NotImplementedError

    def marker(self):
        """An event in the queue's order, for `elapsed` (profiles)."""
        raise NotImplementedError

    @staticmethod
    def elapsed(start, end):
        """Device seconds between two markers (waits for end)."""
        raise NotImplementedError

    def profiling(self):
        """A context manager under which markers can be timed."""
        raise NotImplementedError

    def memory_info(self):
        """(free_bytes, total_bytes) of the device's memory now."""
        raise NotImplementedError

    def send(self, slot, part, turn):
        """part (host, samples first) into slot, a half (`turn`) of a staging buffer,
        through the copy lane beside the queue (staging.py), in order before the launches
        queued after; write_samples' way up."""
        raise NotImplementedError

    def laid_out(self, turn, laned):
        """After the launches that read half `turn` of staging: what the lane waits for
        before it writes there again (laned: the half was filled by `send`)."""
        raise NotImplementedError

    def device_id(self):
        """What identifies the device, its driver and the build options (kernel caches)."""
        raise NotImplementedError

    @property
    def cache_dir(self):
        """Where the driver keeps this runtime's compiled kernels."""
        raise NotImplementedError


class Recorded:
    """A training step a backend recorded (`capture`); calling it replays the step.
    `current` turns False once the backend has freed something the recording points at
    (its GEMM workspace grew for another product, its kernels were rebuilt): record again."""

    def __init__(self, backend):
        self.backend, self.generation = backend, backend.generation

    @property
    def current(self):
        return self.generation == self.backend.generation


def serialised_verb(name):
    """A backend's public method that runs its runtime's verb `name` holding the backend's
    lock: the one frame Backend.serialised's wrapper costs, with no method of the backend's
    between it and the runtime."""
    def verb(self, *args, **kwargs):
        with self._lock:
            return getattr(self.runtime, name)(*args, **kwargs)
    verb.__name__ = verb.__qualname__ = name
    verb.__doc__ = getattr(getattr(Runtime, name, None), "__doc__", None)
    verb.serialised = True
    return verb


def default_local(global_size, work_group):
    """The work-group of a launch that does not ask for one: 256 work-items in a row, or
    32 x 8 in two dimensions (dimension 0 runs along the batch), fewer where the device
    allows fewer. Fixed rather than left to the driver, which picks one per global size:
    PoCL compiles a kernel again for each group size it meets (a second or more each)."""
    if len(global_size) == 1:
        return (min(256, work_group),)
    x = min(32, work_group)
    return (x, max(1, min(8, work_group // x))) + (1,) * (len(global_size) - 2)
