"""Every numeric test runs on every device this machine has: cpu always, each OpenCL
platform's first device by name (opencl:pocl, opencl:intel, opencl:nvidia, ...) and cuda
where their packages and a device are present (else skipped, saying why). Set
PORTANET_DEVICE to add a specific device (e.g. opencl:1:0).

The kernel-level modules (KERNEL_MODULES) run on more: on PoCL under each limits profile
of backends.opencl.PROFILES (opencl:pocl[mobile]: the parameters an AMD, Intel or mobile
GPU would get, held to its limits), and on the Oclgrind simulator with its checks on,
where any error it reports fails the test (oclgrind_log)."""
import functools
import os
import tempfile
import zlib

import numpy as np
import pytest

import portanet
from portanet.backends import opencl
from portanet.errors import DeviceError, PrecisionError

# Oclgrind's checks on before any context is made; its reports go to this file. Under
# pytest-xdist (`-n auto`) each worker has its own: the controller's, which the workers
# inherit through the environment, would give one worker's reports to the other's tests.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OCLGRIND_LOG"] = os.path.join(tempfile.gettempdir(),
                                              f"portanet-oclgrind-{os.getpid()}.log")
OCLGRIND_LOG = opencl.simulator_checks()

KERNEL_MODULES = {"test_kernels", "test_conv", "test_semantics", "test_batchnorm", "test_layernorm",
                  "test_embedding", "test_attention"}
SIMULATOR = "opencl:oclgrind"


def _opencl_devices():
    """opencl:<platform> for each OpenCL platform here but the simulator; ['opencl'] (which
    skips, saying why) where there is none."""
    try:
        words = opencl.platform_words(opencl._platforms())
    except DeviceError:
        words = []
    named = [f"opencl:{w}" for w in words if w not in opencl.SIMULATORS]
    return named or ["opencl"], [f"opencl:{w}" for w in words if w in opencl.SIMULATORS]


_OPENCL, _SIMULATORS = _opencl_devices()
DEVICES = ["cpu", *_OPENCL, "cuda"]
if os.environ.get("PORTANET_DEVICE") and os.environ["PORTANET_DEVICE"] not in DEVICES:
    DEVICES.append(os.environ["PORTANET_DEVICE"])
PROFILED = [f"opencl:pocl[{name}]" for name in ("amd", "intel-gpu", "mobile")]
KERNEL_DEVICES = DEVICES + (PROFILED if "opencl:pocl" in DEVICES else []) + _SIMULATORS

# what one kernel call may do on the simulator: Oclgrind with every check on runs about
# 40 thousand multiply-adds a second, so larger shapes are left to the real devices
SIMULATED_WORK = 100_000


def simulated(backend, work):
    """Skip on a simulator when a test's kernel calls do more than SIMULATED_WORK
    multiply-adds (or elements) each; its other shapes still run there."""
    if backend.simulator and work > SIMULATED_WORK:
        pytest.skip(f"{work} operations a call is beyond what the simulator runs quickly "
                    f"({SIMULATED_WORK}); the real devices run this shape")


# relative-error tolerances, per dtype (not per test): float32 kernels against a float64
# result, and float64 analytic gradients against central finite differences
F32 = 1e-5
F64_GRAD = 1e-5

_profiled = {}                  # PoCL backends under a limits profile, one per profile and dtype


def get_backend(spec, dtype=np.float32):
    try:
        if spec.endswith("]"):                  # opencl:pocl[mobile]
            device, _, profile = spec[:-1].partition("[")
            key = (spec, np.dtype(dtype))
            if key not in _profiled:
                p, d = map(int, portanet.device(device).name.split(":")[1:])
                _profiled[key] = opencl.OpenCLBackend(p, d, dtype, limits=profile)
            return _profiled[key]
        return portanet.device(spec, dtype)
    except DeviceError as e:
        pytest.skip(f"{spec} unavailable here: {e}")


def precision_backend(spec, precision):
    """The backend of the device `spec` (float32) in `precision`, or a skip naming what the
    device computes."""
    get_backend(spec)
    try:
        return portanet.device(spec, precision=precision)
    except PrecisionError as e:
        pytest.skip(str(e))


def pytest_generate_tests(metafunc):
    """backend and device_name run over DEVICES; backend over KERNEL_DEVICES in the
    kernel-level modules."""
    kernel_level = metafunc.module.__name__.rpartition(".")[2] in KERNEL_MODULES
    if "backend" in metafunc.fixturenames:
        metafunc.parametrize("backend", KERNEL_DEVICES if kernel_level else DEVICES,
                             indirect=True)
    if "device_name" in metafunc.fixturenames:
        metafunc.parametrize("device_name", DEVICES, indirect=True)


@pytest.fixture
def backend(request):
    bk = get_backend(request.param)
    if request.param in _SIMULATORS:
        with oclgrind_log():
            yield bk
    else:
        yield bk


@pytest.fixture
def device_name(request):
    get_backend(request.param)
    return request.param


