"""The device registry: device strings -> Backend instances (one per device and dtype).

    cpu            the NumPy reference
    opencl         the first OpenCL GPU (else the first OpenCL device)
    opencl:P:D     OpenCL platform P, device D, as `portanet devices` numbers them
    cuda, cuda:N   CUDA device N (default 0)
"""
import re

import numpy as np

from .. import config
from ..errors import DeviceError
from .base import Backend

__all__ = ["Backend", "device", "list_devices"]

_instances = {}
_SPEC = re.compile(r"^(cpu|opencl(?::(\d+):(\d+))?|cuda(?::(\d+))?)$")


def device(spec=None, dtype=np.float32):
    """The Backend for `spec` (default: PORTANET_DEVICE, else cpu); one instance per
    device and dtype, so layers built on the same string share a context."""
    if isinstance(spec, Backend):
        return spec
    spec = (spec or config.device_string()).strip().lower()
    dtype = np.dtype(dtype)
    match = _SPEC.match(spec)
    if not match:
        raise DeviceError(f"unknown device {spec!r}. {_available_text()}")
    key = (spec, dtype)
    if key not in _instances:
        try:
            _instances[key] = _create(spec, match, dtype)
        except DeviceError as e:
            if "Available devices" in str(e):
                raise
            raise DeviceError(f"{e}. {_available_text()}") from e
    return _instances[key]


def _create(spec, match, dtype):
    if spec == "cpu":
        from .numpy import NumpyBackend
        return NumpyBackend("cpu", dtype)
    if spec.startswith("opencl"):
        from . import opencl
        if match.group(2) is None:
            p, d = opencl.default_device()
        else:
            p, d = int(match.group(2)), int(match.group(3))
        return opencl.OpenCLBackend(p, d, dtype)
    from . import cuda
    return cuda.CudaBackend(int(match.group(4) or 0), dtype)


def list_devices():
    """[(device string, description)] for every device the installed backends can see,
    and [(backend, reason)] for the backends that cannot be used here."""
    found = [("cpu", "NumPy reference on the host CPU")]
    missing = []
    for name in ("opencl", "cuda"):
        try:
            module = __import__(f"portanet.backends.{name}", fromlist=["enumerate_devices"])
            found.extend(module.enumerate_devices())
        except DeviceError as e:
            missing.append((name, str(e)))
    return found, missing


def _available_text():
    found, missing = list_devices()
    text = "Available devices: " + ", ".join(s for s, _ in found) + "."
    for name, reason in missing:
        text += f" ({name}: {reason})"
    return text


def unavailable(spec, detail):
    """The error for a well-formed device string that names no device here."""
    return DeviceError(f"device {spec!r} is not available: {detail}. {_available_text()}")
