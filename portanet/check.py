"""`portanet devices --check`: does each device build portanet's kernels and compute what
the NumPy reference computes? (tinygrad's `python -m tinygrad.device`, for portanet.)

Per device, three checks, each on fresh random inputs from a fixed seed:

    build   every kernel family compiles (KernelBackend.build_all); the cpu has none
    gemm    c <- alpha a^T b^T + beta c of an odd shape, on the path the device routes it
            to, against float64 NumPy; then with beta = 0 into a NaN-filled c (every
            element written, c not read)
    step    one LeNet training step from the cpu's initial weights on the same batch;
            every parameter afterwards against the cpu's; then the step's time
    precisions  the gemm check again in each other precision the device lists (tf32, bf16, fp16),
            against the product of the inputs rounded as that precision rounds them

and on a simulator (Oclgrind) whatever it reported meanwhile (out-of-bounds accesses, data
races, uninitialised reads) fails the device; so does a simulator opened before its checks
were on (by other code in the process), which checked nothing.

The shapes are small on purpose: the checks are about right answers, not speed (that is
`portanet bench`), and they must finish on the Oclgrind simulator, which with its checks
on runs about 30 thousand multiply-adds a second: the whole check takes it about two
minutes of a core.
"""
import dataclasses
import logging
import statistics
import time

import numpy as np

from . import backends, models
from .backends import opencl
from .errors import DeviceError, KernelBuildError, PortanetError
from .optim import SGD
from .precision import round_to

say = logging.getLogger("portanet")     # what a check is doing, before each silent phase

# gemm: m x n x k, no side a multiple of a tile (8, 16, 32, 64, 128) or of a vector width,
# several tiles along m and n of every tiling but the largest; k = 257 is over 16 slabs of
# 16, so a large GPU splits K (gpu.split_k) too. Oclgrind with its checks on takes 45 s of
# a core over the two (67 x 131 x 257: minutes).
GEMM_SHAPE = (37, 67, 257)
GEMM_ALPHA, GEMM_BETA = -0.7, 0.3
# float32 kernels against float64, relative to || |alpha| |a| |b| + |beta| |c| || (what the
# rounding is relative to): the tests' F32. Measured 2.9e-8 on NumPy, PoCL, Intel's OpenCL
# and Oclgrind; alpha wrong by 1e-3 shows as 1e-4 (tests/test_check.py).
GEMM_TOLERANCE = 1e-5

# step: LeNet (conv 16 3x3 relu, conv 32 3x3 relu, maxpool 2, dense 10 softmax) on images
# of 9 x 9, so that the pool drops an edge row and column (5 x 5 -> 2 x 2), in a batch of 2:
# 25 s of a core a step on Oclgrind with its checks on (16 images of 28 x 28: many minutes)
STEP_IMAGE = (1, 9, 9)
STEP_BATCH = 2
STEP_SGD = SGD(lr=0.1, momentum=0.9)
# Each parameter after the step against the cpu's, relative to the size of the cpu's
# update || w1_cpu - w0 ||: the weights move by 2 to 7 % in the step, so an error relative
# to the weights themselves would hide a wrong gradient under the unchanged bulk. Both
# sides are float32: the floor is the rounding of w1 (eps32 ||w|| / ||dw||, about 1e-6) and
# of the gradient sums. Measured: NumPy float32 against float64 at most 1.2e-6 (seeds
# 0-4); PoCL, Intel's OpenCL and Oclgrind against the cpu at most 1.3e-6. 1e-4 leaves a
# factor of 75 for other drivers' rounding (fused multiply-adds, other summation orders);
# relu's output wrong by 1e-3 shows as 3.8e-3 (tests/test_check.py).
STEP_TOLERANCE = 1e-4
STEP_REPEATS = 5                # timed steps after the compared one ...
STEP_BUDGET_S = 5.0             # ... but three once they take this long (a slow device),
# and two on a simulator, whose times say nothing of a device: the step recorded and one
# replay of it, so that its checks see the replayed launches too


@dataclasses.dataclass
class Result:
    """What `check_device` found on one device. build_s is None on the cpu (no kernels)
    and wherever the check did not get that far; so are the errors and step_ms."""
    device: str                 # the device string as given
    description: str = ""
    build_s: float = None
    gemm_path: str = None       # "reference", "own", "vendor", "auto -> own", ...
    gemm_error: float = None    # relative, see GEMM_TOLERANCE
    step_error: float = None    # relative, see STEP_TOLERANCE
    step_ms: float = None
    precision_errors: dict = dataclasses.field(default_factory=dict)  # gemm's error in each
    failures: list = dataclasses.field(default_factory=list)   # "check: what, by how much"

    @property
    def passed(self):
        return not self.failures


