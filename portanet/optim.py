"""Stochastic gradient descent with momentum, the one optimizer the layer protocol fuses.

The update is not a separate pass: each layer's backward does it with BLAS calls,

    v <- mu v - eta/m dL/dz a_prev^T - eta lambda w      (momentum is gemm's beta)
    vb <- mu vb - eta/m dL/dz ones                         (gemv with a ones vector)
    w <- w + v,  b <- b + vb

so the optimizer only carries the numbers.
"""
import math
import numbers
from dataclasses import dataclass

from .errors import InputError


@dataclass(frozen=True)
class SGD:
    lr: float = 0.01            # eta
    momentum: float = 0.0       # mu; 0 is plain SGD
    weight_decay: float = 0.0   # lambda, L2 on the weights (not the biases)

    def __post_init__(self):
        for name, low, high in (("lr", 0, math.inf), ("momentum", 0, 1),
                                ("weight_decay", 0, math.inf)):
            value = getattr(self, name)
            real = isinstance(value, numbers.Real) and not isinstance(value, bool)
            if not real or not math.isfinite(value) or not low <= value < high \
                    or (name == "lr" and value == 0):
                raise InputError(f"SGD: {name} must be a finite number in "
                                 f"{'(' if name == 'lr' else '['}{low}, {high}), got {value!r}")
