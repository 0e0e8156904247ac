"""`portanet devices --check` (portanet/check.py): it passes on every device here, and a
device that builds nothing, computes slightly wrong numbers or does not exist is a FAIL
line and a nonzero exit, never a traceback."""
import numpy as np
import pytest
from click.testing import CliRunner

import portanet as pn
from portanet import backends, check
from portanet.cli import main
from portanet.errors import KernelBuildError

WRONG = 1e-3            # a relative error any device check must see


def run(*args):
    return CliRunner().invoke(main, ["devices", "--check", *args])


def test_check_passes(backend):
    r = check.check_device(backend)
    assert r.passed, r.failures
    assert r.device == backend.name and r.description
    assert r.gemm_error <= check.GEMM_TOLERANCE and r.step_error <= check.STEP_TOLERANCE
    assert r.step_ms > 0
    assert (r.build_s is None) == (backend.kind == "cpu")
    assert r.gemm_path.startswith(backend.gemm_path)
    assert set(r.precision_errors) == set(backend.precisions) - {backend.precision}
    assert all(e <= check.GEMM_TOLERANCE for e in r.precision_errors.values())


def test_a_tf32_gemm_that_does_not_round_fails(monkeypatch):
    """The gemm in tf32 is held to the product of the rounded inputs: float32's own product
    is off it by more than the tolerance (2.6e-5 here), so a device whose TF32 path did not
    round (or rounded otherwise) fails."""
    tf32 = pn.device("cpu", precision="tf32")
    monkeypatch.setattr(tf32, "_product", lambda a, b, out=None: np.matmul(a, b, out=out))
    r = check.check_device("cpu")
    assert not r.passed and r.failures[0].startswith("gemm in tf32: relative error")
    assert r.precision_errors["tf32"] > 2 * check.GEMM_TOLERANCE


@pytest.mark.parametrize("wrong", ["scaled", "nan"])
def test_a_wrong_gemm_fails(backend, monkeypatch, wrong):
    right = backend.gemm

    def gemm(alpha, a, b, beta, c, trans_a=False, trans_b=False):
        right(alpha * (1 + WRONG) if wrong == "scaled" else alpha, a, b, beta, c,
              trans_a, trans_b)
        if wrong == "nan" and c.shape == check.GEMM_SHAPE[:2]:
            backend.fill(c, float("nan"))
    monkeypatch.setattr(backend, "gemm", gemm)
    r = check.check_device(backend)
    assert not r.passed
    assert r.failures[0].startswith("gemm: relative error")
    if wrong == "scaled":
        # relative to || |a| |b| ||, about sqrt(k) times || a b ||: 1e-3 shows as 1e-4
        assert r.gemm_error > 5 * check.GEMM_TOLERANCE
    else:
        assert "nan" in r.failures[0]


def test_a_slightly_wrong_activation_fails_the_step(backend, monkeypatch):
    if backend.kind == "cpu":
        pytest.skip("the cpu is the step's reference: it is checked by the gemm alone")
    right = backend.bias_activation
    # convolutions through patch matrices, whose activation is bias_activation's (the
    # implicit and direct paths fuse it into their own kernels)
    def bias_activation(kind, z, b, a, stored=None):
        right(kind, z, b, a, stored=stored)
        if kind == "relu":
            backend.scal(1 + WRONG, a)
    monkeypatch.setattr(backend, "bias_activation", bias_activation)
    with backend.pinned(conv="im2col"):
        r = check.check_device(backend)
    assert [f.split(":")[0] for f in r.failures] == ["step"], r.failures
    assert r.step_error > 10 * check.STEP_TOLERANCE
    assert "differs from the cpu's" in r.failures[0]


def test_a_kernel_build_error_is_a_fail_with_its_first_line(backend, monkeypatch):
    def build_all():
        raise KernelBuildError("kernels_cl/conv.cl failed to build for the device\n"
                               "error: the build log follows")
    monkeypatch.setattr(backend, "build_all", build_all, raising=False)
    r = check.check_device(backend)
    assert r.failures == ["build: kernels_cl/conv.cl failed to build for the device"]
    assert r.gemm_error is None and r.step_ms is None


def test_cli_passes_and_lists_every_device_by_default(monkeypatch):
    listed = [("cpu", "NumPy reference on the host CPU")]
    monkeypatch.setattr(backends, "list_devices", lambda: (listed, []))
    result = run()
    assert result.exit_code == 0, result.output
    line, = result.output.splitlines()
    assert line.startswith("cpu ") and "NumPy reference" in line and " PASS " in line
    assert " ms " in line


def test_cli_exits_nonzero_on_a_wrong_device(monkeypatch):
    bk = pn.device("cpu")
    right = bk.gemm
    monkeypatch.setattr(bk, "gemm",
                        lambda alpha, *args, **kw: right(alpha * (1 + WRONG), *args, **kw))
    result = run("--device", "cpu")
    assert result.exit_code == 1, result.output
    assert " FAIL " in result.output and "gemm: relative error" in result.output
    assert "1 of 1 devices failed" in result.output


def test_cli_unknown_device_is_a_fail_line_not_a_traceback():
    result = run("--device", "quantum", "--device", "cpu")
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit)
    quantum, cpu = result.output.splitlines()[:2]
    assert quantum.startswith("quantum ") and " FAIL " in quantum
    assert "open: unknown device 'quantum'" in quantum
    assert cpu.startswith("cpu ") and " PASS " in cpu
    assert "Traceback" not in result.output


def test_cli_device_without_check_is_a_usage_error():
    result = CliRunner().invoke(main, ["devices", "--device", "cpu"])
    assert result.exit_code == 2 and "--check" in result.output


def test_what_the_simulator_reports_fails_it(monkeypatch):
    """On Oclgrind a right answer is not enough: an access it reports (here a fill past the
    end of a buffer, slipped into the gemm check) fails the device."""
    from conftest import SIMULATOR, get_backend
    bk = get_backend(SIMULATOR)

    def overrun(bk, rng):                   # right (0 error), but past the buffer's end
        x = bk.upload(np.ones(10, np.float32))
        bk._run("fill", (12,), x, 1.0, 12)
        bk.synchronize()
        return 0.0
    monkeypatch.setattr(check, "check_gemm", overrun)
    monkeypatch.setattr(check, "check_step", lambda bk, rng, seed: (0.0, "0.w", 1.0))
    result = check.check_device(bk)
    assert not result.passed
    assert any(f.startswith("simulator: ") and "Invalid write" in f for f in result.failures)
