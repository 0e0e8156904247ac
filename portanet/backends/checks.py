"""The checks every backend runs on an operation's arguments before it launches anything:
shapes, dtypes, storage and options; each raises ShapeError or InputError naming the
arrays and what they should be, so that NumPy and the kernel backends refuse alike; and
the sizes they derive (conv_out, ConvShape)."""
import math
from collections import namedtuple

import numpy as np

from ..errors import InputError, ShapeError
from .arrays import ACTIVATIONS, OF_OUTPUT


def conv_out(size, k, stride, pad):
    """Output size of a convolution or pooling window sliding over `size`."""
    return (size + 2 * pad - k) // stride + 1


class ConvShape(namedtuple("ConvShape", "F C H W N k stride pad Ho Wo")):
    """The sizes of one convolution: F filters over C x H x W x N images, k x k windows,
    stride, padding, Ho x Wo outputs per image."""
    __slots__ = ()

    @property
    def rows(self):
        """C.k.k: the length of a patch, a row of w."""
        return self.C * self.k * self.k

    @property
    def positions(self):
        """Ho.Wo.N: the output's columns."""
        return self.Ho * self.Wo * self.N


def check_gemm(a, b, c, trans_a, trans_b):
    """(m, n, k) of c <- op(a) op(b), or a ShapeError naming the three shapes."""
    m, k = (a.shape[1], a.shape[0]) if trans_a else a.shape
    k2, n = (b.shape[1], b.shape[0]) if trans_b else b.shape
    if k != k2 or c.shape != (m, n):
        raise ShapeError(f"gemm: op(a) {m}x{k} . op(b) {k2}x{n} does not fit c {c.shape} "
                         f"(a {a.shape} trans={trans_a}, b {b.shape} trans={trans_b})")
    return m, n, k


def check_transpose(x, out):
    if len(x.shape) != 2 or out.shape != x.shape[::-1]:
        raise ShapeError(f"transpose: out {out.shape} is not the shape of x {x.shape} "
                         f"transposed ({x.shape[::-1]}; x must be a matrix)")


def check_gather(out, x, idx):
    m = idx.shape[0]
    rows = out.shape[0] if len(out.shape) == 2 else 1
    if out.shape[-1] != m or (len(out.shape) == 2 and x.shape[1:] != (rows,)):
        raise ShapeError(f"gather: out {out.shape} does not take idx {idx.shape} of x {x.shape}")


def check_conv(op, x, k, stride, pad, **arrays):
    """The ConvShape of convolving x (C, H, W, N) with k x k windows, or a ShapeError
    naming the array that does not fit: arrays are named by role, w (F, C.k.k), b (F,),
    out (F, Ho, Wo, N) (any shape of that size) or gw (F, C.k.k)."""
    if len(x.shape) != 4:
        raise ShapeError(f"{op}: images x {tuple(x.shape)} must be (C, H, W, N)")
    C, H, W, N = x.shape
    k, stride, pad = int(k), int(stride), int(pad)
    Ho, Wo = conv_out(H, k, stride, pad), conv_out(W, k, stride, pad)
    filters = [y.shape[0] for y in arrays.values() if y is not None]
    F = filters[0] if filters else 0
    if min(k, stride) < 1 or pad < 0 or Ho < 1 or Wo < 1:
        raise ShapeError(f"{op}: a {k}x{k} window with stride {stride} and padding {pad} "
                         f"does not fit images {tuple(x.shape)}")
    want = {"w": (F, C * k * k), "gw": (F, C * k * k), "b": (F,)}
    for name, y in arrays.items():
        if y is None:
            continue
        if name in want:
            ok = tuple(y.shape) == want[name]
        else:
            ok = y.shape[0] == F and math.prod(y.shape) == F * Ho * Wo * N
        if not ok:
            shape = want.get(name, (F, Ho, Wo, N))
            raise ShapeError(f"{op}: {name} {tuple(y.shape)} does not fit images "
                             f"{tuple(x.shape)} with {k}x{k} windows, stride {stride}, "
                             f"padding {pad} and {F} filters: it must be {shape}")
    return ConvShape(F, C, H, W, N, k, stride, pad, Ho, Wo)


def check_stored(bk, z, a, stored, op="bias_activation"):
    """bias_activation (or conv) into 16-bit storage: z the product's float32 sum, a and
    stored (where z + b is kept) 16-bit arrays of z's shape."""
    want = bk.storage_dtype
    if want is None or stored is None or a.dtype != want or stored.dtype != want or \
            z.dtype != bk.dtype or a.shape != z.shape or stored.shape != z.shape:
        raise ShapeError(f"{op} into 16-bit storage: z {z.shape} {z.dtype}, a "
                         f"{a.shape} {a.dtype}, stored "
                         f"{None if stored is None else (stored.shape, stored.dtype)}; a and "
                         f"stored must be {bk.precision}'s 16-bit storage "
                         f"({want}) and of z's shape")


