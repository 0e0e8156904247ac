"""OpenCL platforms by name, the simulator never a default, device-limit profiles held at
every launch, and the pip-installed runtimes made visible (backends/icd.py)."""
import os

import numpy as np
import pytest

import portanet
from portanet.backends import icd
from portanet.errors import DeviceError, KernelBuildError

opencl = pytest.importorskip("portanet.backends.opencl")


def platforms():
    try:
        return opencl.platform_words(opencl._platforms())
    except DeviceError as e:
        pytest.skip(str(e))


def first_real_platform():
    words = platforms()
    real = [p for p, w in enumerate(words) if w not in opencl.SIMULATORS]
    if not real:
        pytest.skip("no OpenCL platform but a simulator here")
    return real[0], words[real[0]]


def test_platforms_are_named_in_device_strings():
    p, word = first_real_platform()
    assert portanet.device(f"opencl:{word}") is portanet.device(f"opencl:{p}")
    assert portanet.device(f"opencl:{word}:0").name == f"opencl:{p}:0"
    with pytest.raises(DeviceError, match=f"opencl:{word} \\(opencl:{p}\\)"):
        portanet.device("opencl:nosuchplatform")


def test_platform_words_are_unique_and_known():
    class Named:
        def __init__(self, name):
            self.name = name
    words = opencl.platform_words([Named(n) for n in (
        "Portable Computing Language", "Intel(R) OpenCL", "Intel(R) OpenCL", "NVIDIA CUDA",
        "AMD Accelerated Parallel Processing", "Oclgrind", "rusticl", "Some Vendor's CL")])
    assert words == ["pocl", "intel", "intel-2", "nvidia", "amd", "oclgrind", "rusticl", "some"]


def test_the_simulator_is_never_the_default():
    words = platforms()
    if not any(w in opencl.SIMULATORS for w in words):
        pytest.skip("no simulator installed")
    try:
        p, _ = opencl.default_device()
    except DeviceError as e:                    # the simulator alone: refused, and said why
        assert "simulator" in str(e)
        return
    assert words[p] not in opencl.SIMULATORS
    devices = dict(portanet.backends.list_devices()[0])
    assert any("simulator" in text for text in devices.values())


@pytest.mark.parametrize("profile,group,local,fp64", [
    ("amd", 256, 64 * 1024, None), ("intel-gpu", 256, 64 * 1024, False),
    ("mobile", 256, 32 * 1024, False), ("work_group=64,local=8k", 64, 8 * 1024, None)])
