"""`portanet tune`: our GEMM kernel's tile parameters measured per device, and the database
that keeps them (CLBlast's tuner database, tinygrad's BEAM cache, for portanet).

The search. GEMM_SPACE (backends/gemm/tiling.py) holds thousands of tilings that fit a device's
limits (3608 of its 8748 fitted PoCL's when this was written), and a first build of one
takes from 0.2 s (Intel's CPU runtime) to 4 s (PoCL), each transpose another build: too
many to try all. So the search is seeded and bounded, coordinate descent from the
device's current tiling: one parameter at a time over its values, keeping a change where
it is faster, two passes, only tilings `gemm_fits` allows, at most `budget` of them
measured. A move that does not fit alone is tried with the one other change that makes it
fit (`_fitting`): some parameters only move together, and on PoCL such a pair (MICRO 2
with PAD 4) led to a tiling four times as fast as the default. A search per size class
(SIZES: 4096, 2048 and 1024 on GPUs), largest first; a smaller size starts from the larger
one's winner and the ladder of tilings below it (`_halved`). Where timings are noisy (a
CPU shared with other work) the path follows the noise: another run on the same PoCL
stopped at 1.4 times the default. Each candidate is built, checked and timed on one
square product c <- a b of normal random float32 inputs (of each size in SIZES):

    error    ||c - c64||_F / ||c64||_F against float64 NumPy; over ERROR_BOUND is rejected
    time     median of several synchronized samples after a warm-up (timing.measure)
    GFLOP/s  2 m n k / time

The fastest is then checked and timed on the transposed products a b^T and a^T b (other
builds of the kernel); should one of those be wrong the next fastest is taken.

CLBlast sums K in one pass: on uniform [0, 1) inputs, where nothing cancels, its error
grows with K (on PoCL: 4.2e-7 at K = 1024, 2.4e-6 at 32768); cuBLAS held 1.6e-7 up to
262144 on an H100. vendor_k is the longest K of VENDOR_KS whose 64 x 64 x K product stays
within VENDOR_BOUND, and the backends split longer products into K chunks accumulated in c.

The database (portanet/backends/gemm/tuned.py reads it, checks its entries and applies a
device's as the backend is made): `save` merges a search's result into the user's file
under a lock, `check_output` refuses before a search a file it could not rewrite.
"""
import contextlib
import json
import os
import time
from pathlib import Path

import numpy as np

from . import files
from .backends.gemm import tuned
from .backends.gemm.tiling import GEMM_DEFAULTS, GEMM_SPACE
from .backends.gemm.tuned import VERSION, capped, device_key, params_text
from .errors import DeviceError, KernelBuildError, PortanetError


# normwise relative error a candidate may have on normal random inputs (the tests' F32)
ERROR_BOUND = 1e-5
# the vendor's on uniform [0, 1) inputs: half of the 1e-6 that tests hold every GEMM path
# to, so that a product split in chunks of vendor_k stays within it
VENDOR_BOUND = 5e-7
VENDOR_KS = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144)
VENDOR_MN = 64                  # m = n of the vendor's accuracy products
UNSPLIT = 1 << 30               # vendor_k while measuring: no product is split
VENDOR_NAMES = {"opencl": "CLBlast", "cuda": "cuBLAS"}

# (GPU, CPU): m = n = k of the tuning products, a search each, and candidates measured per
# search. PoCL compiles a tiling for four seconds (each transpose is another build), so a
# CPU gets fewer. On an H100 the tiling fastest at 4096^3 ran 1024^3 at 24 TFLOP/s where
# another did 30: a GPU's outputs of a million elements leave most tiles' worth of
# compute units idle.
SIZES = {True: (4096, 2048, 1024), False: (256,)}
BUDGET = {True: 60, False: 16}
PASSES = 2
# a move that does not fit is tried with one other parameter changed too, the first that
# makes it fit, in this order (then GEMM_SPACE's others): padding and depth first, the
# tile's shape last
REPAIRS = ("PAD", "TSK", "VW", "DB", "WPTM", "WPTN", "TSM", "TSN", "MICRO")
VERIFIED = 4                    # fastest tilings tried on NT and TN before giving up
# --quick (the tests): three candidates on a product no tile divides
QUICK_SIZE, QUICK_BUDGET = 67, 3
SAMPLES, QUICK_SAMPLES = 7, 3
SAMPLE_S = 0.02                 # calls per sample: enough for this long on the host clock


