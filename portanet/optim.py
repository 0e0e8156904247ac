"""Optimizers: the numbers of an update rule, and the one fused kernel that applies it.

An optimizer does not run a pass of its own over the gradients. Each trainable layer keeps
its parameters in one flat vector (weights first, then biases and the like), and its
backward writes the gradient products straight into a flat target that the optimizer
names, with the gemm's alpha and beta it names:

    SGD (no Nesterov)   into its velocity v:  v <- mu v - eta/m dz a_prev^T   (beta = mu)
    the others          into the network's one gradient workspace, g <- 1/m dz a_prev^T

Then one elementwise kernel per layer applies the rest of the rule to the whole flat
vector (`update`); where the gradients are in the optimizer's own state (SGD's velocity),
the layers' updates wait for the end of backward and go in as few launches as the backend
takes (`update_layers`). Weight decay applies to the first `n_decay` elements (the weights of
Dense and Conv2D), never to biases nor BatchNorm's scale and shift. The formulas are
torch.optim's (SGD keeps -lr times torch's buffer, which is the same at a constant rate).

Each optimizer declares its state: `slots` are buffers like the parameters (SGD with
momentum: v; Adam: m and v), `uses_workspace` whether it needs the gradient workspace,
and `bytes_per_parameter` what that costs beside the parameters themselves.

A loss-scaled step (`LossScale`, fp16's default) multiplies the loss's delta by a scale S,
so that small gradients survive half precision's products, and must not update anything
when a gradient overflowed. So every layer's gradient goes into its own part of a workspace
as large as the network (`target(gathered=True)`: SGD's velocity can no longer be gemm's
beta, since a step that is then skipped would have spoilt it), the step divides them by S
and looks for inf and NaN in one launch, and the updates (`skip`) change nothing where it
found any; S halves after such a step and doubles after `growth_interval` clean ones, all
on the device (training.OptimizerState).

Global-norm clipping (`clip_norm`, any optimizer's keyword, as Keras's `global_clipnorm`;
fit's clip_norm sets it) gathers the gradients so too: once backward has written them all
(and a distributed step has averaged them), one sum of squares over the workspace gives
the global norm, and they are scaled by min(1, clip_norm / (norm + 1e-6)) on the device,
as torch.nn.utils.clip_grad_norm_ does, before the updates read them.
"""
import dataclasses
import math
import numbers
from dataclasses import dataclass, field

import numpy as np

from .errors import InputError


@dataclass(frozen=True)
class Optimizer:
    """The interface. Subclasses are frozen dataclasses: equal settings are one key of a
    recorded training step (network._train_step). clip_norm, a keyword of every one: the
    gradients' global norm is clipped to it before each update (None: never)."""
    clip_norm: float = field(default=None, kw_only=True)

    name = "optimizer"

    def __post_init__(self):
        if self.clip_norm is not None:
            _check(self, "clip_norm", 0, math.inf, low_open=True)

    def __repr__(self):
        """Its fields in order, clip_norm last and only where it is set."""
        shown = [f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self)
                 if f.name != "clip_norm"]
        if self.clip_norm is not None:
            shown.append(f"clip_norm={self.clip_norm!r}")
        return f"{type(self).__name__}({', '.join(shown)})"

    @property
    def gathers(self):
        """Whether the step gathers every gradient in the network's workspace before any
        update, as clipping must (and loss scaling: `target(gathered=True)`)."""
        return self.clip_norm is not None

    def slots(self):
        """Names of the state buffers kept per parameter, each as large as the parameters."""
        return ()

    @property
    def uses_workspace(self):
        return True

    def bytes_per_parameter(self, itemsize):
        """Bytes a parameter holds in training: itself and its state (the gradient
        workspace is shared by the network, sized for its largest layer)."""
        return (1 + len(self.slots())) * itemsize

    def target(self, gathered=False):
        """(slot, scale, beta): the layer writes scale/m (its dL/dparams summed over a
        batch of m) + beta target into the state buffer `slot`, or into the gradient
        workspace where slot is None (always, where the step gathers the gradients: loss
        scaling, clipping)."""
        return None, 1.0, 0.0

    # whether the update reads its rate from the device (step_scalars), so that a recorded
    # step may take a new rate every step (a schedule by steps)
    rate_on_device = False

    def step_scalars(self, t, lr=None):
        """Numbers of step t (1, 2, ...) at rate lr (default the optimizer's) that the
        update reads from the device (so that a recorded step stays valid), or None."""
        return None

    def count_step(self, bk, scalars, steps, found):
        """A loss-scaled step's step_scalars, formed on the device, which counts its steps
        in `steps` where `found` says the step was not skipped (the host cannot know)."""

    def update(self, bk, flat, grad, state, n_decay, scalars, skip, gathered=False):
        """Apply the rule to one layer's flat parameters, where its target() put the
        gradient (`grad`): one kernel launch, which changes nothing where the device flag
        `skip` is set."""
        raise NotImplementedError

    def update_layers(self, bk, layers, scalars, skip, gathered=False):
        """update on each (flat, grad, state, n_decay) of `layers`, in as few launches as
        the backend takes them."""
        for flat, grad, state, n_decay in layers:
            self.update(bk, flat, grad, state, n_decay, scalars, skip, gathered)

    def describe(self):
        return f"{self.name} ({self.bytes_per_parameter(4)} bytes per float32 parameter)"


