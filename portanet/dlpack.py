"""DLPack in and out: other libraries' arrays (NumPy, PyTorch, CuPy, JAX) as inputs, and a
network's arrays lent to them, without a copy wherever the memory allows it.

In (`taken`, `host`): fit, evaluate and predict take any array with `__dlpack__`.
- Host memory (kDLCPU) is NumPy's from_dlpack: no copy.
- Memory on the device the backend runs on (a CUDA tensor on the cuda backend's GPU:
  `Backend.dlpack_source`) is read where it is. The producer's capsule, asked for with our
  stream (`__dlpack__(stream=...)`, so that the producer orders its work before ours), is
  parsed here; its batches are laid out straight from its pointer by the kernel that lays
  out uploaded ones (`write_samples_device`). The capsule is renamed "used_dltensor" when
  taken, and its deleter called when the call is done, after a synchronize (`release`).
  Targets (y) are checked on the host, so they come down: one number per sample.
- Other memory (a CUDA tensor given to cpu or OpenCL) is asked for a host copy
  (`np.from_dlpack(x, device="cpu")`, NumPy >= 2.1), else refused with the fix.

Out (`to_dlpack`, `Layer.weights`): NumPy arrays on cpu, which speak DLPack themselves; on
cuda a `DeviceView`, whose `__dlpack__` hands out a legacy "dltensor" capsule made here
with ctypes. The structs are dlpack.h's, as DLPack's own pure-ctypes example spells them
(github.com/dmlc/dlpack, apps/numpy_dlpack). OpenCL cannot lend: DLPack names OpenCL devices
(kDLOpenCL = 4), but no library imports them.
"""
import atexit
import contextlib
import ctypes
import math

import numpy as np

from . import backends
from .backends.gpu import DeviceArray
from .errors import InputError, PortanetError

# DLDeviceType: where a DLPack tensor's memory is
CPU, CUDA, CUDA_HOST, OPENCL, ROCM = 1, 2, 3, 4, 10
DEVICE_NAMES = {CPU: "cpu", CUDA: "cuda", CUDA_HOST: "cuda pinned host memory",
                OPENCL: "opencl", 7: "vulkan", 8: "metal", ROCM: "rocm",
                11: "rocm pinned host memory", 13: "cuda managed memory", 14: "oneapi"}
# DLDataTypeCode -> NumPy's kind; 4 (bfloat) and 5 (complex) have no NumPy float of theirs
TYPE_CODES = {0: "int", 1: "uint", 2: "float", 6: "bool"}
CODE_NAMES = {**TYPE_CODES, 3: "pointer", 4: "bfloat", 5: "complex"}


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    """data + byte_offset is element (0, ...); strides in elements, NULL for C order."""
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensor(ctypes.Structure):
    """The legacy (unversioned) tensor a "dltensor" capsule holds: whoever takes the
    capsule calls deleter(self) when done with the memory."""
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", DELETER)]


def _api(name, result, *arguments):
    """A function of the C API with its own signature (not ctypes.pythonapi's shared one)."""
    return ctypes.PYFUNCTYPE(result, *arguments)((name, ctypes.pythonapi))


_capsule_new = _api("PyCapsule_New", ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p,
                    ctypes.c_void_p)
_is_valid = _api("PyCapsule_IsValid", ctypes.c_int, ctypes.py_object, ctypes.c_char_p)
_get_pointer = _api("PyCapsule_GetPointer", ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)
_set_name = _api("PyCapsule_SetName", ctypes.c_int, ctypes.py_object, ctypes.c_char_p)
# a capsule's destructor gets it as it is being destroyed: an address, never a reference
_valid_at = _api("PyCapsule_IsValid", ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)
_pointer_at = _api("PyCapsule_GetPointer", ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)
_malloc = _api("PyMem_RawMalloc", ctypes.c_void_p, ctypes.c_size_t)
_free = _api("PyMem_RawFree", None, ctypes.c_void_p)

