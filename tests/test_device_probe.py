"""An OpenCL device whose compiler builds nothing on this machine is refused as a device
(a DeviceError naming the compiler's words), so that the tests skip it and users are told,
instead of every kernel failing at its first use."""
import pytest

from portanet.backends import opencl
from portanet.errors import DeviceError


def _any_device():
    try:
        found = opencl._devices()
    except DeviceError as e:
        pytest.skip(f"no OpenCL platform here: {e}")
    if not found:
        pytest.skip("no OpenCL device here")
    return found[0][:2]


def test_a_device_whose_compiler_builds_nothing_is_unavailable(monkeypatch):
    platform, device = _any_device()

    class Unbuildable:
        def __init__(self, ctx, text):
            pass

        def build(self, options=(), cache_dir=None):
            raise opencl.cl.RuntimeError("clBuildProgram failed: BUILD_PROGRAM_FAILURE\n"
                                         "error: unknown target CPU 'generic'")

    monkeypatch.setattr(opencl.cl, "Program", Unbuildable)
    with pytest.raises(DeviceError, match="cannot build any kernel here.*unknown target CPU"):
        opencl.OpenCLBackend(platform, device)