def targets(specs=()):
    """[(device string, description)]: the devices given, or every device
    backends.list_devices() finds (cpu included). A string that names a listed device
    another way (opencl:pocl) gets that device's description; one that names none gets
    an empty one (check_device reports why). The simulator's checks are turned on first:
    naming a device another way opens it, and Oclgrind reads them as it is opened."""
    opencl.simulator_checks()
    found, _ = backends.list_devices()
    if not specs:
        return found
    known = dict(found)
    return [(spec, known.get(spec) or known.get(_canonical(spec), "")) for spec in specs]


def _canonical(spec):
    """The string list_devices gives the device `spec` names (opening it, which is cheap:
    kernels are built on first use), or None where it names none."""
    try:
        return backends.device(spec).name
    except DeviceError:
        return None


def check_device(spec, description="", seed=0):
    """Build, gemm and step checks on device `spec` (a device string or a Backend); a
    Result, never an exception for what the device does (a device that cannot be opened
    is a failed Result too)."""
    result = Result(getattr(spec, "name", spec), description)
    log = opencl.simulator_checks()
    start = time.perf_counter()
    try:
        bk = backends.device(spec)
    except DeviceError as e:
        cause = e.__cause__ if isinstance(e.__cause__, KernelBuildError) else None
        result.failures.append(f"build: {_first_line(cause)}" if cause else f"open: {e}")
        return result
    if not result.description:
        known = dict(backends.list_devices()[0])
        result.description = known.get(bk.name, bk.info()["name"])
    if bk.simulator and bk.simulator_settings != opencl.simulator_settings():
        result.failures.append(f"simulator: {_unchecked(bk.simulator_settings)}")
    where = result.device
    try:
        if hasattr(bk, "build_all"):
            say.info("%s: building its kernels", where)
            bk.build_all()
            result.build_s = time.perf_counter() - start   # with the context: what a user waits
    except Exception as e:      # noqa: BLE001 - a failing device is reported, not raised
        result.failures.append(f"build: {_describe(e)}")
        return result
    rng = np.random.default_rng(seed)
    report = opencl.SimulatorReport(log)
    if hasattr(bk, "build_all"):        # (the cpu's checks take a moment: nothing said)
        say.info("%s: a GEMM, a LeNet training step and each precision against the NumPy "
                 "reference", where)
    for name, check in (("gemm", _gemm), ("step", _step), ("precisions", _precisions)):
        try:
            check(bk, rng, seed, result)
        except Exception as e:  # noqa: BLE001 - a driver error is this device's failure
            result.failures.append(f"{name}: {_describe(e)}")
    said = report.read() if bk.simulator else ""
    if said:
        result.failures.append(f"simulator: {_first_line(said)} (all in {log})")
    return result


def _unchecked(settings):
    """Why a simulator opened with `settings` checked nothing that the check can read."""
    now = opencl.simulator_settings()
    changed = ", ".join(f"{name} {'unset' if settings[name] is None else repr(settings[name])}"
                        f" then, {'unset' if now[name] is None else repr(now[name])} now"
                        for name in opencl.SIMULATOR_VARIABLES if settings[name] != now[name])
    return (f"opened with other checks than this check sets ({changed}): Oclgrind reads "
            f"them as a device is opened, so this one was not checked as asked; check it in "
            f"a process where nothing opened it before (`portanet devices --check` is one)")


def _gemm(bk, rng, seed, result):
    result.gemm_error = check_gemm(bk, rng)
    result.gemm_path = bk.gemm_path
    route = bk.routes.get((*GEMM_SHAPE, True, True))
    if route:
        result.gemm_path += f" -> {route}"
    if not result.gemm_error <= GEMM_TOLERANCE:         # NaN fails too
        result.failures.append(f"gemm: relative error {result.gemm_error:.2g} "
                               f"> {GEMM_TOLERANCE:g}")


def _step(bk, rng, seed, result):
    result.step_error, worst, result.step_ms = check_step(bk, rng, seed)
    if not result.step_error <= STEP_TOLERANCE:
        result.failures.append(f"step: parameter {worst} differs from the cpu's by "
                               f"{result.step_error:.2g} of its update > {STEP_TOLERANCE:g}")


def _precisions(bk, rng, seed, result):
    for name in bk.precisions:
        if name != bk.precision:
            error = check_gemm(backends.device(bk.name, bk.dtype, name), rng)
            result.precision_errors[name] = error
            if not error <= GEMM_TOLERANCE:
                result.failures.append(f"gemm in {name}: relative error {error:.2g} "
                                       f"> {GEMM_TOLERANCE:g}")


