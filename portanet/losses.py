"""Losses. Cross-entropies are fused with their output activation: the loss kernel
writes a - y straight into the last layer's delta (its z), so the layer skips f'(z).

A loss is the network's one word on its targets and its last step: what its target buffer
holds (`target_shape`, `target_dtype`), the forward pass that ends in its kernel
(`forward`, where softmax cross-entropy also does a Dense output's bias and softmax) and
where that kernel leaves the delta backward starts from (`delta`)."""
import numpy as np

from .errors import InputError, ShapeError
from .layers import DELTA_AND_BIAS, Dense


class Loss:
    name = ""
    output_activation = None    # the activation the loss is fused with, if any
    fused = False               # True: writes the delta into z; False: dL/da into a
    labels = False              # True: targets are class labels, (m,) int32 on the device

    def host_targets(self, y, n_out, tokens=1):
        """Validated targets in the device layout, samples last: labels (m,) int32, or for
        a sequence's T tokens (T, m), or (n_out, m) reals."""
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

    def target_shape(self, n_out, m):
        """The shape of the device's targets for m samples: (m,) labels or (n_out, m)."""
        return (m,) if self.labels else (n_out, m)

    def target_dtype(self, real):
        """The dtype of the device's targets, where the network computes in `real`."""
        return np.dtype(np.int32) if self.labels else real

    def __call__(self, backend, layer, loss, hit, y):
        """The loss kernel on the last layer: the delta into it (see `delta`), and each
        sample's loss and hit added to the sums `loss` and `hit` (per batch position: the
        first m of their capacity)."""
        raise NotImplementedError

    def forward(self, backend, layers, y, loss, hit, training=False, state=None):
        """The forward pass of `layers`, then the loss kernel against targets y. state: a
        training step's optimizer state (training.OptimizerState), or None. Returns
        backward's delta_in_z for the last layer: where the delta is (`fused`: in its z),
        or layers.DELTA_AND_BIAS where the loss formed its bias gradient too."""
        backend.drop_all_operands()     # what a step stopped midway kept
        for layer in layers:
            layer.forward(training)
        self(backend, layers[-1], loss, hit, y)
        return self.fused

    def delta(self, layer):
        """Where the loss kernel wrote the delta backward starts from: the last layer's z
        for a loss fused with its activation, else its a."""
        return layer.z if self.fused else layer.a


class SoftmaxCrossEntropy(Loss):
    name = "softmax_cross_entropy"
    output_activation = "softmax"
    fused = True
    labels = True

    def host_targets(self, y, n_out, tokens=1):
        y = np.asarray(y)
        if tokens > 1:
            if y.ndim != 2 or y.shape[1] != tokens:
                raise ShapeError(f"{self.name}: the network's output is a sequence of "
                                 f"{tokens} tokens; give a class label per token, (N, "
                                 f"{tokens}), got {y.shape}")
        elif y.ndim == 2 and y.shape[1] == 1:
            y = y[:, 0]
        if y.ndim != 1 and tokens == 1:
            raise ShapeError(f"{self.name}: give integer class labels of shape (N,), got {y.shape}")
        if not np.issubdtype(y.dtype, np.integer):
            raise InputError(f"{self.name}: labels have dtype {y.dtype}; give integer class "
                             f"labels in [0, {n_out}) (y.astype(int) if they are whole numbers)")
        bad = (y < 0) | (y >= n_out)
        if bad.any():
            at = tuple(np.argwhere(bad)[0])
            where = f"sample {at[0]}" + (f", token {at[1]}" if len(at) > 1 else "")
            raise InputError(f"{self.name}: label {int(y[at])} at {where} is out of range: "
                             f"the network has {n_out} classes, labels must be in [0, {n_out})")
        return np.ascontiguousarray(y.T, np.int32)

    def __call__(self, backend, layer, loss, hit, y):
        backend.softmax_xent(layer.z, loss, hit, layer.a, y)

    def forward(self, backend, layers, y, loss, hit, training=False, state=None):
        """A Dense softmax output leaves its bias and softmax to the loss, which does them
        in the same launch (bias_softmax_xent); given a training step's optimizer state
        that scales no loss, the loss also forms the layer's bias gradient from its delta
        (the gemv of its backward: bias_softmax_xent_grad)."""
        *hidden, last = layers
        if not (isinstance(last, Dense) and last.activation == "softmax"):
            return super().forward(backend, layers, y, loss, hit, training, state)
        backend.drop_all_operands()     # as Loss.forward does
        for layer in hidden:
            layer.forward(training)
        last.forward_product(training)
        args = (last.z, last.b, last.a, loss, hit, y)
        if state is None or state.scaling is not None:   # (a scaled delta: its gemv after)
            backend.bias_softmax_xent(*args)
            return True
        g, alpha, beta = state.gradient(last)
        backend.bias_softmax_xent_grad(*args, alpha, beta, g["b"], last.ones)
        return DELTA_AND_BIAS


class BinaryCrossEntropy(Loss):
    name = "binary_cross_entropy"
    output_activation = "sigmoid"
    fused = True

    def host_targets(self, y, n_out, tokens=1):
        t = super().host_targets(y, n_out, tokens)
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