def check_alike(op, **arrays):
    """Arrays one kernel reads and writes in one storage: all of the backend's real type,
    or all of its 16-bit storage (a pool's input and output, dropout's)."""
    if len({x.dtype for x in arrays.values()}) > 1:
        raise ShapeError(f"{op}: " + ", ".join(f"{name} {x.dtype}" for name, x in arrays.items())
                         + ": these must be stored alike, all in the backend's real type or "
                         "all in its 16-bit storage")


def check_activation(kind, derivative=False):
    """kind one of ACTIVATIONS; for a derivative (activation_grad, activation_bias_grad)
    also one of OF_OUTPUT's, whose f' is read from a."""
    if kind not in ACTIVATIONS and not (derivative and kind in OF_OUTPUT.values()):
        raise InputError(f"unknown activation {kind!r}: use one of {', '.join(ACTIVATIONS)}")


def check_add_activation(kind, z, x, a):
    check_activation(kind)
    if kind == "softmax":
        raise InputError("add_activation: softmax is over a sample's features, not "
                         "elementwise; use bias_activation for it")
    if not z.shape == x.shape == a.shape:
        raise ShapeError(f"add_activation: z {z.shape}, x {x.shape} and a {a.shape} must "
                         f"have one shape")
    check_alike("add_activation", z=z, x=x, a=a)


def check_activation_grad(bk, kind, z, da, delta):
    """activation_grad's arrays: z in place (real), or into delta (real, z may be 16-bit)."""
    check_activation(kind, derivative=True)
    out = z if delta is None else delta
    if not z.shape == da.shape == out.shape:
        raise ShapeError(f"activation_grad: z {z.shape}, da {da.shape} and delta "
                         f"{out.shape} must have one shape")
    if delta is None and z.dtype != bk.dtype:
        raise ShapeError(f"activation_grad in place of a 16-bit z ({z.dtype}): the delta is "
                         f"{bk.dtype}; give it an array of its own (delta=)")
    check_real(bk, "activation_grad", da=da, delta=out)


def check_norm_grad(bk, dx, dz):
    """batchnorm_grad's gradients: real, whatever x's storage."""
    check_real(bk, "batchnorm_grad", dz=dz, **({} if dx is None else {"dx": dx}))


def check_norm_delta(bk, kind, delta, da, x, gamma, beta, mean, inv_std):
    """batchnorm_delta's arguments: (rows, n) of x; delta and da real, of x's shape."""
    check_norm_kind(kind)
    rows_n = check_rows("batchnorm_delta", x, {"delta": delta, "da": da},
                        {"gamma": gamma, "beta": beta, "mean": mean, "inv_std": inv_std})
    check_real(bk, "batchnorm_delta", delta=delta, da=da)
    return rows_n


def check_real(bk, op, **arrays):
    """Arrays a kernel takes in the backend's real type (gradients), whatever its others'
    storage."""
    wrong = {name: x.dtype for name, x in arrays.items() if x.dtype != bk.dtype}
    if wrong:
        raise ShapeError(f"{op}: " + ", ".join(f"{name} {d}" for name, d in wrong.items())
                         + f": gradients are {bk.dtype}, not 16-bit storage")


def check_update(op, n_decay, w, *state):
    """An optimizer update's arrays: w and its gradient and state (None: absent) of one
    size, n_decay of them decayed."""
    if any(x is not None and x.size != w.size for x in state) or not 0 <= n_decay <= w.size:
        shapes = ", ".join("None" if x is None else str(x.shape) for x in state)
        raise ShapeError(f"{op}: w {w.shape} with {shapes} and n_decay {n_decay}: the "
                         f"gradient and state must have w's size, n_decay at most that")


def check_skip(op, skip):
    """An update's skip flag: None or an int32 device array of one element."""
    if skip is not None and (skip.size != 1 or np.dtype(skip.dtype) != np.int32):
        raise ShapeError(f"{op}: skip must be an int32 device array of one element, got "
                         f"{skip.dtype} {tuple(skip.shape)}")


def check_loss_scale(op, s):
    """Loss scaling's device state: four reals."""
    if s.size != 4:
        raise ShapeError(f"{op}: s {tuple(s.shape)} must hold 4 numbers, [scale, 1 / scale, "
                         f"clean steps, skipped steps]")


