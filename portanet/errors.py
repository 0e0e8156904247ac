"""One exception family: every message names what is wrong and how to fix it."""
import numbers


class PortanetError(Exception):
    """Base of every error portanet raises on purpose."""


class DeviceError(PortanetError):
    """Unknown or unavailable device, missing backend package, device failure."""


class OutOfMemoryError(DeviceError):
    """A device allocation failed, or a plan does not fit; the process stays usable.
    largest_batch: where a smaller batch would fit, the largest that does (a command line
    says its own option for it)."""

    def __init__(self, message, largest_batch=None):
        super().__init__(message)
        self.largest_batch = largest_batch


class PrecisionError(DeviceError):
    """A device asked for a precision it does not compute; the message lists those it does."""


class ShapeError(PortanetError, ValueError):
    """Arrays whose shapes do not fit the network or each other."""


class InputError(PortanetError, ValueError):
    """Bad values or dtypes in user data (NaN, labels out of range, ...)."""


class DataError(PortanetError):
    """A dataset file that is missing, truncated or corrupt."""


class ModelFileError(PortanetError):
    """A saved network that cannot be loaded into this architecture."""


class KernelBuildError(DeviceError):
    """A device kernel failed to compile; the message carries the build log."""


class DivergedError(PortanetError):
    """Training produced a loss that is NaN or infinite. Carries the epoch (from 0), the
    loss, the learning rate and the history of the epochs before."""

    def __init__(self, message, epoch=None, loss=None, lr=None, history=None, precision=None):
        super().__init__(message)
        self.epoch, self.loss, self.lr, self.history = epoch, loss, lr, history
        self.precision = precision


def check_count(what, value, low=1):
    """value as an int >= low, else an InputError naming `what`; bools, strings and
    fractions are refused (3.0 is taken as 3)."""
    whole = isinstance(value, numbers.Integral) or (
        isinstance(value, float) and value.is_integer())
    if isinstance(value, bool) or not whole or value < low:
        raise InputError(f"{what} must be a whole number >= {low}, got {value!r}")
    return int(value)
