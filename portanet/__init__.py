"""portanet: one layer protocol on every GPU vendor (CUDA, OpenCL) and a NumPy reference."""
from .backends import device, list_devices
from .data import load_dataset
from .errors import (DataError, DeviceError, DivergedError, InputError, ModelFileError,
                     OutOfMemoryError, PortanetError, ShapeError)
from .layers import Conv2D, Dense, Dropout, Flatten, MaxPool2D
from .models import lenet, mlp, from_description
from .network import Sequential
from .optim import SGD
from .saving import load
from . import schedules

__version__ = "0.1.0"

__all__ = ["device", "list_devices", "load_dataset", "Sequential", "load", "SGD", "Dense",
           "Flatten", "Conv2D", "MaxPool2D", "Dropout", "mlp", "lenet", "from_description",
           "PortanetError", "DeviceError", "OutOfMemoryError", "ShapeError", "InputError",
           "DataError", "ModelFileError", "DivergedError", "schedules"]