@dataclass(frozen=True, repr=False)
class SGD(Optimizer):
    lr: float = 0.01            # eta
    momentum: float = 0.0       # mu; 0 is plain SGD
    weight_decay: float = 0.0   # lambda, L2 on the weights (not the biases)
    nesterov: bool = False

    name = "sgd"

    def __post_init__(self):
        super().__post_init__()
        _check(self, "lr", 0, math.inf, low_open=True)
        _check(self, "momentum", 0, 1, high_open=True)
        _check(self, "weight_decay", 0, math.inf)
        _flag(self, "nesterov")
        if self.nesterov and not self.momentum:
            raise InputError("SGD: nesterov=True needs a momentum > 0, e.g. momentum=0.9")

    def slots(self):
        return ("v",) if self.momentum else ()

    @property
    def uses_workspace(self):
        return self.nesterov or not self.momentum

    def _from_gradient(self, gathered):
        """Whether the velocity is updated from the gradient in the workspace (sgd_update):
        with Nesterov momentum, and with any momentum where the step gathers the gradients
        (loss scaling, clipping); else it is gemm's beta (or there is none)."""
        return self.nesterov or bool(self.momentum and gathered)

    def target(self, gathered=False):
        if self._from_gradient(gathered):
            return None, 1.0, 0.0
        if self.momentum:                    # momentum is gemm's beta: v <- mu v - eta/m g
            return "v", -self.lr, self.momentum
        return None, -self.lr, 0.0

    def update(self, bk, flat, grad, state, n_decay, scalars, skip, gathered=False):
        if self._from_gradient(gathered):
            bk.sgd_update(flat, grad, state["v"], self.lr, self.momentum, self.weight_decay,
                          n_decay, self.nesterov, skip)
        else:                                # v -= eta lambda w; w += v
            bk.momentum_update(flat, grad, self.lr * self.weight_decay, n_decay, skip)

    def update_layers(self, bk, layers, scalars, skip, gathered=False):
        if self._from_gradient(gathered):
            super().update_layers(bk, layers, scalars, skip, gathered)
        else:
            bk.momentum_updates([(flat, grad, n_decay) for flat, grad, _, n_decay in layers],
                                self.lr * self.weight_decay, skip)


@dataclass(frozen=True, repr=False)
class Adam(Optimizer):
    lr: float = 0.001
    betas: tuple = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0       # L2 added to the gradient (Adam); decoupled in AdamW

    name = "adam"
    decoupled = False

    def __post_init__(self):
        super().__post_init__()
        _check(self, "lr", 0, math.inf, low_open=True)
        betas = self.betas
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise InputError(f"{type(self).__name__}: betas must be two numbers in [0, 1), "
                             f"e.g. (0.9, 0.999), got {betas!r}")
        object.__setattr__(self, "betas", tuple(betas))      # hashable, equal either way
        for b in betas:
            _number(self, "betas", b, 0, 1, high_open=True)
        _check(self, "eps", 0, math.inf, low_open=True)
        _check(self, "weight_decay", 0, math.inf)

    def slots(self):
        return ("m", "v")

    rate_on_device = True

    def step_scalars(self, t, lr=None):
        """[lr / (1 - beta1^t), sqrt(1 - beta2^t), 1 - lr wd (AdamW's decay; 1 for Adam),
        lr] at the rate lr (default the optimizer's)."""
        b1, b2 = self.betas
        lr = self.lr if lr is None else lr
        keep = 1.0 - lr * self.weight_decay if self.decoupled else 1.0
        return np.array([lr / (1 - b1 ** t), math.sqrt(1 - b2 ** t), keep, lr])

    def count_step(self, bk, scalars, steps, found):
        bk.adam_scalars(scalars, steps, found, *self.betas)

    def update(self, bk, flat, grad, state, n_decay, scalars, skip, gathered=False):
        bk.adam_update(flat, grad, state["m"], state["v"], scalars, self.betas[0],
                       self.betas[1], self.eps, 0.0 if self.decoupled else self.weight_decay,
                       n_decay, skip)


@dataclass(frozen=True, repr=False)
class AdamW(Adam):
    weight_decay: float = 0.01      # decoupled: w <- w (1 - lr wd) before Adam's step

    name = "adamw"
    decoupled = True


