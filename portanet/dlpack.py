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
cuda a `DeviceView`, whose `__dlpack__` hands out a legacy "dltensor" capsule made with
ctypes. The structs, the capsules and the lending are portanet/backends/lending.py's (a
backend makes its views and keeps lent memory until it is let go). OpenCL cannot lend:
DLPack names OpenCL devices (kDLOpenCL = 4), but no library imports them.
"""
import contextlib
import math

import numpy as np

from . import backends
from .backends.gpu import DeviceArray
from .backends.lending import (_NAME, _USED, CODE_NAMES, CPU, CUDA, TYPE_CODES, DeviceView,
                               DLManagedTensor, _get_pointer, _is_valid, _set_name, device_text)
from .errors import InputError, PortanetError

__all__ = ["DeviceSamples", "DeviceView", "host", "release", "samples", "taken",
           "to_dlpack"]


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