def check_clip(g, squares, max_norm, unit):
    """clip_norm's operands: a gradient vector, a real of one element for its sum of
    squares, a positive finite bound, a finite nonzero unit."""
    if not (np.isfinite(unit) and unit != 0):
        raise ShapeError(f"clip_norm: unit must be a finite number other than 0, got {unit!r}")
    if len(g.shape) != 1 or squares.size != 1:
        raise ShapeError(f"clip_norm: g {tuple(g.shape)} must be a vector and squares "
                         f"{tuple(squares.shape)} one number")
    if not (np.isfinite(max_norm) and max_norm > 0):
        raise ShapeError(f"clip_norm: max_norm must be a finite number > 0, got {max_norm!r}")


def check_found(op, found):
    """The flag a loss-scaled step's check sets: an int32 device array of one element."""
    if found is None:
        raise ShapeError(f"{op}: found must be an int32 device array of one element, "
                         f"not None")
    check_skip(op, found)


def log_beta(beta):
    """log(beta) for adam_scalars' 1 - beta^t = -expm1(t log beta), in double; -inf for 0."""
    return math.log(beta) if beta > 0 else -math.inf


def check_adam(scalars, n_decay, w, *state):
    """check_update's checks, and Adam's device scalars four numbers."""
    check_update("adam_update", n_decay, w, *state)
    if scalars.size != 4:
        raise ShapeError(f"adam_update: scalars {scalars.shape} must hold 4 numbers, "
                         f"[lr / (1 - beta1^t), sqrt(1 - beta2^t), 1 - lr wd, lr]")


def check_pool(op, a, x, pool, stride):
    """(C, H, W, N, ph, pw, sh, sw, Ho, Wo) of pooling x (C, H, W, N) into a (C, Ho, Wo, N)
    with windows pool = (ph, pw), stride = (sh, sw) (ints: square), or a ShapeError."""
    (ph, pw), (sh, sw) = (_pair(pool), _pair(stride))
    C, H, W, N = x.shape
    Ho, Wo = conv_out(H, ph, sh, 0), conv_out(W, pw, sw, 0)
    if min(ph, pw, sh, sw) < 1 or Ho < 1 or Wo < 1 or a.shape != (C, Ho, Wo, N):
        raise ShapeError(f"{op}: windows {ph}x{pw}, stride {sh}x{sw} of an image "
                         f"{x.shape} give ({C}, {Ho}, {Wo}, {N}), not {a.shape}; windows and "
                         f"strides are at least 1 and windows no larger than the image")
    return C, H, W, N, ph, pw, sh, sw, Ho, Wo


def _pair(n):
    return (int(n), int(n)) if np.isscalar(n) else tuple(int(k) for k in n)


def check_rows(op, x, like_x, per_row):
    """(rows, n) of x viewed as (rows, n); or a ShapeError naming the array that does not
    fit: like_x (name -> array or None) must have x's shape, per_row (name -> array) one
    element per row."""
    if len(x.shape) < 2 or x.size == 0:
        raise ShapeError(f"{op}: x {tuple(x.shape)} must be (features, batch) or (C, H, W, N), "
                         f"not empty")
    rows = x.shape[0]
    for name, y in like_x.items():
        if y is not None and tuple(y.shape) != tuple(x.shape):
            raise ShapeError(f"{op}: {name} {tuple(y.shape)} must have the shape of x "
                             f"{tuple(x.shape)}")
    for name, v in per_row.items():
        if tuple(v.shape) != (rows,):
            raise ShapeError(f"{op}: {name} {tuple(v.shape)} must be ({rows},), one value per "
                             f"row of x {tuple(x.shape)}")
    return rows, x.size // rows


def check_columns(bk, op, x, like_x, per_row, per_column):
    """(rows, n) of x viewed as (rows, n) for layer normalization: check_rows's checks,
    per_column (name -> array) one element per column, and every array real."""
    rows, n = check_rows(op, x, like_x, per_row)
    for name, v in per_column.items():
        if tuple(v.shape) != (n,):
            raise ShapeError(f"{op}: {name} {tuple(v.shape)} must be ({n},), one value per "
                             f"column of x {tuple(x.shape)}")
    wrong = {name: y.dtype for name, y in {"x": x, **like_x}.items()
             if y is not None and y.dtype != bk.dtype}
    if wrong:
        raise ShapeError(f"{op}: " + ", ".join(f"{name} {d}" for name, d in wrong.items())
                         + f": layer normalization reads and writes {bk.dtype}")
    return rows, n


def check_norm_kind(kind):
    check_activation(kind)
    if kind == "softmax":
        raise InputError("batch normalization takes an elementwise activation, not softmax: "
                         "normalize, then apply softmax in a layer of its own")