class oclgrind_log:
    """Fails the test if Oclgrind logged anything while it ran (reports are appended to
    OCLGRIND_LOG; only what this test added is read)."""

    def __enter__(self):
        self.report = opencl.SimulatorReport(OCLGRIND_LOG)

    def __exit__(self, kind, *_):
        said = self.report.read() if kind is None else ""
        if said:
            pytest.fail(f"Oclgrind reported errors:\n{said[:4000]}")


@pytest.fixture
def rng(request):
    """Fresh random inputs per test, seeded by the test's id through crc32, which unlike
    hash() is the same in every process, so a failure reproduces."""
    return np.random.default_rng(rng_seed(request.node.nodeid))


@functools.cache
def _fashion():
    return portanet.load_dataset("fashion-mnist")       # read once per test process


@pytest.fixture(scope="module")
def fashion():
    """Fashion-MNIST, ((x, y), (x_test, y_test)), or the test skips where it is missing."""
    try:
        return _fashion()
    except portanet.DataError as e:
        pytest.skip(f"Fashion-MNIST is not installed here: {e}")


@pytest.fixture(params=["float32", "float64"])
def bk(request, backend):
    """The test's device in float32 and in float64 (skipped, saying why, where it has no
    float64): the kernel modules' op tests."""
    dtype = np.dtype(request.param)
    if backend.dtype != dtype:
        backend = get_backend(request.node.callspec.params["backend"], dtype)
    return backend


def poisoned(bk, shape):
    """A device array of `shape` holding NaN: an element a kernel forgot to write fails."""
    x = bk.empty(shape)
    bk.write(x, np.full(shape, np.nan))
    return x


def rng_seed(nodeid):
    return zlib.crc32(nodeid.encode())


def rel_err(x, ref, scale=None):
    """Relative error of x against a float64 reference (Frobenius norm), relative to the
    reference or, where terms may cancel (alpha a b + beta c), to the size of the terms."""
    ref = np.asarray(ref, np.float64)
    x = np.asarray(x, np.float64)
    assert np.all(np.isfinite(x)), "result has NaN or inf"
    return np.linalg.norm(x - ref) / max(np.linalg.norm(ref) if scale is None else scale, 1e-30)


def gemm_scale(alpha, a, b, beta, c):
    """|| |alpha| |a| |b| + |beta| |c| ||: what rounding in alpha a b + beta c is relative to."""
    return np.linalg.norm(abs(alpha) * np.abs(a) @ np.abs(b) + abs(beta) * np.abs(c))


# -- the time of each part: the summary ends with the tests and seconds of each device,
# then the causes of the skips, most common first ------------------------------------------

NO_DEVICE = "(no device)"       # the row of the tests that take no device parameter
_parts = {}                     # device (or NO_DEVICE) -> [seconds, outcomes]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    params = getattr(item, "callspec", None)
    params = params.params if params else {}
    report.device = params.get("backend") or params.get("device_name") or NO_DEVICE


def pytest_runtest_logreport(report):
    part = _parts.setdefault(getattr(report, "device", NO_DEVICE), [0.0, {}])
    part[0] += report.duration
    if report.when == "call" or report.outcome != "passed":
        part[1][report.outcome] = part[1].get(report.outcome, 0) + 1


SKIP_CAUSES = 10                # the most common causes listed; the rest counted in one line


def skip_cause(reason):
    """(cause, detail) of a skip's reason: the cause before the first ': ' or '; ', its
    numbers as N ("opencl:pocl unavailable here"), the detail the first sentence after it,
    without the device it names again ("no NVIDIA GPU/driver found on this machine")."""
    import re
    reason = reason.removeprefix("Skipped: ")
    cause, detail = (re.split(r": |; ", reason, maxsplit=1) + [""])[:2]
    detail = re.sub(r"^device '[^']*' is not available: ", "", detail)
    return re.sub(r"\d+(\.\d+)?", "N", cause), detail.split(". ")[0]


def pytest_terminal_summary(terminalreporter):
    if not _parts:
        return
    terminalreporter.section("time per device (setup, test and teardown)")
    for device, (seconds, outcomes) in sorted(_parts.items(), key=lambda p: -p[1][0]):
        counts = ", ".join(f"{n} {what}" for what, n in sorted(outcomes.items()))
        terminalreporter.write_line(f"{device:24s} {seconds:7.1f} s   {counts}")
    causes, details = {}, {}
    for report in terminalreporter.stats.get("skipped", []):
        if isinstance(report.longrepr, tuple):          # (path, line, reason)
            cause, detail = skip_cause(str(report.longrepr[2]))
            causes[cause] = causes.get(cause, 0) + 1
            details.setdefault(cause, detail)
    if not causes:
        return
    terminalreporter.section("skipped, by cause (most first; -rs lists each test)")
    ranked = sorted(causes.items(), key=lambda c: (-c[1], c[0]))
    for cause, n in ranked[:SKIP_CAUSES]:
        line = f"{n:6d}  {cause}" + (f": {details[cause]}" if details[cause] else "")
        terminalreporter.write_line(line if len(line) <= 110 else line[:107] + "...")
    rest = ranked[SKIP_CAUSES:]
    if rest:
        terminalreporter.write_line(f"{sum(n for _, n in rest):6d}  {len(rest)} other causes")
