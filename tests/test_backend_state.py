"""What a backend keeps track of: memory accounting that follows the lifetime of the
arrays it hands out, the device's memory as memory_info() reports it, and the device
strings that select a backend, with the errors for the ones that select none."""
import gc
import threading

import numpy as np
import pytest

import portanet as pn
from portanet import backends
from portanet.backends import cuda

from conftest import get_backend

CNN = "conv(4, 3, relu) maxpool(2) flatten dense(5, softmax)"


def build_and_train(device, seed):
    """A small CNN, trained one step at batch 16 (so its batch buffers exist)."""
    rng = np.random.default_rng(seed)
    net = pn.from_description(CNN, (1, 10, 10), device=device, seed=seed)
    net.fit(rng.standard_normal((16, 1, 10, 10)).astype(np.float32), rng.integers(0, 5, 16),
            batch_size=16)
    return net


# -- accounting follows buffer lifetime ------------------------------------------------


def test_dropped_networks_give_their_memory_back(device_name):
    bk = pn.device(device_name)
    build_and_train(device_name, 0).free()      # backend workspaces that persist (split-K)
    gc.collect()
    start = bk.allocated_bytes
    for seed in range(15):
        build_and_train(device_name, seed)      # dropped without free()
    gc.collect()
    assert bk.allocated_bytes == start


def test_free_then_drop_releases_once(backend):
    start = backend.allocated_bytes
    x = backend.empty((1000,))
    y = backend.empty((10, 10))
    assert backend.allocated_bytes == start + x.nbytes + y.nbytes
    backend.free(x)
    backend.free(x)                             # a second free does nothing
    assert backend.allocated_bytes == start + y.nbytes
    backend.free(backend.view(y, (5,)))         # nor does freeing a view
    assert backend.allocated_bytes == start + y.nbytes
    del x
    gc.collect()                                # nor collecting the freed array
    assert backend.allocated_bytes == start + y.nbytes
    del y
    gc.collect()
    assert backend.allocated_bytes == start


def test_a_view_keeps_its_buffer_counted(backend):
    start = backend.allocated_bytes
    x = backend.upload(np.arange(12, dtype=np.float32))
    v = backend.view(x, (2, 3), offset=6)
    del x
    gc.collect()
    assert backend.allocated_bytes == start + 48          # v still uses the buffer
    assert backend.download(v).tolist() == [[6, 7, 8], [9, 10, 11]]
    del v
    gc.collect()
    assert backend.allocated_bytes == start


def test_arrays_dropped_in_other_threads_are_released(backend):
    start = backend.allocated_bytes

    def work():
        for _ in range(50):
            kept, dropped = backend.empty((64,)), backend.empty((32,))
            backend.free(kept)
            del dropped

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    gc.collect()
    assert backend.allocated_bytes == start


def test_dropped_buffers_leave_no_phantom_out_of_memory(backend):
    """Allocating and dropping twice the device's memory in big buffers never fails: the
    accounting (OpenCL refuses by it) and the driver both get the memory back."""
    if backend.kind == "cpu":
        pytest.skip("the host has no device memory limit to exceed")
    chunk = backend.info()["memory_bytes"] // 8      # OpenCL allows 1/4 in one buffer at least
    start = backend.allocated_bytes
    for _ in range(16):
        backend.empty((chunk // 4,), np.float32, label="dropped")
    gc.collect()
    assert backend.allocated_bytes == start
    gc.disable()                    # dropped in reference cycles the collector has not seen
    try:
        for _ in range(16):
            cycle = {"x": backend.empty((chunk // 4,), np.float32, label="in a cycle")}
            cycle["self"] = cycle
        del cycle
    finally:
        gc.enable()
    gc.collect()
    assert backend.allocated_bytes == start


# -- memory_info ------------------------------------------------------------------------


def test_memory_info(backend):
    free, total = backend.memory_info()
    assert 0 < free <= total
    assert backend.max_alloc_bytes is None or 0 < backend.max_alloc_bytes <= total
    if backend.kind == "opencl":        # no query in OpenCL: portanet's own accounting
        x = backend.empty((1 << 20,))
        assert backend.memory_info() == (free - x.nbytes, total)
        backend.free(x)
        assert backend.memory_info() == (free, total)
        assert backend.max_alloc_bytes == backend.device.max_mem_alloc_size


# -- device strings ---------------------------------------------------------------------


def test_bad_device_variable_says_it_came_from_the_variable(monkeypatch):
    monkeypatch.setenv("PORTANET_DEVICE", "garbage")
    with pytest.raises(pn.DeviceError, match=r"PORTANET_DEVICE='garbage' is not a device "
                                             r"string.*opencl:P:D.*Available devices: cpu"):
        pn.device()
    monkeypatch.setenv("PORTANET_DEVICE", "cuda:7")
    with pytest.raises(pn.DeviceError, match=r"PORTANET_DEVICE='cuda:7' is not available"):
        pn.device()


def test_unset_or_blank_variable_means_cpu(monkeypatch):
    monkeypatch.delenv("PORTANET_DEVICE", raising=False)
    assert pn.device().name == "cpu"
    monkeypatch.setenv("PORTANET_DEVICE", "  ")
    assert pn.device(None).name == "cpu"


@pytest.mark.parametrize("spec", ["", "   "])
def test_explicit_empty_device_is_an_error(spec, monkeypatch):
    monkeypatch.setenv("PORTANET_DEVICE", "cpu")
    with pytest.raises(pn.DeviceError, match=r"is not a device string.*None for "
                                             r"PORTANET_DEVICE.*Available devices: cpu"):
        pn.device(spec)
    with pytest.raises(pn.DeviceError, match="is not a device string"):
        pn.mlp((4,), classes=3, device=spec)


def test_opencl_platform_alone_names_its_first_device():
    """opencl:P is platform P's first GPU, else its first device: so for the platform of
    the default device (the first GPU anywhere, else the first device) it is that one."""
    bk = get_backend("opencl")
    platform = bk.name.split(":")[1]
    assert pn.device(f"opencl:{platform}") is bk is pn.device(bk.name)   # one context
    with pytest.raises(pn.DeviceError, match=r"'opencl:99' is not available.*platform 99"
                                             r".*Available devices: cpu"):
        pn.device("opencl:99")


@pytest.fixture
def no_pycuda(monkeypatch):
    """A machine without pycuda, and a registry that has made no CUDA backend yet."""
    monkeypatch.setattr(backends, "_instances", {})
    monkeypatch.setattr(cuda, "drv", None)


def test_cuda_without_a_driver_says_so_once(no_pycuda, monkeypatch):
    monkeypatch.setattr(cuda, "_nvidia_driver_present", lambda: False, raising=False)
    with pytest.raises(pn.DeviceError) as error:
        pn.device("cuda")
    text = str(error.value)
    assert text.count("no NVIDIA GPU/driver found on this machine") == 1, text
    assert "pycuda" not in text and "Available devices: cpu" in text


def test_cuda_with_a_driver_but_no_pycuda_names_the_extra_once(no_pycuda, monkeypatch):
    monkeypatch.setattr(cuda, "_nvidia_driver_present", lambda: True, raising=False)
    with pytest.raises(pn.DeviceError) as error:
        pn.device("cuda:0")
    text = str(error.value)
    assert text.count("pip install 'portanet[cuda]'") == 1, text
    assert "Available devices: cpu" in text