# capsule names: the consumer of a capsule renames it, which tells its destructor that the
# tensor is the consumer's to delete now (module constants: a capsule keeps the pointer)
_NAME, _USED = b"dltensor", b"used_dltensor"


# -- in ----------------------------------------------------------------------------------


@contextlib.contextmanager
def taken(x, backend):
    """x as fit, evaluate and predict read it, for the length of the with block: a NumPy
    array for host memory (np.from_dlpack, no copy; anything else that is not a DLPack
    array is left to np.asarray), a `DeviceSamples` for memory on the backend's own device,
    let go when the block ends (after the device has finished with it)."""
    x = samples(x, backend)
    try:
        yield x
    finally:
        release(x)


def samples(x, backend):
    """x through DLPack (see `taken`); a DeviceSamples is held once more, until `release`."""
    if isinstance(x, DeviceSamples):
        x.tensor.holds += 1
        return x
    here, tensor = _arrived(x, backend, "the input")
    if tensor is None:
        return here
    if tensor.dtype != backend.dtype:
        tensor.release()
        raise InputError(f"input is a {device_text(device_of(x))} array of {tensor.dtype}; "
                         f"the network reads device inputs in place as {backend.dtype}: "
                         f"convert it there first (torch: x.float(), CuPy and JAX: "
                         f"x.astype('{backend.dtype}'))")
    return DeviceSamples(tensor)


def host(y, backend):
    """y as a NumPy array (targets, which are checked on the host): through DLPack where it
    speaks it, copied down where it lives on the backend's device."""
    here, tensor = _arrived(y, backend, "the targets")
    if tensor is None:
        return np.asarray(here)
    try:
        return backend.download(DeviceArray(tensor.data, 0, tensor.shape, tensor.dtype))
    finally:
        tensor.release()


def _arrived(x, backend, what):
    """(x as the host reads it, None), or (None, the Taken tensor) where x lives on the
    backend's own device: x itself where it speaks no DLPack, host memory without a copy,
    other devices' memory copied down (or refused, naming `what`)."""
    where = device_of(x)
    if where is None:
        return x, None
    if where[0] == CPU:
        return _from_host(x), None
    source = backend.dlpack_source()
    if source is None or where != source[0]:
        return _host_copy(x, where, backend, what), None
    return None, consume(x, source[0], source[1], backend)


def release(x):
    """Let go of one hold of x where it is DeviceSamples (see `taken`); else nothing."""
    if isinstance(x, DeviceSamples):
        x.tensor.release()


def device_of(x):
    """x's DLPack device, (type, id) as ints, or None where x is a NumPy array or does not
    speak DLPack."""
    if isinstance(x, np.ndarray) or not hasattr(x, "__dlpack__"):
        return None
    if not hasattr(x, "__dlpack_device__"):
        raise InputError(f"{type(x).__name__} has __dlpack__ but no __dlpack_device__, "
                         f"which DLPack asks of every array: convert it to a NumPy array")
    kind, index = x.__dlpack_device__()
    return int(kind), int(index)


def device_text(where):
    """'cuda:1' for (2, 1)."""
    return f"{DEVICE_NAMES.get(where[0], f'DLPack device type {where[0]}')}:{where[1]}"


def _from_host(x):
    try:
        return np.from_dlpack(x)
    except (BufferError, RuntimeError, TypeError, ValueError) as e:
        raise InputError(f"NumPy cannot take the input ({type(x).__name__}) through DLPack: "
                         f"{e}") from e


