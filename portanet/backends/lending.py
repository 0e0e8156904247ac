"""DLPack's C side, and a backend's array lent through it: the structs of dlpack.h, as
DLPack's own pure-ctypes example spells them (github.com/dmlc/dlpack, apps/numpy_dlpack),
the device-type codes, the C API calls on capsules, and `DeviceView`, whose `__dlpack__`
hands out a legacy "dltensor" capsule made here. A lent array is not freed until its last
consumer lets go of it (`free_later`, which Backend.free asks). Taking other libraries'
arrays in, and `to_dlpack`, are portanet/dlpack.py's.
"""
import atexit
import ctypes
import math

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


def device_text(where):
    """'cuda:1' for (2, 1)."""
    return f"{DEVICE_NAMES.get(where[0], f'DLPack device type {where[0]}')}:{where[1]}"


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
