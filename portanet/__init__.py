"""portanet: one layer protocol on every GPU vendor (CUDA, OpenCL) and a NumPy reference."""
from .backends import device, list_devices
from .data import load_dataset
from .errors import (DataError, DeviceError, InputError, ModelFileError, OutOfMemoryError,
                     PortanetError, ShapeError)
from .layers import Dense, Flatten
from .models import mlp
from .network import Sequential, load
from .optim import SGD

__version__ = "0.1.0"

__all__ = ["device", "list_devices", "load_dataset", "Sequential", "load", "SGD", "Dense",
           "Flatten", "mlp", "PortanetError", "DeviceError", "OutOfMemoryError", "ShapeError",
           "InputError", "DataError", "ModelFileError"]