def save(result, path=None):
    """Merge `result`'s entry (see `entry`) into the database at path (default: the
    user's), keeping every other device's: written by portanet's one writer rule
    (files.write_text: atomically, its mode kept, through a symlink), under a lock on its
    folder so that two tuners do not lose each other's entries. Only a tuning database of
    this version is rewritten: anything else at path is refused (PortanetError), as
    `check_output` refuses it before a search. Returns the Path."""
    path = Path(path) if path is not None else tuned.user_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise PortanetError(f"cannot save GEMM tuning to {path}: cannot create "
                            f"{path.parent} ({e.strerror or e})") from e
    with _folder_lock(Path(os.path.realpath(path)).parent):   # where the new file is made
        data = _for_merge(path)
        data["entries"][result["key"]] = entry(result)
        files.write_text(path, json.dumps(data, indent=1, sort_keys=True) + "\n", _WHAT)
    tuned.forget(path)
    return path


def check_output(path=None):
    """Before a search, that its result can be saved to `path` (default: the user's
    database): a regular file or nothing there, in a folder that can be written, and
    where there is a file, a tuning database of this version. Raises PortanetError naming
    the file and the fix, rather than after the search. Returns the Path."""
    path = Path(path) if path is not None else tuned.user_path()
    _for_merge(path)
    return path


def user_path():
    """The user's database, where `save` writes by default (backends/gemm/tuned.py's)."""
    return tuned.user_path()


_WHAT = "the GEMM tuning database"


def _for_merge(path):
    """The database at path as a dict to add to: a new one where there is none. Anything
    but a database of this version is refused, never rewritten or moved: a file of another
    version, a foreign JSON, text that is not JSON or nested deeper than portanet reads."""
    files.check_destination(path, _WHAT)        # a regular file or none: nothing else is read
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return {"version": VERSION, "entries": {}}
    except OSError as e:
        data, problem = None, f"it cannot be read ({e.strerror or e})"
    else:
        data, problem = tuned.parsed(text)
    if problem:
        raise PortanetError(f"will not write {_WHAT} {path}: {problem}; give another file "
                            f"(portanet tune --output), or remove this one")
    return data


@contextlib.contextmanager
def _folder_lock(folder):
    """An exclusive flock on the folder itself (no lock file left beside the database);
    nothing where the system has no flock."""
    try:
        import fcntl
        fd = os.open(folder, os.O_RDONLY)
    except (ImportError, OSError):
        yield
        return
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)        # releases the lock


def entry(result):
    """The database entry of a `tune` result."""
    g = result["gflops"]
    return {"params": dict(result["params"]), "vendor_k": result["vendor_k"],
            "gflops": {**_entry_gflops(g), **({"vendor": g["vendor"]} if g.get("vendor") else {})},
            "size": result["size"], "date": result["date"], "portanet": result["portanet"],
            "sizes": {str(part["size"]): {"params": dict(part["params"]),
                                          "gflops": _entry_gflops(part["gflops"])}
                      for part in result.get("sizes", [result])}}


def _entry_gflops(g):
    return {"tuned": g["tuned"], "default": g["default"], "NT": g["NT"], "TN": g["TN"]}


# -- the search --------------------------------------------------------------------------

