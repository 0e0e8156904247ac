"""Precisions: how much of a float32 network's arithmetic may round below float32.

    fp32   float32 storage and arithmetic (the default)
    tf32   float32 storage; every matrix product with each input rounded to TF32 (10 stored
           bits of mantissa, float32's exponent), products summed in float32
    bf16   the same with each input rounded to bfloat16 (7 stored bits, float32's
           exponent): tensor cores at twice TF32's rate
    fp16   the same in IEEE half (10 stored bits, and half's range: inf from 65520 up,
           subnormal below 2^-14); its networks scale their loss (optim.LossScale)
    fp64   float64 networks (dtype="float64"): their one precision

In bf16 and fp16 what only products read is stored in 16 bits (`STORAGE`): the input
batch where a Dense reads it first, and a Dense's z and a where another Dense reads a
(docs/storage16.md). Everything else stays float32: the weights (the
master copy) and the optimizer's state, gradients, the last layer's outputs and the other
layers' activations. Elsewhere only the matrix products' inputs round (16-bit copies of
them where a vendor GEMM reads 16-bit types).

A backend is made per device, dtype and precision (backends.device), and says which
precisions it computes (`Backend.precisions`); the NumPy reference emulates each by
rounding where the kernels round (`round_to`), so that tests compare like with like.
"""
from collections import namedtuple

import numpy as np

from . import config
from .errors import InputError

Precision = namedtuple("Precision", "name mantissa")        # mantissa: stored bits

PRECISIONS = {p.name: p for p in (Precision("fp32", 23), Precision("tf32", 10),
                                  Precision("bf16", 7), Precision("fp16", 10),
                                  Precision("fp64", 52))}

# the relative error one rounding to the precision may make (half a unit in the last place)
UNIT_ROUNDOFF = {name: 2.0 ** -(p.mantissa + 1) for name, p in PRECISIONS.items()}

# other names users bring: PyTorch's dtypes and Keras's mixed-precision policies
ALIASES = {"float32": "fp32", "tensorfloat32": "tf32", "bfloat16": "bf16",
           "mixed_bfloat16": "bf16", "float16": "fp16", "half": "fp16",
           "mixed_float16": "fp16", "float64": "fp64", "double": "fp64"}

# the dtype of 16-bit storage: IEEE half is NumPy's float16; bfloat16, which NumPy lacks,
# is held as its bits (the upper half of a float32's)
STORAGE = {"bf16": np.dtype(np.uint16), "fp16": np.dtype(np.float16)}

# fp16: the least magnitude that rounds to inf (half's largest finite is 65504)
HALF_OVERFLOW = 65520.0


def resolve(precision, dtype):
    """The precision's name for a backend of `dtype` (None: fp64 for float64, else the
    default, fp32); an unknown name, or one that does not go with dtype, is an InputError."""
    dtype = np.dtype(dtype)
    if precision is None:
        return "fp64" if dtype == np.float64 else "fp32"
    name = str(precision).strip().lower() if isinstance(precision, str) else precision
    name = ALIASES.get(name, name) if isinstance(name, str) else name
    if name not in PRECISIONS:
        raise InputError(f"precision {precision!r} is not one of fp32 (the default), tf32, "
                         f"bf16, fp16 (or fp64, a float64 network's)")
    if (name == "fp64") != (dtype == np.float64):
        fix = ("fp64 is a float64 network's precision: give dtype='float64' (the command "
               "line trains float32 networks)" if name == "fp64" else
               "float64 networks compute in fp64 only: give dtype='float32' to use " + name)
        raise InputError(f"precision {name} with dtype {dtype}: {fix}")
    return name


def default(precision, dtype):
    """The precision a network or a bench of `dtype` computes in: the one given, else
    PORTANET_PRECISION for float32 (a float64 network is fp64 whatever it says), else None
    (resolve's default)."""
    if precision is None and np.dtype(dtype) == np.float32:
        precision = config.precision()
        if precision is not None:
            try:
                resolve(precision, dtype)
            except InputError as e:
                raise InputError(f"PORTANET_PRECISION={precision!r}: {e}") from e
    return precision


def round_to(x, precision):
    """x (a float32 array) rounded to `precision`'s mantissa, to nearest with ties to even,
    as float32: what a tensor core multiplies. fp32 and fp64: x itself."""
    if precision not in PRECISIONS:
        raise InputError(f"round_to: unknown precision {precision!r}")
    if precision in ("fp32", "fp64"):
        return x
    if np.asarray(x).dtype != np.float32:   # a float64 input would be rounded twice
        raise InputError(f"round_to takes float32 arrays, not {np.asarray(x).dtype}")
    if precision == "fp16":                 # from HALF_OVERFLOW up: inf, as the kernels round
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(np.float32)
    drop = 23 - PRECISIONS[precision].mantissa          # low bits of float32's mantissa
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
    half = np.uint32(1 << (drop - 1))
    odd = (bits >> np.uint32(drop)) & np.uint32(1)       # ties go to the even neighbour
    rounded = (bits + (half - np.uint32(1)) + odd) & ~np.uint32((1 << drop) - 1)
    finite = np.isfinite(x)                              # inf and NaN keep their bits
    return np.where(finite, rounded, bits).view(np.float32).reshape(np.shape(x))


def to_storage(x, precision):
    """x (float32 values) as `precision` stores them in 16 bits (STORAGE's dtype): rounded
    as round_to rounds, NaN kept a NaN."""
    x = np.ascontiguousarray(x, np.float32)
    if precision == "fp16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16)
    bits = round_to(x, precision).view(np.uint32) >> np.uint32(16)
    nan = np.isnan(x)
    if nan.any():                           # a NaN whose payload sat in the low bits
        bits = np.where(nan, bits | np.uint32(0x7FC0), bits)
    return bits.astype(np.uint16)


def from_storage(x, precision):
    """The float32 values of 16-bit storage (to_storage's inverse); float32 as it is."""
    x = np.asarray(x)
    if x.dtype == np.float16:
        return x.astype(np.float32)
    if x.dtype == np.uint16:
        return (x.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return x