def test_limits_profiles_cap_what_the_backend_believes(profile, group, local, fp64):
    p, _ = first_real_platform()
    bk = opencl.OpenCLBackend(p, 0, limits=profile)
    dev = bk.device
    assert bk.limits.work_group == min(group, dev.max_work_group_size)
    assert bk.limits.local_bytes == min(local, dev.local_mem_size)
    if fp64 is not None:
        assert bk.limits.fp64 is (fp64 and bool(dev.double_fp_config))
    p_ = bk.gemm_params                 # the tiling derives from the capped limits
    assert (p_["TSM"] // p_["WPTM"]) * (p_["TSN"] // p_["WPTN"]) <= bk.limits.work_group
    slabs = (2 if p_["DB"] else 1) * p_["TSK"] * (p_["TSM"] + p_["TSN"] + 2 * p_["PAD"])
    assert slabs * bk.dtype.itemsize <= bk.limits.local_bytes
    assert bk.gemv_threads <= bk.limits.work_group
    x = bk.upload(np.arange(1000, dtype=np.float32))      # and the kernels run within them
    bk.scal(2.0, x)
    y = bk.empty(7)
    bk.gemv(1.0, bk.upload(np.ones((7, 1000), np.float32)), x, 0.0, y)
    assert np.allclose(bk.download(y), 999000.0)


def test_mobile_profile_caps_buffers_to_a_quarter_of_memory():
    p, _ = first_real_platform()
    bk = opencl.OpenCLBackend(p, 0, limits="mobile")
    assert bk.max_alloc_bytes == min(bk.device.max_mem_alloc_size, bk.device.global_mem_size // 4)
    with pytest.raises(portanet.OutOfMemoryError, match="one buffer may be at most"):
        bk.empty(bk.max_alloc_bytes // 4 + 1)


def test_no_fp64_is_a_clear_error_and_float32_works():
    p, _ = first_real_platform()
    with pytest.raises(DeviceError, match="no double precision.*use float32"):
        opencl.OpenCLBackend(p, 0, np.float64, limits="intel-gpu")
    bk = opencl.OpenCLBackend(p, 0, np.float32, limits="intel-gpu")
    x = bk.upload(np.ones(3, np.float32))
    bk.axpy(2.0, x, x)
    assert np.array_equal(bk.download(x), [3.0, 3.0, 3.0])


@pytest.mark.parametrize("spec,says", [
    ("huge", "neither a profile"), ("work_group=0", "work_group='0'"),
    ("local=lots", "local='lots'"), ("fp64=maybe", "yes or no"), ("colour=red", "unknown key")])
def test_bad_limits_strings_say_what_is_understood(spec, says):
    p, _ = first_real_platform()
    with pytest.raises(DeviceError, match=says):
        opencl.OpenCLBackend(p, 0, limits=spec)


def test_a_launch_beyond_the_limits_is_refused(monkeypatch):
    """A parameter not derived from the limits fails on every device, not only on the
    strict one: here gemv's group, forced above a 64-item cap."""
    p, _ = first_real_platform()
    bk = opencl.OpenCLBackend(p, 0, limits="work_group=64")
    monkeypatch.setattr(bk, "gemv_threads", 128)
    x, y = bk.upload(np.ones(300, np.float32)), bk.empty(2)
    with pytest.raises(KernelBuildError, match="128 work-items per group, over the 64"):
        bk.gemv(1.0, bk.upload(np.ones((2, 300), np.float32)), x, 0.0, y)


def test_pip_runtimes_get_a_vendors_folder(tmp_path, monkeypatch):
    """The .icd files the loader would read, plus one naming the installed library."""
    system = tmp_path / "vendors"
    system.mkdir()
    (system / "nvidia.icd").write_text("libnvidia-opencl.so.1\n")
    lib = tmp_path / "lib" / "libintelocl.so"
    lib.parent.mkdir()
    lib.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("OCL_ICD_VENDORS", str(system))
    monkeypatch.setattr(icd, "_done", False)
    monkeypatch.setattr(icd, "_pip_runtimes", lambda: {"portanet-intel-cpu": lib})
    icd.prepare()
    folder = os.environ["OCL_ICD_VENDORS"]
    assert folder.startswith(str(tmp_path / "cache" / "portanet"))
    files = {f: open(os.path.join(folder, f)).read().strip() for f in os.listdir(folder)}
    assert files == {"nvidia.icd": "libnvidia-opencl.so.1", "portanet-intel-cpu.icd": str(lib)}
    monkeypatch.setattr(icd, "_done", False)
    monkeypatch.setenv("OCL_ICD_VENDORS", str(system))
    icd.prepare()                                   # the same contents: the same folder
    assert os.environ["OCL_ICD_VENDORS"] == folder


def test_intel_runtime_is_visible_when_installed():
    try:
        from importlib import metadata
        metadata.distribution("intel-opencl-rt")
    except metadata.PackageNotFoundError:
        pytest.skip("intel-opencl-rt is not installed (extra intel-cpu)")
    assert "intel" in platforms()
    bk = portanet.device("opencl:intel")
    x = bk.upload(np.arange(5, dtype=np.float32))
    bk.scal(3.0, x)
    assert np.array_equal(bk.download(x), 3 * np.arange(5))


def test_oclgrind_reports_fail_the_test():
    """The harness that fails a kernel test on the simulator's reports can fail: a fill
    past the end of its buffer and a copy of memory never written are both reported."""
    from conftest import oclgrind_log
    words = platforms()
    if "oclgrind" not in words:
        pytest.skip("Oclgrind is not installed (extra oclgrind)")
    # a context of its own: Oclgrind reuses the memory of released buffers with what it
    # knew of it, so after other tests a new buffer can read as initialised
    bk = opencl.OpenCLBackend(words.index("oclgrind"), 0)
    with pytest.raises(pytest.fail.Exception, match="Invalid write of size 4"):
        with oclgrind_log():
            x = bk.upload(np.ones(10, np.float32))
            bk._run("fill", (12,), x, 1.0, 12)          # n = 12 > 10: writes past the end
            bk.synchronize()
    with pytest.raises(pytest.fail.Exception, match="Uninitialized value"):
        with oclgrind_log():
            dst = bk.empty(6)
            bk.copy(bk.empty(6), dst)
            bk.synchronize()


def test_a_read_only_cache_still_gets_a_vendors_folder(tmp_path, monkeypatch):
    lib = tmp_path / "libintelocl.so"
    lib.write_text("")
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")                      # the cache path is a file: mkdir fails
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    monkeypatch.setenv("OCL_ICD_VENDORS", str(tmp_path / "none"))
    monkeypatch.setattr(icd, "_done", False)
    monkeypatch.setattr(icd, "_pip_runtimes", lambda: {"portanet-intel-cpu": lib})
    icd.prepare()
    folder = os.environ["OCL_ICD_VENDORS"]
    assert not folder.startswith(str(blocked))
    assert open(os.path.join(folder, "portanet-intel-cpu.icd")).read().strip() == str(lib)