def check_tunable(bk):
    """Refuse what has no GEMM kernel of ours to tune, or whose timings mean nothing."""
    if bk.kind == "cpu":
        raise DeviceError(f"{bk.name} is the NumPy reference: it runs no kernel of "
                          f"portanet's, so there is nothing to tune; tune an OpenCL or CUDA "
                          f"device (`portanet devices` lists them)")
    if bk.simulator:
        raise DeviceError(f"{bk.name} ({bk.info()['name']}) is a simulator that checks "
                          f"kernels, thousands of times slower than a device: its timings "
                          f"would tune nothing; tune a real device (`portanet devices`)")
    if capped(bk):
        raise DeviceError(f"{bk.name} is held to the limits {capped(bk)!r} "
                          f"(PORTANET_CL_LIMITS), standing in for another device: tune the "
                          f"device itself, with PORTANET_CL_LIMITS unset")
    if bk.dtype != np.float32:
        raise DeviceError(f"tune {bk.name} in float32 (portanet.device({bk.name!r})): the "
                          f"database keeps float32 tilings, and float64 backends use them")


def tune(bk, budget=None, size=None, quick=False, progress=None):
    """Search bk's GEMM tilings (see the module's docstring) for each size class and
    measure its vendor GEMM; returns a JSON-able dict: key, device, budget, sizes (one
    search per size, largest first: size, default and start (tilings, every parameter),
    params (the winner), candidates (each measured: params, trans, gflops, seconds, error,
    status "ok", "rejected: ...", "build failed: ..." or "failed: ..."), checks (the
    transposed products of the winner and the default), gflops {default, tuned, NT, TN,
    default_NT, default_TN}, errors, evaluated, build_failures, exhausted (the budget ended
    the search)), the largest size's search also at the top level (size, params, gflops
    with the vendor's beside them, ...), vendor_k, vendor_errors {K: error}, seconds, date,
    portanet.

    budget: candidates measured at most per size (default 60 on GPUs, 16 on CPUs); size:
    m = n = k of the products, one or several (1024, 2048 and 4096 on GPUs, 256 on CPUs);
    quick: 3 candidates of 67^3 and fewer samples. progress(line) is called with each
    search's header and each row as it is measured. bk is left as it was: its tilings, GEMM
    path and vendor_k (apply() takes a saved result up)."""
    from . import __version__
    check_tunable(bk)
    start_time = time.perf_counter()
    budget = budget or (QUICK_BUDGET if quick else BUDGET[bool(bk.is_gpu)])
    sizes = size or ((QUICK_SIZE,) if quick else SIZES[bool(bk.is_gpu)])
    sizes = sorted({int(n) for n in ((sizes,) if isinstance(sizes, int) else sizes)},
                   reverse=True)
    progress = progress or (lambda line: None)
    info = bk.info()
    saved = (bk.gemm_path, dict(bk.gemm_params), dict(bk.gemm_sizes),
             getattr(bk, "vendor_k", None), hasattr(bk, "vendor_k"))
    result = {"key": device_key(bk), "device": bk.name, "kind": bk.kind,
              "name": info["name"], "platform": info.get("platform"),
              "driver": info.get("driver"), "budget": budget, "sizes": []}
    rng = np.random.default_rng(0)
    units = bk.compute_units
    start = dict(saved[2].get(sizes[0], saved[1]))
    vendor, vendor_k, vendor_errors = {}, None, {}
    try:
        bk.gemm_path = "own"
        # one compute unit as far as _gemm_own knows: each candidate runs as itself, never
        # stepped down its ladder of smaller tilings nor split in K
        bk.compute_units = 1
        for n in sizes:
            ops = _Operands(bk, n, rng)
            try:
                part = _tune_size(bk, ops, n, budget, start, quick, result, progress)
                start = part["params"]          # where the next, smaller size starts
                if n == sizes[0] and bk.vendor_gemm:
                    try:
                        vendor_k, vendor_errors = vendor_accuracy(bk, rng)
                        bk.vendor_k = vendor_k
                    except Exception as e:      # shown, not fatal: our kernel is tuned
                        vendor = {"status": f"failed: {type(e).__name__}: {_first_line(e)}"}
                    else:
                        vendor = _vendor_speed(bk, ops, QUICK_SAMPLES if quick else SAMPLES,
                                               quick)
            finally:
                ops.free()
    finally:
        bk.compute_units = units
        bk.gemm_path = saved[0]
        bk.set_gemm_params(saved[1], saved[2])
        if saved[4]:
            bk.vendor_k = saved[3]
        elif hasattr(bk, "vendor_k"):
            del bk.vendor_k
    largest = result["sizes"][0]
    result.update(largest, gflops=dict(largest["gflops"], vendor=vendor.get("gflops")),
                  vendor=vendor or None, vendor_k=vendor_k, vendor_errors=vendor_errors,
                  seconds=time.perf_counter() - start_time,
                  date=time.strftime("%Y-%m-%dT%H:%M:%S%z"), portanet=__version__)
    return result


