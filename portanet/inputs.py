"""What a network takes in: samples and targets checked before they reach the device.

Each check names what is wrong and the mend: the dtype, the shape against the network's
input, NaN and inf (found here for host arrays, by the device for arrays already on it:
plan.Plan.scan_nonfinite), values beyond fp16's range where they meet a product, and the
loss's own rule for targets (losses.Loss.host_targets).
"""
import numpy as np

from . import dlpack, layers as layer_module
from . import precision as precisions
from .errors import InputError, ShapeError
from .memory import elements
from .plan import nonfinite


def check_x(net, x, finite=True):
    """x as net's backend's dtype, checked; finite=False leaves NaN and inf to the device
    (plan.Plan.upload) where no cast made a copy (which is checked here whole). x is what
    dlpack.taken gave: DeviceSamples (of the backend's dtype) have their shape checked here
    and NaN and inf looked for by the device, as their callers lay them out (fit and
    train_batch before the first step: plan.Plan.scan_nonfinite)."""
    on_device = isinstance(x, dlpack.DeviceSamples)
    first = net.layers[0]
    if on_device and first.takes_ids:
        raise InputError(f"{first} checks its token ids on the host: give x as a NumPy "
                         f"array of integers (N, {', '.join(map(str, net.input_shape))})")
    if not on_device and not isinstance(x, np.ndarray):
        x = host_array(x, "x")
    if not on_device and not first.takes_ids and not np.issubdtype(x.dtype, np.floating):
        raise InputError(f"input has dtype {x.dtype}; the network takes floating-point "
                         f"data: convert with x.astype(np.float32) (and scale pixels "
                         f"to [0, 1] with / 255)")
    if x.ndim == 0 or len(x) == 0:
        raise ShapeError(f"input has shape {x.shape}: give at least one sample, "
                         f"shaped (N, {', '.join(map(str, net.input_shape))})")
    sample = x.shape[1:]
    flat_ok = len(net.input_shape) == 1 and elements(sample) == net.n_in
    if sample != net.input_shape and not flat_ok:
        raise ShapeError(f"input has samples of shape {sample} but the network's first "
                         f"layer {net.layers[0]} expects {net.input_shape}: give x of "
                         f"shape (N, {', '.join(map(str, net.input_shape))})")
    if on_device:
        return x
    if first.takes_ids:
        return first.check_ids(x)
    with np.errstate(over="ignore"):
        cast = x.astype(net.backend.dtype, copy=False)
    if (finite or cast is not x) and not np.all(np.isfinite(cast)):  # after the cast:
        what = "NaN or inf" if not np.all(np.isfinite(x)) else \
            f"values too large for {net.backend.dtype} (they become inf)"  # 1e39 in f32
        rows = cast.reshape(len(cast), -1)
        raise nonfinite(what, int(np.argwhere(~np.isfinite(rows))[0][0]))
    _check_half_range(net, cast)
    return cast


def _check_half_range(net, x):
    """In fp16 the first product rounds the input to half: from 65520 up, inf, and the
    network's outputs NaN. Refused here, naming the range, where the input reaches a
    product with its magnitude (through layers that pass values on: Flatten, Dropout,
    pooling, a Residual block's first layer); NaN and inf are left to their own check."""
    if net.backend.precision != "fp16" or not input_meets_product(net.layers):
        return
    limit = precisions.HALF_OVERFLOW
    with np.errstate(invalid="ignore"):
        if np.nanmax(x, initial=0) < limit and np.nanmin(x, initial=0) > -limit:
            return
        rows = x.reshape(len(x), -1)
        large = (np.abs(rows) >= limit) & np.isfinite(rows)
    if not large.any():                 # only inf: the finite check's to report
        return
    sample = int(np.argwhere(large)[0][0])
    top = float(np.abs(rows[large]).max())
    raise InputError(f"input holds values of magnitude up to {top:.4g} "
                     f"(first at sample {sample}), beyond fp16's range: from {limit:g} the "
                     f"first layer's products round them to inf (half's largest is 65504); "
                     f"scale the inputs, or compute in bf16 or fp32")


def check_data(net, x, y, finite=True):
    """(x, targets) checked (check_x; the targets by net's loss), the targets in the
    device's layout and dtype."""
    x = check_x(net, x, finite)
    if not isinstance(y, np.ndarray) and not hasattr(y, "__dlpack__"):
        y = host_array(y, "y")
    y = dlpack.host(y, net.backend)
    if y.ndim == 0 or len(y) != len(x):
        raise ShapeError(f"x has {len(x)} samples but y has "
                         f"{len(y) if y.ndim else 'no'} : give one target per sample")
    t = net.loss.host_targets(y, net.n_out, net.tokens)
    if t.dtype != np.int32:
        with np.errstate(over="ignore"):
            t = t.astype(net.backend.dtype)
        if not np.all(np.isfinite(t)):
            raise InputError(f"{net.loss.name}: targets too large for "
                             f"{net.backend.dtype} (they become inf); rescale them")
    return x, t


def input_meets_product(layers):
    """Whether a network's input reaches a matrix product (Dense, Conv2D) with its own
    magnitude: through Flatten, Dropout and pooling, into a Residual block's first layer or
    its projection, or past the block, whose identity shortcut adds the input to its output;
    not through BatchNorm or a layer unknown here."""
    for layer in layers:
        if isinstance(layer, layer_module.Dense):           # Conv2D too
            return True
        if isinstance(layer, layer_module.Residual):
            if layer.projection is not None or input_meets_product(layer.layers):
                return True
        elif not isinstance(layer, (layer_module.Flatten, layer_module.Dropout,
                                    layer_module.MaxPool2D, layer_module.AvgPool2D)):
            return False
    return False


def host_array(value, what):
    """A value that is no array yet (nested lists, tuples) as a NumPy array; one NumPy
    cannot make (samples of several shapes: a ragged list) an InputError naming `what` and
    the shapes."""
    try:
        return np.asarray(value)
    except (TypeError, ValueError) as e:
        shapes = {}                         # shape -> the first sample of it
        try:
            for i, sample in enumerate(value):
                try:
                    shape = str(np.shape(sample))
                except (TypeError, ValueError):
                    shape = "ragged itself"
                shapes.setdefault(shape, i)
        except TypeError:
            pass
        if len(shapes) > 1:
            seen = ", ".join(f"sample {i} {shape}" for shape, i in list(shapes.items())[:4])
            raise InputError(f"{what} is a ragged sequence, its samples of several shapes "
                             f"({seen}): give {what} as an array, every sample of one "
                             f"shape (pad or cut the shorter ones)") from e
        raise InputError(f"{what} cannot be made an array ({e}): give a NumPy array, or "
                         f"any array with __dlpack__") from e
