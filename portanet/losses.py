"""Losses. Cross-entropies are fused with their output activation: the loss kernel
writes a - y straight into the last layer's delta (its z), so the layer skips f'(z)."""
import numpy as np

from .errors import InputError, ShapeError


class Loss:
    name = ""
    output_activation = None    # the activation the loss is fused with, if any
    fused = False               # True: writes the delta into z; False: dL/da into a

    def host_targets(self, y, n_out):
        """Validated targets in the device layout: labels (m,) int32 or (n_out, m) reals."""
        y = np.asarray(y)
        if not np.issubdtype(y.dtype, np.number) or np.issubdtype(y.dtype, np.complexfloating):
            raise InputError(f"{self.name}: targets have dtype {y.dtype}; give real numbers")
        y = y.reshape(len(y), -1) if y.ndim != 2 else y
        if y.shape[1] != n_out:
            raise ShapeError(f"{self.name}: targets have {y.shape[1]} values per sample but "
                             f"the network has {n_out} outputs; give y of shape (N, {n_out})")
        if not np.all(np.isfinite(y)):
            raise InputError(f"{self.name}: targets contain NaN or inf at sample "
                             f"{int(np.argwhere(~np.isfinite(y))[0][0])}")
        return y.T

    def __call__(self, backend, layer, loss, hit, y):
        raise NotImplementedError


class SoftmaxCrossEntropy(Loss):
    name = "softmax_cross_entropy"
    output_activation = "softmax"
    fused = True

    def host_targets(self, y, n_out):
        y = np.asarray(y)
        if y.ndim == 2 and y.shape[1] == 1:
            y = y[:, 0]
        if y.ndim != 1:
            raise ShapeError(f"{self.name}: give integer class labels of shape (N,), got {y.shape}")
        if not np.issubdtype(y.dtype, np.integer):
            raise InputError(f"{self.name}: labels have dtype {y.dtype}; give integer class "
                             f"labels in [0, {n_out}) (y.astype(int) if they are whole numbers)")
        bad = (y < 0) | (y >= n_out)
        if bad.any():
            i = int(np.argmax(bad))
            raise InputError(f"{self.name}: label {int(y[i])} at sample {i} is out of range: "
                             f"the network has {n_out} classes, labels must be in [0, {n_out})")
        return y.astype(np.int32)

    def __call__(self, backend, layer, loss, hit, y):
        backend.softmax_xent(layer.z, loss, hit, layer.a, y)


class BinaryCrossEntropy(Loss):
    name = "binary_cross_entropy"
    output_activation = "sigmoid"
    fused = True

    def host_targets(self, y, n_out):
        t = super().host_targets(y, n_out)
        if np.any((t < 0) | (t > 1)):
            raise InputError(f"{self.name}: targets must lie in [0, 1]")
        return t

    def __call__(self, backend, layer, loss, hit, y):
        backend.sigmoid_bce(layer.z, loss, hit, layer.a, y)


class MeanSquaredError(Loss):
    name = "mse"

    def __call__(self, backend, layer, loss, hit, y):
        backend.mse(layer.a, loss, hit, layer.a, y)


LOSSES = {"softmax_cross_entropy": SoftmaxCrossEntropy, "cross_entropy": SoftmaxCrossEntropy,
          "binary_cross_entropy": BinaryCrossEntropy, "bce": BinaryCrossEntropy,
          "mse": MeanSquaredError}


def get(name):
    if isinstance(name, Loss):
        return name
    if name not in LOSSES:
        raise InputError(f"unknown loss {name!r}: use one of {', '.join(LOSSES)}")
    return LOSSES[name]()
