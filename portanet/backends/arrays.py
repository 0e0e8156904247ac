"""What kernel arguments carry: device arrays (a buffer, an offset in elements and a
row-major shape), the activations and their codes in prelude.h, and the launch sizes the
kernels are written for."""
import math

import numpy as np

ACTIVATIONS = ("linear", "relu", "sigmoid", "tanh", "softmax", "leaky_relu", "elu", "gelu", "silu")

# the derivatives taken from a = f(z) rather than from z, by the activation (the kind the
# derivative's kernels take): a layer that keeps a alone gives these
OF_OUTPUT = {"sigmoid": "sigmoid_of_a", "tanh": "tanh_of_a"}

# activation codes, as ACT_* in prelude.h
ACT = {"linear": 0, "relu": 1, "sigmoid": 2, "tanh": 3, "softmax": 4, "leaky_relu": 5, "elu": 6,
       "gelu": 7, "silu": 8, "sigmoid_of_a": 9, "tanh_of_a": 10}

STEPS = 4                  # elements a work-item of bias_activation and momentum_updates takes
                           # (elementwise.cl's STEPS; test_kernel_sources holds them equal)
MAX_GROUPS_1 = 65535       # the most work-groups in dimension 1 of a CUDA launch


class DeviceArray:
    """A device buffer, an offset in elements and a row-major shape. An array made by
    `empty` owns its buffer (base None); a view shares `buf` and keeps its owner alive in
    `base`, so that the buffer stays allocated, and counted, as long as any view uses it."""
    __slots__ = ("buf", "offset", "shape", "dtype", "base", "__weakref__")

    def __init__(self, buf, offset, shape, dtype, base=None):
        self.buf, self.offset, self.shape, self.dtype, self.base = (
            buf, offset, tuple(shape), np.dtype(dtype), base)

    @property
    def size(self):
        return math.prod(self.shape)

    @property
    def nbytes(self):
        return self.size * self.dtype.itemsize

    def __repr__(self):
        return f"DeviceArray(shape={self.shape}, dtype={self.dtype}, offset={self.offset})"
