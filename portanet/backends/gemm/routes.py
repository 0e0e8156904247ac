"""Routes kept in a file (PORTANET_ROUTES): what auto routing measured on a device, read
back by later processes instead of measured again.

Routing times each shape's paths when a process first meets it (router.GemmRouting._fastest),
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
(router._file_key), so a shape routed among other paths (no CLBlast, a conv workspace without
room for im2col) is another entry.

The file is JSON, {"format": FORMAT, "scopes": {scope: {repr(key): path}}}, rewritten
whole under a lock (fcntl, a ".lock" file beside it) by files.write_atomically's rule (a
symlink written through, its permissions kept, atomically): processes and threads that
share it each add their routes and lose none. The first route written for an entry stays:
a process that timed the same entry meanwhile takes the one in the file, so every process
computes alike. A file of the earlier layout (the scopes object alone: 24-hex-digit scopes
of tuple keys) is read, and written back in this one. Only a routes file is ever
rewritten: anything else at the path (other JSON, a folder, a FIFO, a file nested too
deep) is an error that names it, and is left as it was. A routes file that cannot be read
or written is warned of once, and the routes then stay in memory.
"""
import contextlib
import hashlib
import importlib.metadata
import json
import os
import re
import threading
import warnings
from pathlib import Path

from ... import files
from ...errors import PortanetError

try:
    import fcntl
except ImportError:                 # not on Windows: writers there are not serialised
    fcntl = None

FORMAT = "portanet-routes-1"
MAX_BYTES = 1 << 26     # thousands of shapes take a few MiB; anything larger is not ours
_WHAT = "the routes (PORTANET_ROUTES)"
_SCOPE = re.compile(r"[0-9a-f]{24}")            # scope()'s digests: the earlier layout's keys


class _Unwritten(PortanetError):
    """The routes file could not be written (a full disk, a read-only folder): warned of."""


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
                self._read()    # what is not a routes file is refused before a lock is made
                with self._locked():
                    every = self._read()
                    mine = every.setdefault(self.scope, {})
                    path = mine.setdefault(repr(key), path)
                    self._routes = dict(mine)
                    self._write(every)
            except (OSError, _Unwritten) as e:
                self._cannot("written", e)
            return path

    def _cannot(self, what, e):
        """Routes are an optimisation: a file that cannot be read or written is warned of
        once, and this backend's routes then stay in memory."""
        if self.writable:
            self.writable = False
            warnings.warn(f"PORTANET_ROUTES={str(self.path)!r} cannot be {what} "
                          f"({getattr(e, 'strerror', None) or e}); the routes measured now "
                          f"stay in this process only", RuntimeWarning, stacklevel=3)

    @contextlib.contextmanager
    def _locked(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if fcntl is None:
            yield
            return
        # beside the file itself, so that a path through a symlink locks the same one
        target = Path(os.path.realpath(self.path))
        with open(target.with_name(f".{target.name}.lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _write(self, every):
        text = json.dumps({"format": FORMAT, "scopes": every}, indent=0, sort_keys=True)
        files.write_text(self.path, text + "\n", _WHAT, _Unwritten)

    def _read(self):
        """{scope: {key: path}} of the file; {} where it is missing or empty (touched).
        Raises PortanetError where the path holds anything but a routes file."""
        try:
            raw = files.read_bytes(self.path, _WHAT, PortanetError, MAX_BYTES)
        except FileNotFoundError:
            return {}
        if not raw.strip():
            return {}
        try:
            return _scopes(files.parse_json(raw, "its text", ValueError))
        except ValueError as e:
            raise PortanetError(f"PORTANET_ROUTES={str(self.path)!r} is not a routes file "
                                f"({e}): give another path, or delete it to measure the "
                                f"routes again") from e


def _scopes(data):
    """The {scope: {key: path}} of a routes file's JSON, of this layout or the earlier
    one; ValueError for any other JSON, which is not ours to rewrite."""
    if isinstance(data, dict) and "format" in data:
        if data["format"] != FORMAT:
            raise ValueError(f"its format is {data['format']!r}, and this portanet reads "
                             f"{FORMAT!r}")
        if set(data) != {"format", "scopes"}:
            raise ValueError(f"it holds {sorted(set(data) - {'format', 'scopes'})} beside "
                             f"the routes")
        every, key_is = data["scopes"], lambda k: True
    else:     # the earlier layout: scope digests alone, each of repr()s of tuples
        every = data
        if not isinstance(every, dict) or not every or \
                not all(isinstance(s, str) and _SCOPE.fullmatch(s) for s in every):
            raise ValueError("it is not an object of scopes")
        key_is = lambda k: k.startswith("(") and k.endswith(")")   # noqa: E731
    if not isinstance(every, dict) or not all(
            isinstance(routes, dict) and all(
                isinstance(k, str) and key_is(k) and isinstance(p, str)
                for k, p in routes.items())
            for routes in every.values()):
        raise ValueError("its scopes are not objects of routes (text to text)")
    return every


def scope(*parts):
    """A scope's name: a digest of what routes depend on."""
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:24]


def code_id():
    """A digest of the backends' code (every module under backends/) and the tuning
    module: what the paths are and how routing chooses among them."""
    backends = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    modules = sorted(backends.rglob("*.py"), key=lambda p: p.relative_to(backends).as_posix())
    for module in modules + [backends.parent / "tuning.py"]:
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
