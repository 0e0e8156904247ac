"""One exception family: every message names what is wrong and how to fix it."""


class PortanetError(Exception):
    """Base of every error portanet raises on purpose."""


class DeviceError(PortanetError):
    """Unknown or unavailable device, missing backend package, device failure."""


class OutOfMemoryError(DeviceError):
    """A device allocation failed; the process stays usable."""


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
