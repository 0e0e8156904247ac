"""Every numeric test runs on every device this machine has: cpu always, opencl and cuda
where their packages and a device are present (else skipped, saying why). Set
PORTANET_DEVICE to add a specific device (e.g. opencl:1:0)."""
import os
import zlib

import numpy as np
import pytest

import portanet
from portanet.errors import DeviceError

DEVICES = ["cpu", "opencl", "cuda"]
if os.environ.get("PORTANET_DEVICE") and os.environ["PORTANET_DEVICE"] not in DEVICES:
    DEVICES.append(os.environ["PORTANET_DEVICE"])

# relative-error tolerances, per dtype (not per test): float32 kernels against a float64
# result, and float64 analytic gradients against central finite differences
F32 = 1e-5
F64_GRAD = 1e-5


def get_backend(spec, dtype=np.float32):
    try:
        return portanet.device(spec, dtype)
    except DeviceError as e:
        pytest.skip(f"{spec} unavailable here: {e}")


@pytest.fixture(params=DEVICES)
def backend(request):
    return get_backend(request.param)


@pytest.fixture(params=DEVICES)
def device_name(request):
    get_backend(request.param)
    return request.param


@pytest.fixture
def rng(request):
    """Fresh random inputs per test, seeded by the test's id through crc32, which unlike
    hash() is the same in every process, so a failure reproduces."""
    return np.random.default_rng(rng_seed(request.node.nodeid))


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
