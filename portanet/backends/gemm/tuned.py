"""The GEMM tuning database: what `portanet tune` measured per device (portanet/tuning.py
searches and saves), read, checked and applied to a backend as it is made.

JSON, {"version": 1, "entries": {key: entry}}, keyed by the backend kind, device name,
OpenCL platform, driver version and a digest of the gemm kernel's source (`device_key`),
so a new driver or a changed kernel is untuned rather than mistuned.

    entry = {"params": {...}, "vendor_k": int or null,
             "gflops": {"tuned": ..., "default": ..., "NT": ..., "TN": ...},
             "size": n, "sizes": {"n": {"params": {...}, "gflops": {...}}, ...},
             "date": ..., "portanet": version}

params and gflops are the largest size's; sizes holds every size's tiling, which the
backend takes for outputs of about n x n (`set_gemm_params(params, sizes)`; an entry
without sizes, params for every size). vendor_k: the longest K a vendor GEMM call sums
(longer products are split in K chunks accumulated in c).

Two files: portanet/tuned.json, shipped with the package (read-only), and the user's,
config.cache_dir() / "tuning.json", whose entry wins. Both are read once per process.
A float64 backend takes its device's entry too: the tilings are the same kernel's, and
`gemm_fits` is checked before one is used (also under a PORTANET_CL_LIMITS cap).
"""
import functools
import hashlib
import itertools
import logging
import math
from pathlib import Path

from ... import config, files
from ...errors import PortanetError
from .. import sources
from .tiling import GEMM_DEFAULTS, GEMM_SPACE, _halved, gemm_fits

log = logging.getLogger("portanet")

VERSION = 1
SHIPPED = Path(__file__).resolve().parents[2] / "tuned.json"
USER_FILE = "tuning.json"

_databases = {}                 # path -> {key: entry}: each file read once per process
_announced = set()              # device keys whose "no tuned parameters" was logged


def user_path():
    """The user's database: $XDG_CACHE_HOME/portanet/tuning.json (else ~/.cache/...)."""
    return config.cache_dir() / USER_FILE


@functools.lru_cache(maxsize=None)
def kernel_hash(lang):
    """The first 12 hex digits of the sha256 of the gemm kernel's source ("cl", "cu"),
    its prelude inlined: part of every key, so an edited kernel is untuned."""
    return hashlib.sha256(sources.load("gemm", lang)[1].encode()).hexdigest()[:12]


def device_key(bk):
    """'opencl | pthread-AMD EPYC | Portable Computing Language | 6.0 | gemm 0123456789ab':
    kind, device name, platform (OpenCL only), driver version and kernel_hash."""
    info = bk.info()
    parts = [bk.kind, info["name"], info.get("platform"), info.get("driver"),
             f"gemm {kernel_hash(bk.lang)}"]
    return " | ".join(str(p).strip() for p in parts if p is not None)


def lookup(bk):
    """This device's entry (a dict, see the module's docstring), or None: the user's
    database first, then the one shipped with portanet."""
    key = device_key(bk)
    for path in (user_path(), SHIPPED):
        entry = _entries(path).get(key)
        if entry is not None:
            return entry
    return None


def apply(bk):
    """Use this device's tuned GEMM parameters and vendor_k where the database has them:
    True. Where it has none, or PORTANET_TUNING is off, False, and on a GPU without an
    entry one info line per process and device saying how to tune it. A device held to
    lower limits (PORTANET_CL_LIMITS) stands in for another class of device, whose tilings
    it is there to run: it keeps them. Raises only for a PORTANET_TUNING it does not
    understand: a backend calls it as it is made, and a bad database must not keep a
    device from working (it is warned about)."""
    if bk.kind == "cpu" or bk.simulator or capped(bk) or not config.tuning():
        return False
    try:
        key = device_key(bk)
        entry = lookup(bk)
    except Exception as e:      # see the docstring
        log.warning("could not look up tuned GEMM parameters for %s: %s: %s", bk.name,
                    type(e).__name__, e)
        return False
    if entry is None:
        if bk.is_gpu and key not in _announced:
            _announced.add(key)
            info = bk.info()
            log.info("no tuned GEMM parameters for %s (%s): run `portanet tune --device %s` "
                     "(defaults from its limits)", info["name"], info.get("driver"), bk.name)
        return False
    params = entry["params"]
    sizes = {int(n): e["params"] for n, e in entry.get("sizes", {}).items()}
    unfit = [p for p in [params, *sizes.values()] if not bk.gemm_fits(p)]
    if unfit:
        log.debug("%s: tuned GEMM parameters %s do not fit under limits %s; kept %s",
                  bk.name, unfit, getattr(bk, "gemm_limits", None), bk.gemm_params)
    else:
        bk.set_gemm_params(params, sizes)
    if entry.get("vendor_k") is not None:
        bk.vendor_k = int(entry["vendor_k"])
    return True


def capped(bk):
    """The PORTANET_CL_LIMITS profile or caps bk is held to, or None for its own limits."""
    profile = getattr(getattr(bk, "limits", None), "profile", "device")
    return None if profile == "device" else profile


