"""The device registry: device strings -> Backend instances (one per device, dtype and
precision).

    cpu            the NumPy reference
    opencl         the first OpenCL GPU (else the first OpenCL device)
    opencl:P       OpenCL platform P's first GPU (else its first device)
    opencl:P:D     OpenCL platform P, device D, as `portanet devices` numbers them
    opencl:NAME    P may be the platform's name instead: pocl, intel, nvidia, amd, oclgrind
                   (a simulator: `opencl` alone never picks it)
    cuda, cuda:N   CUDA device N (default 0)

device(None) takes PORTANET_DEVICE, else cpu; an explicit empty string is an error, not a
quiet cpu. Strings naming the same device (opencl, opencl:0, opencl:0:0) give the same
backend, so layers built on either share its context. Backends are safe to share
between threads (Backend.serialised), and so is this registry.
"""
import re
import threading

import numpy as np

from .. import config
from .. import precision as precisions
from ..errors import DeviceError, PrecisionError
from .base import Backend

__all__ = ["Backend", "device", "list_devices"]

FORMS = "cpu, opencl, opencl:P, opencl:P:D (P a number or a name: opencl:pocl), cuda or cuda:N"
_instances = {}                 # (device string, dtype, precision) -> Backend, for the string as
                                # asked for and for the canonical one (cpu, opencl:P:D, cuda:N)
_lock = threading.Lock()        # two threads asking at once must not make two contexts
_SPEC = re.compile(r"^(cpu|opencl(?::(\d+|[a-z][a-z0-9-]*)(?::(\d+))?)?|cuda(?::(\d+))?)$")


def device(spec=None, dtype=np.float32, precision=None):
    """The Backend for `spec` (None: PORTANET_DEVICE, else cpu) computing in `precision`
    (portanet/precision.py; None: fp32, or fp64 for float64); one instance per device,
    dtype and precision, so layers built on the same device share a context. A precision
    the device does not compute is a DeviceError naming those it does."""
    if isinstance(spec, Backend):
        wanted = spec.precision if precision is None else precisions.resolve(precision, spec.dtype)
        if wanted != spec.precision:
            raise PrecisionError(f"{spec.name} was made for {spec.precision}, not {wanted}: "
                                 f"give the device string to get its {wanted} backend")
        return spec
    precision = precisions.resolve(precision, dtype)
    origin = None                   # names the variable when the string came from it
    if spec is None:
        spec = config.device_variable()
        if spec is None:
            spec = "cpu"
        else:
            origin = f"PORTANET_DEVICE={spec!r}"
    if not isinstance(spec, str) or not spec.strip():
        raise DeviceError(f"device {spec!r} is not a device string: use {FORMS}, or None "
                          f"for PORTANET_DEVICE (else cpu). {_available_text()}")
    name = spec.strip().lower()
    match = _SPEC.match(name)
    if not match:
        what = f"{origin} is not a device string" if origin else f"unknown device {spec!r}"
        raise DeviceError(f"{what}: use {FORMS}. {_available_text()}")
    key = (name, np.dtype(dtype), precision)
    with _lock:
        if key not in _instances:
            try:
                _instances[key] = _get(_canonical(name, match), *key[1:])
            except PrecisionError:
                raise                       # the device is there: the message says what it has
            except DeviceError as e:
                text = f"{origin or f'device {spec!r}'} is not available: {e}"
                raise DeviceError(f"{text}. {_available_text(text)}") from e
        return _instances[key]


def device_for(spec, dtype, precision):
    """device() for a network or a command: precision None is PORTANET_PRECISION for
    float32 (precision.default), and a device's refusal of the variable's precision names
    the variable. A Backend given is taken as device() takes it."""
    if isinstance(spec, Backend):
        return device(spec, dtype, precision)
    chosen = precisions.default(precision, dtype)
    try:
        return device(spec, dtype, chosen)
    except PrecisionError as e:
        if precision is None and chosen is not None:
            raise PrecisionError(f"{e} (PORTANET_PRECISION={chosen!r} asked for it: unset it, "
                                 f"or give a precision the device has)") from e
        raise


def _canonical(name, match):
    """The one string of the device `name` names: cpu, opencl:P:D or cuda:N."""
    if name.startswith("opencl"):
        from . import opencl
        p, d = match.group(2), match.group(3)
        if p is not None and not p.isdigit():
            p = opencl.platform_number(p)           # opencl:pocl, opencl:intel:0
        if d is None:
            p, d = opencl.default_device(None if p is None else int(p))
        return f"opencl:{int(p)}:{int(d)}"
    if name.startswith("cuda"):
        return f"cuda:{int(match.group(4) or 0)}"
    return "cpu"


def _get(name, dtype, precision):
    """The backend of a canonical device string, made on first use."""
    if (name, dtype, precision) not in _instances:
        _instances[name, dtype, precision] = _create(name, dtype, precision)
    return _instances[name, dtype, precision]


def _create(name, dtype, precision):
    kind, _, numbers = name.partition(":")
    if kind == "cpu":
        from .numpy import NumpyBackend
        return NumpyBackend("cpu", dtype, precision)
    if kind == "opencl":
        from . import opencl
        p, d = map(int, numbers.split(":"))
        return opencl.OpenCLBackend(p, d, dtype, precision)
    from . import cuda
    return cuda.CudaBackend(int(numbers), dtype, precision)


def holder(x):
    """The backend that made device array x (or the array x views), or None."""
    owner = x if getattr(x, "base", None) is None else x.base
    with _lock:
        made = list(_instances.values())
    return next((bk for bk in made if id(owner) in bk._owned), None)


def list_devices():
    """[(device string, description)] for every device the installed backends can see,
    and [(backend, reason)] for the backends that cannot be used here."""
    from .numpy import EMULATED
    found = [("cpu", f"NumPy reference on the host CPU; precisions fp32, "
                     f"{', '.join(EMULATED)} (emulated)")]
    missing = []
    for name in ("opencl", "cuda"):
        try:
            module = __import__(f"portanet.backends.{name}", fromlist=["enumerate_devices"])
            found.extend(module.enumerate_devices())
        except DeviceError as e:
            missing.append((name, str(e)))
    return found, missing


def _available_text(said=""):
    """'Available devices: ...', with why each other backend cannot be used, except the
    reasons the message already gives (`said`)."""
    found, missing = list_devices()
    text = "Available devices: " + ", ".join(s for s, _ in found) + "."
    for name, reason in missing:
        if reason not in said:
            text += f" ({name}: {reason})"
    return text