@dataclass(frozen=True, repr=False)
class RMSprop(Optimizer):
    lr: float = 0.01
    alpha: float = 0.99
    eps: float = 1e-8
    weight_decay: float = 0.0
    momentum: float = 0.0
    centered: bool = False

    name = "rmsprop"

    def __post_init__(self):
        super().__post_init__()
        _check(self, "lr", 0, math.inf, low_open=True)
        _check(self, "alpha", 0, 1, high_open=True)
        _check(self, "eps", 0, math.inf, low_open=True)
        _check(self, "weight_decay", 0, math.inf)
        _check(self, "momentum", 0, 1, high_open=True)
        _flag(self, "centered")

    def slots(self):
        return ("v",) + (("buf",) if self.momentum else ()) + (("gavg",) if self.centered else ())

    def update(self, bk, flat, grad, state, n_decay, scalars, skip, gathered=False):
        bk.rmsprop_update(flat, grad, state["v"], state.get("buf"), state.get("gavg"), self.lr,
                          self.alpha, self.eps, self.weight_decay, self.momentum, n_decay,
                          skip)


OPTIMIZERS = {"sgd": SGD, "adam": Adam, "adamw": AdamW, "rmsprop": RMSprop}


@dataclass(frozen=True)
class LossScale:
    """Dynamic loss scaling, as torch.amp.GradScaler and Keras's LossScaleOptimizer do it:
    the loss's gradient is multiplied by the scale before backward and every parameter's
    divided by it before the update; a step whose gradients are then not all finite is
    skipped (parameters and optimizer state untouched) and halves the scale, and
    `growth_interval` clean steps in a row double it. fp16 networks scale by default
    (Sequential's loss_scale="auto"); the history's skipped_steps and loss_scale say what
    it did. The scale stays a power of two, so scaling and unscaling are exact: where
    nothing under- or overflows, a scaled step computes what an unscaled one does. A skipped
    step is no step (Adam's count does not move), but BatchNorm's running statistics, which
    its forward pass updated, keep what it saw, as in PyTorch."""
    initial: float = 2.0 ** 16      # torch's init_scale; Keras starts at 2^15
    growth_interval: int = 2000     # clean steps in a row that double the scale

    LOW, HIGH = 2.0 ** -24, 2.0 ** 24       # the scale stays within them

    def __post_init__(self):
        x = self.initial
        real = isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
        if not real or x <= 0 or math.frexp(x)[0] != 0.5 or not self.LOW <= x <= self.HIGH:
            raise InputError(f"LossScale: initial must be a power of two in [2**-24, 2**24] "
                             f"(scaling by it is then exact), e.g. 2.0**16, got {x!r}")
        object.__setattr__(self, "initial", float(x))
        n = self.growth_interval
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 2 ** 24:
            raise InputError(f"LossScale: growth_interval must be a whole number of steps "
                             f"in [1, 2**24] (the device counts them in float32), e.g. "
                             f"2000, got {n!r}")

    def config(self):
        return {"initial": self.initial, "growth_interval": self.growth_interval}


def loss_scale(setting, precision):
    """The LossScale a network of `precision` trains with for Sequential's `loss_scale`:
    "auto" is a dynamic one in fp16 (half's products lose gradients below 2^-24), none
    elsewhere; None or False none; a LossScale itself."""
    if isinstance(setting, LossScale):
        return setting
    if setting is None or setting is False:
        return None
    if isinstance(setting, str) and setting == "auto":
        return LossScale() if precision == "fp16" else None
    raise InputError(f"loss_scale must be 'auto' (dynamic in fp16), None (off) or a "
                     f"pn.LossScale(initial=..., growth_interval=...), got {setting!r}")


def get(optimizer):
    if not isinstance(optimizer, Optimizer):
        raise InputError(f"optimizer must be an optimizer object such as "
                         f"pn.SGD(lr=0.01, momentum=0.9) or pn.Adam(), got {optimizer!r}")
    return optimizer


def clipped(optimizer, clip_norm):
    """The optimizer with clip_norm set (fit's keyword); None leaves it as it is. An
    InputError where it has another clip_norm of its own."""
    if clip_norm is None or clip_norm == optimizer.clip_norm:
        return optimizer
    if optimizer.clip_norm is not None:
        raise InputError(f"clip_norm={clip_norm!r} was given to fit, and the optimizer has "
                         f"clip_norm={optimizer.clip_norm!r}: give it once")
    return dataclasses.replace(optimizer, clip_norm=clip_norm)


class SettingError(InputError):
    """A value an optimizer's field cannot take: `field` names the field and `rule` says
    what it must be (the train command names its option instead of the field)."""

    def __init__(self, opt, field, rule):
        self.field, self.rule = field, rule
        super().__init__(f"{type(opt).__name__}: {field} {rule}")


def _number(opt, name, value, low, high, low_open=False, high_open=False):
    real = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if not real or not math.isfinite(value) or value < low or value > high \
            or (low_open and value == low) or (high_open and value == high):
        closed = not high_open and math.isfinite(high)     # inf itself is never taken
        raise SettingError(opt, name, f"must be a finite number in "
                           f"{'(' if low_open else '['}{low}, {high}{']' if closed else ')'}, "
                           f"got {value!r}")


def _check(opt, name, low, high, low_open=False, high_open=False):
    _number(opt, name, getattr(opt, name), low, high, low_open, high_open)


def _flag(opt, name):
    if not isinstance(getattr(opt, name), bool):
        raise SettingError(opt, name, f"must be True or False, got {getattr(opt, name)!r}")