def _tune_size(bk, ops, size, budget, start, quick, result, progress):
    """One search (see tune) on size^3 products, from the device's default, `start` and,
    below the largest size, the ladder of tilings under start (smaller outputs want
    smaller tiles); appended to result["sizes"] and returned."""
    samples = QUICK_SAMPLES if quick else SAMPLES
    default = {**GEMM_DEFAULTS, **bk.gemm_default}
    start = {**GEMM_DEFAULTS, **start}
    seeds = [p for p, _ in bk._tilings(start)[1:]] if result["sizes"] else []
    part = {"size": size, "default": default, "start": start, "candidates": [], "checks": []}
    progress(header(result, part))

    def evaluate(params, trans="NN"):
        rec = _evaluate(bk, ops, params, trans, samples, quick)
        if trans == "NN":
            rec["n"] = len(part["candidates"]) + 1
            part["candidates"].append(rec)
            progress(row(rec, default))
        else:
            part["checks"].append(rec)
        return rec

    _, exhausted = _search(bk, evaluate, default, start, budget, seeds)
    winner, nt, tn = _verify(evaluate, part["candidates"])
    by_params = {_frozen(r["params"]): r for r in part["candidates"]}
    default_nn = by_params.get(_frozen(default), {})
    if _frozen(winner["params"]) == _frozen(default):
        default_nt, default_tn = nt, tn
    else:
        default_nt, default_tn = evaluate(default, "NT"), evaluate(default, "TN")
    part.update(
        params=winner["params"],
        gflops={"tuned": winner["gflops"], "NT": nt["gflops"], "TN": tn["gflops"],
                "default": default_nn.get("gflops"), "default_NT": default_nt.get("gflops"),
                "default_TN": default_tn.get("gflops")},
        errors={"NN": winner["error"], "NT": nt["error"], "TN": tn["error"]},
        evaluated=len(part["candidates"]),
        build_failures=sum(r["status"].startswith("build failed")
                           for r in part["candidates"] + part["checks"]),
        exhausted=exhausted)
    result["sizes"].append(part)
    return part


def _search(bk, evaluate, default, start, budget, seeds=()):
    """Coordinate descent from the fastest of the default, `start` and `seeds`, measured in
    that order (each once): (the fastest record, whether the budget stopped it). The best
    is always the fastest measured so far, so the winner is never slower than the default
    in the table."""
    seen = {}

    def measured(params):
        key = _frozen(params)
        if key not in seen:
            if len(seen) >= budget:
                return None
            seen[key] = evaluate(params)
        return seen[key]

    best = None
    for params in [default, start, *seeds]:
        rec = measured(params)
        if rec is not None and rec["status"] == "ok" and (
                best is None or rec["seconds"] < best["seconds"]):
            best = rec
    if best is None:
        raise PortanetError(f"our GEMM kernel fails on {bk.name} with its tiling: " + "; ".join(
            f"{params_text(r['params'])}: {r['status']}" for r in seen.values())
            + "; nothing to tune from (a bug in portanet: please report it with this message)")
    for _ in range(PASSES):
        before = best
        for name, values in GEMM_SPACE.items():
            for value in values:
                if value == best["params"].get(name):
                    continue
                params = _fitting({**best["params"], name: value}, name, bk.gemm_fits)
                if params is None:
                    continue
                rec = measured(params)
                if rec is None:
                    return best, True
                if rec["status"] == "ok" and rec["seconds"] < best["seconds"]:
                    best = rec
        if best is before:
            break                       # a pass without a change: the next finds none
    return best, False