def forget(path=None):
    """Drop what was read of the database files, or of the one at path (they are read
    again when next needed)."""
    if path is not None:
        _databases.pop(str(path), None)
        return
    _databases.clear()
    _announced.clear()


def _entries(path):
    path = str(path)
    if path not in _databases:
        _databases[path] = _read(Path(path))
    return _databases[path]


def _read(path):
    """{key: entry} of a database file: {} where there is none, and, with a warning, where
    it cannot be read or is not a database; an entry that is not one is left out, warned
    with the file, the entry and the reason."""
    try:
        text = files.read_bytes(path, "the GEMM tuning database").decode("utf-8")
    except FileNotFoundError:
        return {}
    except PortanetError as e:          # a folder, a FIFO (which would block the reading)
        log.warning("ignoring the GEMM tuning database %s: %s", path, e)
        return {}
    except (OSError, UnicodeDecodeError) as e:
        log.warning("ignoring the GEMM tuning database %s: cannot read it (%s)", path, e)
        return {}
    data, problem = parsed(text)
    if problem:
        log.warning("ignoring the GEMM tuning database %s: %s; remove it (`portanet tune` "
                    "writes a new one)", path, problem)
        return {}
    entries = {}
    for key, entry in data["entries"].items():
        problem = _entry_problem(entry)
        if problem:
            log.warning("%s: ignoring the entry %r: %s; `portanet tune` on that device "
                        "writes a new one", path, key, problem)
        else:
            entries[key] = entry
    return entries


def parsed(text):
    """(the database, None) where text is one of this version, else (None, what it is)."""
    try:
        data = files.parse_json(text, "it")          # its nesting bounded first
    except PortanetError as e:
        return None, str(e)
    problem = _database_problem(data)
    return (None, problem) if problem else (data, None)


def _database_problem(data):
    if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
        return 'it is not a portanet tuning database ({"version": 1, "entries": {...}})'
    if data.get("version") != VERSION:
        return (f"it is of version {data.get('version')!r}, this portanet reads version "
                f"{VERSION}")
    return None


def _entry_problem(entry):
    if not isinstance(entry, dict):
        return "not an object"
    problem = _params_problem(entry.get("params"))
    if problem:
        return problem
    sizes = entry.get("sizes", {})
    if not isinstance(sizes, dict) or not all(
            isinstance(n, str) and n.isdigit() and int(n) > 0 and isinstance(e, dict)
            and "params" in e for n, e in sizes.items()):
        return 'sizes is not an object of {"n": {"params": {...}}}'
    for n, e in sizes.items():
        problem = _params_problem(e["params"])
        if problem:
            return f"sizes[{n!r}]: {problem}"
    k = entry.get("vendor_k")
    if k is not None and (not isinstance(k, int) or isinstance(k, bool) or k < 1):
        return "vendor_k is not a whole number >= 1 or null"
    return None


def _params_problem(params):
    """Why params cannot be a tiling the search gave, or None. Its names and values become
    the GEMM kernel's build options and the divisors of its launch sizes, so an entry
    holds what the search itself is held to: parameters of GEMM_SPACE, each a value the
    search measures (`tuned_values`), consistent with each other as `gemm_fits` requires
    on every device (whether the tiling fits this device's limits is apply's to check)."""
    if not isinstance(params, dict) or not params:
        return "params is not an object of whole numbers"
    allowed = tuned_values()
    for name, value in params.items():
        if name not in allowed:
            return (f"params has {name!r}, which is not a parameter of the GEMM kernel "
                    f"({', '.join(allowed)})")
        if not isinstance(value, int) or isinstance(value, bool):
            return f"params {name}={value!r} is not a whole number"
        if value not in allowed[name]:
            return (f"params {name}={value} is not a value tuning gives "
                    f"({', '.join(map(str, allowed[name]))})")
    if not gemm_fits({**GEMM_DEFAULTS, **params}, math.inf, math.inf):
        return (f"params {params_text(params)} is not a tiling the GEMM kernel builds "
                f"(gemm_fits: the work per item divides the tile, the loads divide among the "
                f"work-items, MICRO's 4-wide runs are aligned...)")
    return None


@functools.lru_cache(maxsize=None)
def tuned_values():
    """{parameter: sorted values} a tuned tiling may hold: what the search moves through
    (GEMM_SPACE, whose values every device class's default tiling takes too) and the
    ladder of smaller tilings below each tile (`_halved`), which seeds a smaller size's
    search (the tile's sides go down to 16 there)."""
    values = {name: set(choices) for name, choices in GEMM_SPACE.items()}
    for m, n, wm, wn in itertools.product(*(GEMM_SPACE[k] for k in ("TSM", "TSN", "WPTM",
                                                                     "WPTN"))):
        p = dict(GEMM_DEFAULTS, TSM=m, TSN=n, WPTM=wm, WPTN=wn)
        while p is not None:
            for name in values:
                values[name].add(p[name])
            p = _halved(p)
    return {name: tuple(sorted(v)) for name, v in values.items()}


def params_text(params):
    return " ".join(f"{k}={v}" for k, v in params.items())
