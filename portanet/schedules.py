"""Learning-rate schedules: the rate of each epoch from the optimizer's base rate.

A schedule is called as schedule(epoch, base_lr) with epochs counted from 0, so one object
gives the same rates to `fit(..., schedule=...)` and to `portanet train --schedule`:

    Constant()                   base_lr every epoch (what fit does without a schedule)
    Exponential(gamma)           base_lr gamma^epoch
    Step(every, gamma)           base_lr gamma^(epoch // every)
    Cosine(epochs, min_lr=0)     from base_lr down to min_lr along half a cosine
    Warmup(epochs, then)         linear from base_lr/epochs up to base_lr, then `then`
                                 (counting its epochs from the end of the warmup)

In the CLI they are written as calls: "exponential(0.6)", "warmup(2, cosine(30))".
"""
import ast
import math
from dataclasses import dataclass

from .errors import InputError, check_count


class Schedule:
    def __call__(self, epoch, base_lr):
        raise NotImplementedError


@dataclass(frozen=True)
class Constant(Schedule):
    def __call__(self, epoch, base_lr):
        return base_lr


@dataclass(frozen=True)
class Exponential(Schedule):
    gamma: float

    def __post_init__(self):
        _check(self, "gamma", self.gamma, 0, 1, low_open=True)

    def __call__(self, epoch, base_lr):
        return base_lr * self.gamma ** epoch


@dataclass(frozen=True)
class Step(Schedule):
    every: int
    gamma: float = 0.1

    def __post_init__(self):
        check_count("Step: every", self.every, 1)
        _check(self, "gamma", self.gamma, 0, 1, low_open=True)

    def __call__(self, epoch, base_lr):
        return base_lr * self.gamma ** (epoch // self.every)


@dataclass(frozen=True)
class Cosine(Schedule):
    epochs: int
    min_lr: float = 0.0

    def __post_init__(self):
        check_count("Cosine: epochs", self.epochs, 1)
        _check(self, "min_lr", self.min_lr, 0, math.inf)

    def __call__(self, epoch, base_lr):
        t = min(epoch, self.epochs) / self.epochs
        return self.min_lr + (base_lr - self.min_lr) * (1 + math.cos(math.pi * t)) / 2


@dataclass(frozen=True)
class Warmup(Schedule):
    epochs: int
    then: Schedule = Constant()

    def __post_init__(self):
        check_count("Warmup: epochs", self.epochs, 1)
        if not isinstance(self.then, Schedule):
            raise InputError(f"Warmup: then must be a schedule, got {self.then!r}")

    def __call__(self, epoch, base_lr):
        if epoch < self.epochs:
            return base_lr * (epoch + 1) / self.epochs
        return self.then(epoch - self.epochs, base_lr)


SCHEDULES = {"constant": Constant, "exponential": Exponential, "step": Step,
             "cosine": Cosine, "warmup": Warmup}


def get(schedule):
    """A Schedule from an object, None (constant) or its text ("step(10, 0.1)")."""
    if schedule is None:
        return Constant()
    if isinstance(schedule, Schedule):
        return schedule
    if isinstance(schedule, str):
        return parse(schedule)
    raise InputError(f"schedule must be a portanet.schedules object such as "
                     f"Exponential(0.6), or its text, got {schedule!r}")


def parse(text):
    """'warmup(2, cosine(30))' -> Warmup(2, Cosine(30)). Python's parser reads the text;
    only schedule names and numbers are accepted, nothing is evaluated."""
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError) as e:       # ValueError: a NUL byte in the text
        raise InputError(f"cannot read the schedule {text!r} ({getattr(e, 'msg', e)}); "
                         f"write it as a call such as 'exponential(0.6)'") from None
    return _build(tree, text)


def _build(node, text):
    if isinstance(node, ast.Name):              # "cosine" alone would lack its epochs
        node = ast.Call(func=node, args=[], keywords=[])
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) \
            and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
            and node.func.id.lower() in SCHEDULES:
        cls = SCHEDULES[node.func.id.lower()]
        args = [_build(a, text) for a in node.args]
        kwargs = {k.arg: _build(k.value, text) for k in node.keywords}
        try:
            return cls(*args, **kwargs)
        except TypeError as e:
            raise InputError(f"schedule {text!r}: {e}") from e
    raise InputError(f"cannot read the schedule {text!r}: use "
                     f"{', '.join(f'{n}(...)' for n in SCHEDULES)} with numbers, "
                     f"e.g. 'exponential(0.6)' or 'warmup(2, cosine(30))'")


def _check(obj, name, value, low, high, low_open=False):
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < low or value > high or (low_open and value == low):
        raise InputError(f"{type(obj).__name__}: {name} must be a number in "
                         f"{'(' if low_open else '['}{low}, {high}], got {value!r}")