def _fitting(params, moved, fits):
    """params where they fit; else params with one other parameter changed, the first
    of REPAIRS that makes them fit; else None. Some moves only fit together: MICRO 1 needs
    PAD a multiple of 4 (the defaults' is 1), and VW 4 needs TSM TSK and TSN TSK to be
    multiples of 4 loads per work-item (after PoCL's TSM 32 -> 64, TSK 8 -> 16 too)."""
    if fits(params):
        return params
    order = [n for n in REPAIRS if n in GEMM_SPACE] + [n for n in GEMM_SPACE if n not in REPAIRS]
    for name in order:
        if name != moved:
            for value in GEMM_SPACE[name]:
                repaired = {**params, name: value}
                if value != params.get(name) and fits(repaired):
                    return repaired
    return None


def _verify(evaluate, candidates):
    """(winner, its NT, its TN): the fastest tiling whose transposed products are right
    too (each is another build of the kernel), of the VERIFIED fastest."""
    ranked = sorted((r for r in candidates if r["status"] == "ok"), key=lambda r: r["seconds"])
    for rec in ranked[:VERIFIED]:
        nt = evaluate(rec["params"], "NT")
        tn = evaluate(rec["params"], "TN") if nt["status"] == "ok" else nt
        if nt["status"] == "ok" and tn["status"] == "ok":
            return rec, nt, tn
        wrong = "NT" if nt["status"] != "ok" else "TN"
        rec["status"] = f"rejected: {wrong} {(nt if wrong == 'NT' else tn)['status']}"
    raise PortanetError(f"none of the {len(ranked[:VERIFIED])} fastest GEMM tilings computes "
                        f"the transposed products right: " + "; ".join(
                            f"{params_text(r['params'])}: {r['status']}"
                            for r in ranked[:VERIFIED]) + " (a bug in portanet: please "
                        "report it with this message)")


def _evaluate(bk, ops, params, trans, samples, quick):
    """One candidate on one product: built (by its first call), checked, timed."""
    rec = {"params": dict(params), "trans": trans, "gflops": None, "seconds": None,
           "error": None, "status": "ok"}
    try:
        bk.set_gemm_params(params)
        rec["error"] = err = ops.check(trans)
        if not err <= ERROR_BOUND:              # NaN too: an element left unwritten
            rec["status"] = f"rejected: error {err:.1e} > {ERROR_BOUND:.0e}"
            return rec
        rec.update(ops.time(trans, samples, quick))
    except KernelBuildError as e:
        rec["status"] = f"build failed: {_first_line(e)}"
        rec["message"] = str(e)[:4000]
    except Exception as e:          # a candidate's failure, recorded
        rec["status"] = f"failed: {type(e).__name__}: {_first_line(e)}"
        rec["message"] = str(e)[:4000]
    return rec


def _vendor_speed(bk, ops, samples, quick):
    """The vendor GEMM on the tuning product (NN), for comparison: gflops, error."""
    bk.gemm_path = "vendor"
    try:
        err = ops.check("NN")
        return {"error": err, **ops.time("NN", samples, quick)}
    except Exception as e:          # shown, not fatal: ours was tuned
        return {"status": f"failed: {type(e).__name__}: {_first_line(e)}"}
    finally:
        bk.gemm_path = "own"


