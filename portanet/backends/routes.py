"""Routes kept in a file (PORTANET_ROUTES): what auto routing measured on a device, read
back by later processes instead of measured again.

Routing times each shape's paths when a process first meets it (gpu.KernelBackend._fastest),
and timings differ between processes: a path a few percent faster in one process can lose
in the next. Paths sum in different orders, so the same seed then trains to a different
accuracy (up to 0.5 pp on NVIDIA's OpenCL after 4 epochs of LeNet). With PORTANET_ROUTES
set, a backend takes each shape's path from the file where it holds one and adds each path
it measures, so every process on the device computes as the first one did.

A backend's routes are kept under its scope: a digest of the device, its driver and every
kernel source (`_sources_id`), of the backends' own code, the backend's dtype, precision,
GEMM and convolution paths, tilings, compute units and limits, and the vendor library (its
presence and version). A change in any of them starts an empty scope; the old one stays in
the file unused. Each route is kept with the names of the paths there were to choose from
(gpu._file_key), so a shape routed among other paths (no CLBlast, a conv workspace without
room for im2col) is another entry.

The file is JSON, rewritten whole under a lock (fcntl, a ".lock" file beside it) into a
temporary file beside it, then os.replace: processes and threads that share it each add
their routes and lose none. The first route written for an entry stays: a process that
timed the same entry meanwhile takes the one in the file, so every process computes alike.
A file that cannot be read or written is warned of once, and the routes then stay in
memory; one that is not a routes file is an error that names it.
"""
import contextlib
import hashlib
import importlib.metadata
import json
import os
import tempfile
import threading
import warnings
from pathlib import Path

from ..errors import PortanetError

try:
    import fcntl
except ImportError:                 # not on Windows: writers there are not serialised
    fcntl = None


class RouteFile:
    """One backend's routes in the file at `path`, under `scope`."""

    def __init__(self, path, scope):
        self.path, self.scope = Path(path), scope
        self._routes = None             # this scope's, read at the first get
        self._lock = threading.Lock()
        self.writable = True

    def get(self, key):
        """The path kept for `key` (a routing key: a tuple of numbers, bools and names),
        or None."""
        with self._lock:
            if self._routes is None:
                try:
                    self._routes = self._read().get(self.scope, {})
                except OSError as e:
                    self._routes = {}
                    self._cannot("read", e)
            return self._routes.get(repr(key))

    def put(self, key, path):
        """Keep `path` for `key` unless the file holds one for it already; the path kept."""
        with self._lock:
            if not self.writable:
                return path
            try:
                with self._locked():
                    every = self._read()
                    mine = every.setdefault(self.scope, {})
                    path = mine.setdefault(repr(key), path)
                    self._routes = dict(mine)
                    self._write(every)
            except OSError as e:
                self._cannot("written", e)
            return path

    def _cannot(self, what, e):
        """Routes are an optimisation: a file that cannot be read or written is warned of
        once, and this backend's routes then stay in memory."""
        if self.writable:
            self.writable = False
            warnings.warn(f"PORTANET_ROUTES={str(self.path)!r} cannot be {what} "
                          f"({e.strerror or e}); the routes measured now stay in this "
                          f"process only", RuntimeWarning, stacklevel=3)

    @contextlib.contextmanager
    def _locked(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if fcntl is None:
            yield
            return
        with open(self.path.with_name(f".{self.path.name}.lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _write(self, every):
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(every, f, indent=0, sort_keys=True)
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def _read(self):
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        if not text.strip():
            return {}                   # made empty (touch): nothing kept yet
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


def code_id():
    """A digest of the backends' code (this folder's modules) and the tuning module: what
    the paths are and how routing chooses among them."""
    here = Path(__file__).parent
    digest = hashlib.sha256()
    for module in sorted(here.glob("*.py")) + [here.parent / "tuning.py"]:
        digest.update(module.read_bytes())
    return digest.hexdigest()[:16]


def versions(*packages):
    """{package: version or None} of the vendor libraries routes may choose."""
    found = {}
    for name in packages:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found
