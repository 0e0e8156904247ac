"""Stochastic gradient descent with momentum, the one optimizer the layer protocol fuses.

The update is not a separate pass: each layer's backward does it with BLAS calls,

    v <- mu v - eta/m dL/dz a_prev^T - eta lambda w      (momentum is gemm's beta)
    vb <- mu vb - eta/m dL/dz ones                         (gemv with a ones vector)
    w <- w + v,  b <- b + vb

so the optimizer only carries the numbers.
"""
from dataclasses import dataclass

from .errors import InputError


@dataclass(frozen=True)
class SGD:
    lr: float = 0.01            # eta
    momentum: float = 0.0       # mu; 0 is plain SGD
    weight_decay: float = 0.0   # lambda, L2 on the weights (not the biases)

    def __post_init__(self):
        if not self.lr > 0:
            raise InputError(f"SGD: learning rate must be > 0, got {self.lr}")
        if not 0 <= self.momentum < 1:
            raise InputError(f"SGD: momentum must be in [0, 1), got {self.momentum}")
        if self.weight_decay < 0:
            raise InputError(f"SGD: weight_decay must be >= 0, got {self.weight_decay}")