def _host_copy(x, where, backend, what="the input"):
    """A host copy of x from its producer (NumPy >= 2.1 asks for one), or the InputError
    that says where x lives and how to bring it and the network together."""
    try:
        return np.from_dlpack(x, device="cpu")
    except (BufferError, RuntimeError, TypeError, ValueError, NotImplementedError) as e:
        here = device_text(where)
        fixes = ["copy it to the host (torch: x.cpu(), CuPy: x.get(), JAX: "
                 "jax.device_get(x))"]
        if where[0] == CUDA and backend.kind == "cuda":
            fixes.append(f"move it to {backend.name} (torch: x.to('{backend.name}'))")
        elif where[0] == CUDA:
            fixes.append(f"build the network on device='{here}', which reads it in place")
        raise InputError(f"{what} live on {here}, but the network is on {backend.name}, "
                         f"which cannot read it there ({e}): {', or '.join(fixes)}") from e


class Taken:
    """A DLPack tensor taken from its producer (the capsule renamed): its memory, read in
    place, until `release` has let go of every hold and calls the producer's deleter, after
    the backend's synchronize (kernels may still be reading it until then)."""

    def __init__(self, address, data, shape, dtype, backend):
        self.address, self.data, self.shape, self.dtype = address, data, shape, dtype
        self.backend, self.holds = backend, 1

    def release(self):
        self.holds -= 1
        if self.holds <= 0:
            self._let_go()

    def _let_go(self):
        address, self.address = self.address, None
        if address is None:
            return
        if self.backend is not None:
            self.backend.synchronize()
        deleter = DLManagedTensor.from_address(address).deleter
        if deleter:
            deleter(address)

    def __del__(self):
        """A hold never released (a bug): still the producer's deleter, once."""
        try:
            self._let_go()
        except Exception:           # the process is ending
            pass


def consume(x, device, stream, backend=None):
    """x's memory on `device` (DLPack's (type, id)) as a Taken: its capsule asked for with
    the consumer's `stream` (None on the host) and checked (device, C order, a dtype NumPy
    knows) before it is renamed, so that a refused one goes back to its producer whole."""
    try:
        capsule = x.__dlpack__(stream=stream)
    except (BufferError, RuntimeError, TypeError, ValueError) as e:
        raise InputError(f"{type(x).__name__}.__dlpack__ failed: {e}") from e
    if not _is_valid(capsule, _NAME):
        raise InputError(f"{type(x).__name__}.__dlpack__() gave no legacy 'dltensor' "
                         f"capsule, which DLPack asks for when no max_version is given")
    address = _get_pointer(capsule, _NAME)
    t = DLManagedTensor.from_address(address).dl_tensor
    where = (t.device.device_type, t.device.device_id)
    shape = tuple(t.shape[i] for i in range(t.ndim))
    dtype = _numpy_dtype(t.dtype)
    what = f"a {device_text(where)} array of {shape}"
    if where != tuple(device):
        raise InputError(f"{type(x).__name__} says it lives on {device_text(device)} but its "
                         f"DLPack tensor is on {device_text(where)}")
    if dtype is None:
        raise InputError(f"input is {what} of {_dtype_text(t.dtype)}, which NumPy has no "
                         f"type for: convert it (torch: x.float())")
    if t.strides and not _c_order(shape, [t.strides[i] for i in range(t.ndim)]):
        raise InputError(f"input is {what} that is not C-contiguous (a transpose or a "
                         f"slice with steps): make it so first (torch: x.contiguous(), "
                         f"CuPy: cupy.ascontiguousarray(x))")
    _set_name(capsule, _USED)
    return Taken(address, (t.data or 0) + t.byte_offset, shape, dtype, backend)


def _numpy_dtype(dt):
    kind = TYPE_CODES.get(dt.code)
    if kind is None or dt.lanes != 1:
        return None
    try:
        return np.dtype("bool" if kind == "bool" else f"{kind}{dt.bits}")
    except TypeError:
        return None


def _dtype_text(dt):
    kind = CODE_NAMES.get(dt.code, f"type code {dt.code}")
    return f"{kind}{dt.bits}" + (f"x{dt.lanes}" if dt.lanes != 1 else "")