def vendor_accuracy(bk, rng=None):
    """(vendor_k, {K: error}): the vendor GEMM's normwise relative error on 64 x 64 x K
    products of uniform [0, 1) float32 inputs against float64, for K in VENDOR_KS with no
    product split, up to the first whose error is over VENDOR_BOUND (longer sums err
    more); vendor_k is the longest K up to which every error is within the bound, at least
    the first of VENDOR_KS. bk's GEMM path and vendor_k are put back."""
    rng = rng or np.random.default_rng(0)
    saved = (bk.gemm_path, getattr(bk, "vendor_k", None), hasattr(bk, "vendor_k"))
    errors, vendor_k = {}, VENDOR_KS[0]
    bk.gemm_path, bk.vendor_k = "vendor", UNSPLIT
    try:
        for k in VENDOR_KS:
            a_host = rng.random((VENDOR_MN, k), dtype=np.float32)
            b_host = rng.random((k, VENDOR_MN), dtype=np.float32)
            arrays = [bk.upload(a_host), bk.upload(b_host), bk.empty((VENDOR_MN, VENDOR_MN))]
            try:
                bk.gemm(1.0, arrays[0], arrays[1], 0.0, arrays[2])
                c = bk.download(arrays[2])
            finally:
                for x in arrays:
                    bk.free(x)
            errors[k] = _rel_err(c, a_host.astype(np.float64) @ b_host)
            if errors[k] > VENDOR_BOUND:
                break
            vendor_k = k
    finally:
        bk.gemm_path = saved[0]
        if saved[2]:
            bk.vendor_k = saved[1]
        else:
            del bk.vendor_k
    return vendor_k, errors


class _Operands:
    """a, b (n x n, normal float32) and c on the device for every candidate; c is filled
    with NaN before each checked call, so an element a kernel leaves unwritten shows.
    The float64 products a b, a b^T, a^T b are made once, when first needed."""

    def __init__(self, bk, n, rng):
        self.bk, self.n, self.rng = bk, n, rng
        self.a_host = rng.standard_normal((n, n), dtype=np.float32)
        self.b_host = rng.standard_normal((n, n), dtype=np.float32)
        self.nan = np.full((n, n), np.nan, np.float32)
        self.arrays, self._refs = [], {}
        try:
            for make in (lambda: bk.upload(self.a_host), lambda: bk.upload(self.b_host),
                         lambda: bk.empty((n, n), label="tuning product")):
                self.arrays.append(make())
        except BaseException:
            self.free()
            raise

    def run(self, trans):
        a, b, c = self.arrays
        self.bk.gemm(1.0, a, b, 0.0, c, trans[0] == "T", trans[1] == "T")

    def check(self, trans):
        self.bk.write(self.arrays[2], self.nan)
        self.run(trans)
        got = self.bk.download(self.arrays[2])
        if trans not in self._refs:
            a, b = self.a_host.astype(np.float64), self.b_host.astype(np.float64)
            self._refs[trans] = (a.T if trans[0] == "T" else a) @ (b.T if trans[1] == "T" else b)
        return _rel_err(got, self._refs[trans])

    def time(self, trans, samples, quick):
        """seconds (median), spread (min, max), calls per sample and GFLOP/s."""
        from .timing import measure
        bk = self.bk
        bk.synchronize()
        begin = time.perf_counter()
        self.run(trans)
        bk.synchronize()
        once = time.perf_counter() - begin
        inner = 1 if quick else max(1, min(50, int(SAMPLE_S / max(once, 1e-6))))
        t = measure(lambda: self.run(trans), bk.synchronize, repeats=samples, inner=inner,
                    warmup=1)
        return {"seconds": t["median_s"], "min_s": t["min_s"], "max_s": t["max_s"],
                "samples": t["repeats"], "inner": inner,
                "gflops": 2 * self.n ** 3 / t["median_s"] / 1e9}

    def free(self):
        for x in self.arrays:
            self.bk.free(x)
        self.arrays = []


def _rel_err(x, ref):
    ref = np.asarray(ref, np.float64)
    return float(np.linalg.norm(np.asarray(x, np.float64) - ref) /
                 max(np.linalg.norm(ref), 1e-30))


def _frozen(params):
    return tuple(sorted(params.items()))


def _first_line(e):
    lines = str(e).strip().splitlines() or [type(e).__name__]
    return lines[0][:160]


