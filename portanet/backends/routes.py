"""Routes kept in a file (PORTANET_ROUTES): what auto routing measured on a device, read
back by later processes instead of measured again.

Routing times each shape's paths when a process first meets it (gpu.KernelBackend._fastest),
and timings differ between processes: a path a few percent faster in one process can lose
in the next. Paths sum in different orders, so the same seed then trains to a different
accuracy (up to 0.5 pp on NVIDIA's OpenCL after 4 epochs of LeNet). With PORTANET_ROUTES
set, a backend takes each shape's path from the file where it holds one and adds each path
it measures, so every process on the device computes as the first one did.

A backend's routes are kept under its scope: a digest of the device, its driver and every
kernel source (`_sources_id`), of this module's caller (the routing code), the backend's
dtype, precision, GEMM and convolution paths and its tilings. A change in any of them starts
an empty scope, and the old one stays in the file unused. The file is JSON, rewritten
whole (a temporary file beside it, then os.replace) with what other processes added since
it was read, so processes that share it may each add routes; two that measure the same
shape at once keep the last one written.
"""
import hashlib
import json
import os
import threading
from pathlib import Path

from ..errors import PortanetError


class RouteFile:
    """One backend's routes in the file at `path`, under `scope`."""

    def __init__(self, path, scope):
        self.path, self.scope = Path(path), scope
        self._routes = None             # this scope's, read at the first get
        self._lock = threading.Lock()

    def get(self, key):
        """The path kept for `key` (a routing key: a tuple of numbers, bools and names),
        or None."""
        with self._lock:
            if self._routes is None:
                self._routes = self._read().get(self.scope, {})
            return self._routes.get(repr(key))

    def put(self, key, path):
        """Keep `path` for `key`, with every route the file holds now."""
        with self._lock:
            every = self._read()
            mine = every.setdefault(self.scope, {})
            mine[repr(key)] = path
            self._routes = dict(mine)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                tmp.write_text(json.dumps(every, indent=0, sort_keys=True))
                os.replace(tmp, self.path)
            except OSError as e:
                tmp.unlink(missing_ok=True)
                raise PortanetError(f"PORTANET_ROUTES={str(self.path)!r} cannot be written "
                                    f"({e.strerror or e}): give a file in a folder you can "
                                    f"write, or unset it") from e

    def _read(self):
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        except OSError as e:
            raise PortanetError(f"PORTANET_ROUTES={str(self.path)!r} cannot be read "
                                f"({e.strerror or e})") from e
        try:
            every = json.loads(text)
            if not isinstance(every, dict) or \
                    not all(isinstance(v, dict) for v in every.values()):
                raise ValueError("not an object of scopes")
            return every
        except ValueError as e:
            raise PortanetError(f"PORTANET_ROUTES={str(self.path)!r} is not a routes file "
                                f"({e}): give another path, or delete it to measure the "
                                f"routes again") from e


def scope(*parts):
    """A scope's name: a digest of what routes depend on."""
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:24]