def _c_order(shape, strides):
    """Whether strides (in elements) are C order's; a dimension of one may have any."""
    want = 1
    for n, stride in zip(reversed(shape), reversed(strides)):
        if n != 1 and stride != want:
            return False
        want *= n
    return True


class DeviceSamples:
    """Samples first, (N, ...), on the backend's device in another library's memory (a
    Taken), read in place: slices along the samples (x[i:j]) share it, as a NumPy array's
    do; `array` is the (samples, features) DeviceArray at its address, for the kernels."""

    def __init__(self, tensor, start=0, stop=None):
        self.tensor, self.start = tensor, start
        self.stop = tensor.shape[0] if stop is None else stop

    @property
    def shape(self):
        return (self.stop - self.start,) + self.tensor.shape[1:]

    @property
    def ndim(self):
        return len(self.tensor.shape)

    @property
    def dtype(self):
        return self.tensor.dtype

    def __len__(self):
        return self.stop - self.start

    def __getitem__(self, key):
        if not isinstance(key, slice):
            raise TypeError(f"DeviceSamples takes slices of samples (x[i:j]), not {key!r}")
        start, stop, step = key.indices(len(self))
        if step != 1:
            raise TypeError("DeviceSamples takes slices of whole runs of samples (step 1)")
        return DeviceSamples(self.tensor, self.start + start,
                             self.start + max(start, stop))

    @property
    def array(self):
        if self.tensor.address is None:
            raise PortanetError("device samples read after they were let go (a portanet "
                                "bug: a hold was released too early)")
        features = math.prod(self.tensor.shape[1:])
        start = self.tensor.data + self.start * features * self.dtype.itemsize
        return DeviceArray(start, 0, (len(self), features), self.dtype)

    def __repr__(self):
        return f"DeviceSamples(shape={self.shape}, dtype={self.dtype})"


# -- out ---------------------------------------------------------------------------------


def to_dlpack(x):
    """x, a device array that a network holds (a layer's w or a, say), as an array other
    libraries take without a copy through DLPack, e.g. torch.from_dlpack(pn.to_dlpack(x)):
    x itself on cpu (a NumPy array), a DeviceView on cuda. OpenCL cannot lend its arrays
    (a DeviceError says so and what to do instead)."""
    if isinstance(x, np.ndarray):
        return x
    backend = backends.holder(x) if isinstance(x, DeviceArray) else None
    if backend is None:
        raise InputError(f"to_dlpack takes an array a network holds (a layer's w, a "
                         f"layer.weights() entry), got {x!r}: not one a backend made, or "
                         f"one freed already")
    return backend.dlpack_view(x)


class DeviceView:
    """A backend's device array lent to another library without a copy, through DLPack:
    torch.from_dlpack(view), cupy.from_dlpack(view). The consumer's tensor is the array:
    a write there is the network's, and the array stays allocated until the consumer lets
    go of it. Before the capsule goes out, the backend's stream is synchronized (so what
    was queued is written); a consumer that writes on a stream of its own must let that
    finish (torch.cuda.synchronize()) before portanet uses the array again."""

    def __init__(self, backend, array, address, device):
        self.backend, self.array, self.address = backend, array, address
        self.device = tuple(device)

    @property
    def shape(self):
        return self.array.shape

    @property
    def dtype(self):
        return self.array.dtype

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        """A legacy "dltensor" capsule (max_version is the consumer's to ask for; DLPack lets
        a producer answer with the legacy form). stream -1: no synchronization."""
        if dl_device is not None and tuple(int(d) for d in dl_device) != self.device:
            raise BufferError(f"{self.backend.name}'s array lives on "
                              f"{device_text(self.device)} and is lent there only: copy it "
                              f"on that device, or download it (net.get_weights())")
        if copy:
            raise BufferError(f"{self.backend.name} lends its arrays, it does not copy them: "
                              f"take the view and copy it there, or download it "
                              f"(net.get_weights())")
        if stream != -1:
            self.backend.synchronize()
        return _lend(self.array, self.address, self.device)

    def __repr__(self):
        return (f"DeviceView({device_text(self.device)}, shape={self.shape}, "
                f"dtype={self.dtype})")