def check_gemm(bk, rng, shape=None):
    """The larger relative error of two GEMMs of `shape` (m, n, k) with both operands
    transposed: alpha a^T b^T + beta c, then 1.3 a^T b^T into a c filled with NaN (beta = 0:
    c must not be read, and every element must be written). NaN where a result has one.
    The reference's inputs are rounded as the backend's precision rounds them. shape None:
    GEMM_SHAPE."""
    m, n, k = shape or GEMM_SHAPE
    a = rng.standard_normal((k, m)).astype(bk.dtype)        # op(a) = a^T is m x k
    b = rng.standard_normal((n, k)).astype(bk.dtype)        # op(b) = b^T is k x n
    c = rng.standard_normal((m, n)).astype(bk.dtype)
    a64, b64 = (round_to(x, bk.precision).astype(np.float64) for x in (a, b))
    c64 = c.astype(np.float64)                              # what the device holds
    A, B, C = bk.upload(a), bk.upload(b), bk.upload(c)
    errors = []
    try:
        for alpha, beta in ((GEMM_ALPHA, GEMM_BETA), (1.3, 0.0)):
            if beta == 0:
                bk.write(C, np.full((m, n), np.nan, bk.dtype))
            bk.gemm(alpha, A, B, beta, C, trans_a=True, trans_b=True)
            ref = alpha * a64.T @ b64.T + beta * c64
            scale = np.linalg.norm(abs(alpha) * np.abs(a64.T) @ np.abs(b64.T)
                                   + abs(beta) * np.abs(c64))
            errors.append(_rel_err(bk.download(C), ref, scale))
    finally:
        for x in (A, B, C):
            bk.free(x)
    return max(errors)


def check_step(bk, rng, seed=0):
    """(error, parameter, ms): one LeNet training step on `bk` and on the cpu from the cpu's
    initial weights and the same batch; error is the largest over parameters of
    || w_bk - w_cpu || / || w_cpu - w0 || (STEP_TOLERANCE; _update_size), parameter the
    name of that one ("0.w": layer 0's weights); ms the median time of further steps on
    `bk`, the device synchronised before and after each."""
    x = rng.random((STEP_BATCH, *STEP_IMAGE), dtype=np.float32)
    y = rng.integers(0, 10, STEP_BATCH)
    ref = models.lenet(STEP_IMAGE, device="cpu", seed=seed)
    net = models.lenet(STEP_IMAGE, device=bk, seed=seed)
    try:
        w0 = _parameters(ref)
        for name, value in w0.items():              # the same start whatever the seed does
            bk.write(_array(net, name), value)
        ref.train_batch(x, y, STEP_SGD)
        net.train_batch(x, y, STEP_SGD)
        want, got = _parameters(ref), _parameters(net)
        errors = {name: _rel_err(got[name], want[name], _update_size(want[name], w0[name]))
                  for name in w0}
        worst = max(errors, key=lambda name: (np.isnan(errors[name]), errors[name]))
        seconds, spent = [], 0.0
        least = 2 if bk.simulator else 3
        while len(seconds) < STEP_REPEATS and not (len(seconds) >= least
                                                   and spent > STEP_BUDGET_S):
            bk.synchronize()
            start = time.perf_counter()
            net.train_batch(x, y, STEP_SGD)
            bk.synchronize()
            seconds.append(time.perf_counter() - start)
            spent += seconds[-1]
        return errors[worst], worst, 1e3 * statistics.median(seconds)
    finally:
        net.free()
        ref.free()


def _update_size(w1, w0):
    """|| w1 - w0 ||, plus the rounding of w1 to float32 (eps32 || w1 ||), so that a
    parameter the step leaves (all but) unchanged is not held to a tolerance of nothing."""
    w1 = w1.astype(np.float64)
    return np.linalg.norm(w1 - w0) + np.finfo(np.float32).eps * np.linalg.norm(w1)


def _parameters(net):
    """{"i.name": host copy} of every parameter of net."""
    return {f"{i}.{name}": net.backend.download(x)
            for i, layer in enumerate(net.layers) for name, x in layer.params().items()}


def _array(net, name):
    i, _, param = name.partition(".")
    return net.layers[int(i)].params()[param]


def _rel_err(x, ref, scale):
    """|| x - ref || / scale in float64; NaN where x has a NaN or an infinity."""
    x = np.asarray(x, np.float64)
    if not np.all(np.isfinite(x)):
        return float("nan")
    return float(np.linalg.norm(x - ref) / max(scale, 1e-30))


def _first_line(e):
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def _describe(e):
    """A failure's text: a portanet error's message (its first line: a build log follows),
    another exception's type too (a driver's RuntimeError says little alone)."""
    text = _first_line(e)
    return text if isinstance(e, PortanetError) else f"{type(e).__name__}: {text}"