# -- the table ---------------------------------------------------------------------------

def header(result, part):
    """A search's first lines: the device, the product, the budget, the columns."""
    where = ", ".join(str(x) for x in (result["platform"], result["driver"]) if x)
    return (f"{result['device']}  {result['name']} ({where}): GEMM {part['size']}^3 NN, "
            f"at most {result['budget']} candidates\n"
            f"{'#':>4s}  {'changed from the default':44s} {'GFLOP/s':>9s} {'error':>9s}")


def row(rec, default):
    """One candidate: what differs from the default, GFLOP/s and error, or why not."""
    changed = params_text(_changes(rec["params"], default)) or "(default)"
    if rec["status"] == "ok":
        tail = f"{rec['gflops']:9.2f} {rec['error']:9.1e}"
    else:
        tail = f"{'-':>9s} {rec['status']}"
    return f"{rec.get('n', ''):>4}  {changed:44s} {tail}"


def summary(result):
    """Default against tuned on NN, NT and TN at each size, the vendor's GEMM, vendor_k."""
    parts = result["sizes"]
    failed = sum(p["build_failures"] for p in parts)
    rejected = sum(r["status"].startswith("rejected") for p in parts for r in p["candidates"])
    ended = [str(p["size"]) for p in parts if p["exhausted"]]
    lines = [f"{result['device']}: {sum(p['evaluated'] for p in parts)} candidates in "
             f"{result['seconds']:.0f} s ({failed} failed to build, {rejected} rejected"
             + (f"; the budget of {result['budget']} ended the search at "
                f"{', '.join(ended)}: --budget searches further" if ended else "") + ")",
             f"{'':17s}{'NN':>9s}{'NT':>9s}{'TN':>9s}  GFLOP/s"]

    def line(label, values, note=""):
        cells = "".join(f"{v:9.2f}" if v is not None else f"{'-':>9s}" for v in values)
        return f"  {label:15s}{cells}  {note}".rstrip()
    for part in parts:
        g, n = part["gflops"], part["size"]
        lines.append(line(f"{n}^3 default", (g["default"], g["default_NT"], g["default_TN"])))
        gain = (f"{g['tuned'] / g['default'] - 1:+.0%} on NN" if g["default"] and g["tuned"]
                else "")
        lines.append(line(f"{n}^3 tuned", (g["tuned"], g["NT"], g["TN"]), gain))
    vendor = result.get("vendor")
    if vendor:
        name = VENDOR_NAMES.get(result["kind"], "vendor")
        note = (f"{name}, error {vendor['error']:.1e}" if "error" in vendor
                else f"{name} {vendor.get('status')}")
        lines.append(line(f"{result['size']}^3 vendor", (vendor.get("gflops"), None, None),
                          note))
    for part in parts:
        changes = _changes(part["params"], part["default"])
        tiling = params_text(changes) or "the default"
        lines.append(f"  tuned tiling at {part['size']}^3: {tiling}")
    lines.append(f"  (default {params_text(result['default'])})")
    if result["vendor_k"] is None:
        lines.append("  vendor_k: - (" + ("its measurement failed" if vendor else
                                          "no vendor GEMM here: on OpenCL, pip install 'portanet[clblast]' "
                                          "with Debian's libclblast-dev") + ")")
    else:
        errs = ", ".join(f"{k}: {e:.1e}" for k, e in result["vendor_errors"].items())
        lines.append(f"  vendor_k: {result['vendor_k']} (errors by K, bound "
                     f"{VENDOR_BOUND:.0e}: {errs})")
    return "\n".join(lines)


def table(result):
    """The whole report of one device: each search's header and candidates, the summary."""
    return "\n".join([line for part in result["sizes"] for line in
                      [header(result, part)] + [row(r, part["default"])
                                                for r in part["candidates"]]]
                     + [summary(result)])


def _changes(params, default):
    return {k: v for k, v in params.items() if default.get(k) != v}


