"""Pinning a backend's paths: the arguments of `pinned` checked against the paths a
backend has, and the form `pinned` and `routes` take on a backend of one path (the NumPy
reference), so that code written for any device runs on every one. The kernel backends'
form is the router's (gemm/router.py)."""
import contextlib
import types

from ..errors import PortanetError

ONE_PATH = "reference"          # the one path of a backend that does not route


def check_pin(what, path, choices):
    """path, where it is None (left as it is) or one of `choices`; else a PortanetError
    naming them."""
    if path is None or path in choices:
        return path
    raise PortanetError(f"{what} path {path!r} is not one of this backend's: use "
                        f"{', '.join(repr(c) for c in choices)} (or None: as it is)")


class OnePath:
    """`pinned` and `routes` on a backend that computes each product one way: the only
    path to pin is "reference", and nothing is routed."""

    gemm_paths = conv_paths = (ONE_PATH,)       # what `pinned` takes

    @property
    def routes(self):
        """What routing chose, {product's key: path}: nothing on a backend of one path."""
        return types.MappingProxyType({})

    @contextlib.contextmanager
    def pinned(self, gemm=None, conv=None, routes=None):
        """The kernel backends' `pinned` (GemmRouting.pinned), which here pins nothing:
        gemm and conv may be None or "reference", routes None or empty."""
        check_pin("GEMM", gemm, self.gemm_paths)
        check_pin("convolution", conv, self.conv_paths)
        if routes:
            raise PortanetError("routes: a backend of one path routes nothing")
        yield self
