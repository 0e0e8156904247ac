"""portanet: one layer protocol on every GPU vendor (CUDA, OpenCL) and a NumPy reference."""
from .backends import device, list_devices
from .data import load_dataset
from .errors import (DataError, DeviceError, DivergedError, InputError, ModelFileError,
                     OutOfMemoryError, PortanetError, PrecisionError, ShapeError)
from .layers import (AvgPool2D, BatchNorm, Conv2D, Dense, Dropout, Embedding, Flatten,
                     GlobalAvgPool2D, LayerNorm, MaxPool2D, MultiHeadAttention, Residual)
from .models import gpt, lenet, mlp, resnet, from_description
from .network import Sequential
from .optim import SGD, Adam, AdamW, LossScale, RMSprop
from .loading import load
from .onnx_import import from_onnx
from .torch_state import load_torch_state
from .dlpack import to_dlpack
from . import callbacks, distributed, schedules

__version__ = "0.1.0"

__all__ = ["device", "list_devices", "load_dataset", "Sequential", "load", "SGD", "Adam",
           "AdamW", "RMSprop", "LossScale", "Dense", "Embedding", "Flatten", "Conv2D", "MaxPool2D", "Dropout",
           "AvgPool2D", "GlobalAvgPool2D", "BatchNorm", "LayerNorm", "MultiHeadAttention",
           "Residual", "mlp", "gpt", "lenet", "resnet",
           "from_description", "callbacks", "from_onnx", "load_torch_state",
           "to_dlpack", "distributed",
           "PortanetError", "DeviceError", "OutOfMemoryError", "ShapeError", "InputError",
           "DataError", "ModelFileError", "DivergedError", "PrecisionError", "schedules"]