_lent = {}          # address of a DLManagedTensor made here -> the array it lends


def _lend(x, address, device):
    """A "dltensor" capsule lending x (its first element at `address` on `device`): a
    DLManagedTensor with its shape and strides in one block of raw memory, whose deleter
    lets go of x (kept in _lent until then) and frees the block."""
    ndim = len(x.shape)
    head = ctypes.sizeof(DLManagedTensor)
    block = _malloc(head + 16 * ndim)
    if not block:
        raise MemoryError("no host memory for a DLPack tensor's description")
    dims = (ctypes.c_int64 * (2 * ndim)).from_address(block + head)
    strides = [math.prod(x.shape[i + 1:]) for i in range(ndim)]
    dims[:] = list(x.shape) + strides
    managed = DLManagedTensor.from_address(block)
    t = managed.dl_tensor
    t.data, t.device, t.ndim = address, DLDevice(*device), ndim
    t.dtype = DLDataType({"f": 2, "i": 0, "u": 1, "b": 6}[x.dtype.kind],
                         8 * x.dtype.itemsize, 1)
    t.shape = ctypes.cast(block + head, ctypes.POINTER(ctypes.c_int64))
    t.strides = ctypes.cast(block + head + 8 * ndim, ctypes.POINTER(ctypes.c_int64))
    t.byte_offset = 0       # data is the first element, as PyTorch and CuPy hand theirs out
    managed.manager_ctx = None
    managed.deleter = _DELETE
    _lent[block] = x
    return _capsule_new(block, _NAME, ctypes.cast(_DESTROY, ctypes.c_void_p).value)


def _let_go(block):
    """The deleter of a DLManagedTensor made here: called once, by its consumer or by
    the capsule's destructor. The last lend of memory a backend was asked to free
    (free_later) frees it now."""
    x = _lent.pop(block, None)
    if x is None:
        return
    _free(block)
    owner = _owner(x)
    waiting = _unfreed.get(id(owner))
    if waiting is not None and not _lends(owner):
        del _unfreed[id(owner)]
        waiting[1].free(owner)


_unfreed = {}       # id(array) -> (array, its backend): freed when its last lend is let go


def free_later(backend, x):
    """Whether x's memory is lent now (to_dlpack, Layer.weights): then it is not freed
    until the last consumer lets go of it (Backend.free asks), so that a tensor another
    library holds never points at memory given back or reused."""
    owner = _owner(x)
    if not _lends(owner):
        return False
    _unfreed[id(owner)] = owner, backend
    return True


def _owner(x):
    return x if getattr(x, "base", None) is None else x.base


def _lends(owner):
    return any(_owner(x) is owner for x in _lent.values())


_DELETE = DELETER(_let_go)


@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def _DESTROY(capsule):
    """The destructor of a capsule made here: one never consumed (still named "dltensor")
    lets go of its tensor. A consumer may drop a capsule it refuses while it raises (NumPy
    given a cuda view); ctypes then raises that exception at our first call. It is caught,
    the capsule let go, and raised again, which ctypes reports as ignored: a Python
    callback cannot hand an exception back to C, so that consumer's error becomes a
    SystemError, the report beside it naming the cause."""
    pending = None
    try:
        unconsumed = _valid_at(capsule, _NAME)
    except Exception as e:
        pending, unconsumed = e, _valid_at(capsule, _NAME)     # asked again, the error caught
    if unconsumed:
        _let_go(_pointer_at(capsule, _NAME))
    if pending is not None:
        raise pending


@atexit.register
def _unhook():
    """At exit, tensors still lent get no deleter: their consumers may drop them after the
    interpreter is gone, when a Python deleter can no longer run."""
    for block in list(_lent):
        DLManagedTensor.from_address(block).deleter = DELETER()
