"""DLPack in and out (portanet/dlpack.py).

On every device: fit, evaluate, predict and train_batch take arrays that speak only DLPack
(`Producer`: NumPy's memory behind __dlpack__ and nothing else, so np.asarray could not
have read it) and give exactly what NumPy input gives; an array that says it lives on a
GPU is copied down where its producer copies, else refused naming its device and the fix;
the cpu backend lends its arrays (weights(), pn.to_dlpack) as NumPy views of its memory,
OpenCL refuses, saying why. The ctypes capsules are checked here on host memory, in and out.

Where torch and a CUDA device are present (the GPU machine): torch CUDA tensors go into
predict, evaluate, fit and train_batch on cuda without a host round trip (the host write
path and NumPy's DLPack import are made to fail) and give bit for bit the results of NumPy
input: the same kernels lay out and gather the same values, from torch's memory instead
of portanet's (no atomics but the NaN flag's, so nothing depends on timing); weights() and
pn.to_dlpack give torch tensors at the weights' own addresses, written through both ways.
"""
import gc
import sys

import numpy as np
import pytest

import portanet as pn
from conftest import get_backend
from portanet import dlpack
from portanet.backends import lending


class Producer:
    """An array of another library, as far as DLPack tells: NumPy's memory behind
    __dlpack__ and __dlpack_device__ alone. `device` is what it says of itself (None: the
    host); one that says it is on a GPU copies to the host when asked (dl_device (1, 0))
    where host_copy, and refuses as PyTorch does for a device it is not on otherwise."""

    def __init__(self, a, device=None, host_copy=True):
        self.a, self.device, self.host_copy, self.calls = np.asarray(a), device, host_copy, 0

    def __dlpack_device__(self):
        return self.device or (dlpack.CPU, 0)

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        self.calls += 1
        if self.device is not None and not (self.host_copy and dl_device == (dlpack.CPU, 0)):
            raise BufferError(f"cannot hand out {self.device} memory as {dl_device}")
        return self.a.__dlpack__(stream=stream, max_version=max_version, dl_device=dl_device,
                                 copy=copy)


def data(rng, n=90, shape=(6,), classes=3):
    return (rng.standard_normal((n, *shape)).astype(np.float32),
            rng.integers(0, classes, n).astype(np.int64))


def conv_net(device, seed=3):
    """Images (N, C, H, W), so that samples of more than one axis go through."""
    return pn.Sequential([pn.Conv2D(4, 3, activation="relu"), pn.Flatten(),
                          pn.Dense(3, "softmax")], input_shape=(2, 6, 6), device=device,
                         seed=seed)


def same_weights(a, b):
    wa, wb = a.get_weights(), b.get_weights()
    return wa.keys() == wb.keys() and all(np.array_equal(wa[k], wb[k]) for k in wa)


def test_dlpack_arrays_give_what_numpy_arrays_give(device_name, rng):
    x, y = data(rng, shape=(2, 6, 6))
    xv, yv = data(rng, n=30, shape=(2, 6, 6))
    ref, net = conv_net(device_name), conv_net(device_name)
    h_ref = ref.fit(x, y, epochs=2, batch_size=16, validation_data=(xv, yv))
    given = [Producer(a) for a in (x, y, xv, yv)]
    h = net.fit(given[0], given[1], epochs=2, batch_size=16,
                validation_data=(given[2], given[3]))
    assert all(p.calls for p in given)              # read through DLPack, not asarray
    for k in ("loss", "accuracy", "val_loss", "val_accuracy"):
        assert h[k] == h_ref[k], k
    assert same_weights(net, ref)
    assert net.evaluate(Producer(xv), Producer(yv), batch_size=7) == \
        ref.evaluate(xv, yv, batch_size=7)
    assert np.array_equal(net.predict(Producer(xv), batch_size=7), ref.predict(xv, batch_size=7))
    net.train_batch(Producer(x[:20]), Producer(y[:20]))
    ref.train_batch(x[:20], y[:20])
    assert same_weights(net, ref)


def test_gpu_arrays_are_copied_down_or_refused_with_the_fix(device_name, rng):
    """A producer on cuda:7 (no backend here runs there): NumPy >= 2.1 asks it for a host
    copy; one that cannot copy is refused naming its device and how to bring the two
    together, for inputs and targets alike."""
    x, y = data(rng)
    net = pn.mlp((6,), classes=3, hidden=(8,), device=device_name)
    if np.lib.NumpyVersion(np.__version__) >= "2.1.0":
        assert np.array_equal(net.predict(Producer(x, (dlpack.CUDA, 7))), net.predict(x))
    else:
        pytest.skip(f"NumPy {np.__version__} cannot ask a producer for a host copy (2.1 can)")
    for call in (lambda: net.predict(Producer(x, (dlpack.CUDA, 7), host_copy=False)),
                 lambda: net.evaluate(Producer(x, (dlpack.CUDA, 7), host_copy=False), y),
                 lambda: net.fit(Producer(x, (dlpack.CUDA, 7), host_copy=False), y)):
        with pytest.raises(pn.InputError, match=r"the input live on cuda:7.*x\.cpu\(\)"):
            call()
    with pytest.raises(pn.InputError, match=r"the targets live on cuda:7.*x\.cpu\(\)"):
        net.evaluate(x, Producer(y, (dlpack.CUDA, 7), host_copy=False))


def test_weights_lend_the_layers_memory_on_cpu():
    net = pn.Sequential([pn.Dense(5, "relu"), pn.BatchNorm(), pn.Dense(2, "softmax")],
                        input_shape=4, device="cpu")
    views = net.layers[0].weights()
    assert views.keys() == {"w", "b"}
    assert net.layers[1].weights().keys() == {"gamma", "beta", "running_mean", "running_var"}
    views["w"][1, 2] = 5.0                               # through the view: the network's
    net.layers[1].weights()["running_mean"][:] = 0.25
    saved = net.get_weights()
    assert saved["0.w"][1, 2] == 5.0 and np.all(saved["1.running_mean"] == 0.25)
    lent = np.from_dlpack(dlpack.to_dlpack(net.layers[2].b))    # DLPack's own import
    net.set_weights({**saved, "2.b": np.array([3.0, 4.0], np.float32)})
    assert lent.tolist() == [3.0, 4.0]


def test_to_dlpack_is_portanets():
    assert pn.to_dlpack is dlpack.to_dlpack


def test_weights_need_a_network_that_holds_them():
    layer = pn.Dense(3)
    with pytest.raises(pn.InputError, match="not been freed"):
        layer.weights()
    net = pn.Sequential([layer], input_shape=2, loss="mse", device="cpu")
    net.free()
    with pytest.raises(pn.InputError, match="not been freed"):
        layer.weights()
    with pytest.raises(pn.InputError, match="to_dlpack takes an array a network holds"):
        dlpack.to_dlpack(object())


def test_opencl_says_it_cannot_lend(device_name):
    if not device_name.startswith("opencl"):
        pytest.skip("OpenCL's refusal; cpu and cuda lend (the tests above and below)")
    net = pn.mlp((4,), classes=2, hidden=(3,), device=device_name)
    for lend in (lambda: net.layers[0].weights(), lambda: dlpack.to_dlpack(net.layers[0].w)):
        with pytest.raises(pn.DeviceError, match=r"kDLOpenCL.*net\.get_weights\(\)"):
            lend()


# -- the capsules themselves, on host memory ------------------------------------------------


def host_view(a, device=(dlpack.CPU, 0)):
    """A DeviceView of host memory: the capsule code cuda's views run, with a host address."""
    return dlpack.DeviceView(pn.device("cpu"), a, a.ctypes.data, device)


def test_capsules_made_here_lend_and_let_go():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    before = len(lending._lent)
    b = np.from_dlpack(host_view(a))
    assert b.shape == (3, 4) and b.dtype == np.float32 and np.shares_memory(a, b)
    a[1, 2] = 99.0
    assert b[1, 2] == 99.0
    assert len(lending._lent) == before + 1
    del b                                   # NumPy calls the deleter: the array let go
    assert len(lending._lent) == before
    labels = np.arange(5, dtype=np.int32)
    assert np.from_dlpack(host_view(labels)).tolist() == [0, 1, 2, 3, 4]
    capsule = host_view(a).__dlpack__()     # never consumed: its destructor lets go
    assert len(lending._lent) == before + 1
    del capsule
    assert len(lending._lent) == before
    with pytest.raises(BufferError, match="lent there only"):
        host_view(a).__dlpack__(dl_device=(dlpack.CUDA, 0))
    with pytest.raises(BufferError, match="does not copy"):
        host_view(a).__dlpack__(copy=True)


def test_lent_memory_is_freed_when_the_last_lend_is_let_go(device_name):
    """free() of a buffer that a consumer still holds (net.free(), a batch resize) waits for
    the consumer: the device memory is not given back under a tensor that points at it."""
    bk = get_backend(device_name)
    if not bk.is_gpu and bk.kind == "cpu":
        pytest.skip("the reference lends NumPy arrays, which NumPy keeps alive itself")
    x = bk.empty((100,))
    held = bk.allocated_bytes
    host = np.zeros(10, np.float32)         # what NumPy reads: the capsule code is the same
    lent = [np.from_dlpack(dlpack.DeviceView(bk, bk.view(x, (10,), 5), host.ctypes.data,
                                             (dlpack.CPU, 0))) for _ in range(2)]
    bk.free(x)
    assert bk.allocated_bytes == held       # two consumers hold it
    del lent[0]
    assert bk.allocated_bytes == held
    del lent[0]                             # the last lets go: freed now
    assert bk.allocated_bytes == held - 400
    bk.free(x)                              # and a second free is nothing, as always
    assert bk.allocated_bytes == held - 400


def test_a_capsule_refused_while_raising_is_let_go(monkeypatch):
    """NumPy drops a capsule of a GPU view as it raises: the destructor still lets go of
    the array, and the report it leaves names NumPy's reason."""
    reports = []
    monkeypatch.setattr(sys, "unraisablehook", reports.append)
    before = len(lending._lent)
    with pytest.raises(Exception):
        np.from_dlpack(host_view(np.zeros(3, np.float32), (dlpack.CUDA, 0)))
    assert len(lending._lent) == before
    assert any("Unsupported device" in str(r.exc_value) for r in reports), reports


def test_taken_tensors_are_read_in_place_and_given_back():
    x = np.arange(10 * 2 * 3, dtype=np.float32).reshape(10, 2, 3)
    held = sys.getrefcount(x)
    t = dlpack.consume(x, (dlpack.CPU, 0), None)
    assert (t.data, t.shape, t.dtype) == (x.ctypes.data, (10, 2, 3), np.float32)
    assert sys.getrefcount(x) == held + 1                 # NumPy's capsule holds x
    samples = dlpack.DeviceSamples(t)
    part = samples[2:][3:5]
    assert (len(part), part.shape) == (2, (2, 2, 3))
    assert (part.array.buf, part.array.shape) == (x[5:7].ctypes.data, (2, 6))
    assert len(samples[8:20]) == 2 and len(samples[5:3]) == 0
    with pytest.raises(TypeError):
        samples[::2]
    t.release()
    assert sys.getrefcount(x) == held                     # the deleter ran: x given back
    with pytest.raises(pn.PortanetError, match="let go"):
        part.array
    for wrong, why in ((x.transpose(1, 0, 2), "C-contiguous"),
                       (x[:, :, 0], "C-contiguous")):
        with pytest.raises(pn.InputError, match=why):
            dlpack.consume(wrong, (dlpack.CPU, 0), None)
    with pytest.raises(pn.InputError, match="cuda:0 but its DLPack tensor is on cpu:0"):
        dlpack.consume(x, (dlpack.CUDA, 0), None)
    gc.collect()
    assert sys.getrefcount(x) == held                     # refused capsules went back whole


# -- torch on CUDA (the GPU machine) -----------------------------------------------------


def torch_cuda():
    """torch, and cuda's backend (skipped, saying why, without either)."""
    torch = pytest.importorskip("torch", reason="PyTorch is not installed here")
    get_backend("cuda")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    return torch


def forbid_host_paths(monkeypatch, bk):
    """The ways an input could have gone through the host made to fail: the host write of
    batches, NumPy's DLPack import; returns the (address, samples) write_samples_device
    laid out from."""
    def refuse(*args, **kwargs):
        raise AssertionError("the input took a host path")
    monkeypatch.setattr(bk, "write_samples", refuse)
    monkeypatch.setattr(dlpack, "_from_host", refuse)
    monkeypatch.setattr(dlpack, "_host_copy", refuse)
    laid, lay_out = [], bk.write_samples_device

    def recorded(dst, src, bad=None, first=0):
        laid.append((int(src.buf), src.shape[0]))
        return lay_out(dst, src, bad, first)
    monkeypatch.setattr(bk, "write_samples_device", recorded)
    return laid


def within(laid, tensor):
    start, end = tensor.data_ptr(), tensor.data_ptr() + tensor.numel() * tensor.element_size()
    return bool(laid) and all(start <= a < end for a, _ in laid)


def test_torch_cuda_tensors_are_read_in_place_by_predict_and_evaluate(monkeypatch, rng):
    torch = torch_cuda()
    x, y = data(rng, n=300, shape=(2, 6, 6))
    net = conv_net("cuda")
    want_p, want_e = net.predict(x, batch_size=128), net.evaluate(x, y, batch_size=128)
    xt, yt = torch.from_numpy(x).to("cuda:0"), torch.from_numpy(y).to("cuda:0")
    laid = forbid_host_paths(monkeypatch, net.backend)
    assert np.array_equal(net.predict(xt, batch_size=128), want_p)      # bit for bit
    assert laid[0] == (xt.data_ptr(), 128) and within(laid, xt)
    assert net.evaluate(xt, yt, batch_size=128) == want_e
    xt[7, 0, 0, 0] = float("nan")
    with pytest.raises(pn.InputError, match="first at sample 7"):
        net.predict(xt)


def test_torch_cuda_tensors_train_in_place(monkeypatch, rng):
    torch = torch_cuda()
    x, y = data(rng, n=200, shape=(2, 6, 6))
    ref, net = conv_net("cuda"), conv_net("cuda")
    h_ref = ref.fit(x, y, epochs=2, batch_size=32, validation_split=0.25, data_on_device=True)
    ref.train_batch(x[:40], y[:40])
    bk = net.backend
    xt, yt = torch.from_numpy(x).to("cuda:0"), torch.from_numpy(y).to("cuda:0")
    laid = forbid_host_paths(monkeypatch, bk)
    sizes, write = [], bk.write

    def recorded(dst, host, wait=True):
        sizes.append(np.size(host))
        return write(dst, host, wait)
    monkeypatch.setattr(bk, "write", recorded)
    h = net.fit(xt, yt, epochs=2, batch_size=32, validation_split=0.25)
    net.train_batch(xt[:40], yt[:40])
    for k in ("loss", "accuracy", "val_loss", "val_accuracy"):
        assert h[k] == h_ref[k], k
    assert same_weights(net, ref)                       # bit for bit, gathered from torch
    assert within(laid, xt)
    assert max(sizes) <= len(x)                         # targets and indices, never samples
    xt[150, 1, 2, 3] = float("inf")
    with pytest.raises(pn.InputError, match="first at sample 150"):
        net.fit(xt, yt, epochs=1)


def test_torch_cuda_tensors_must_be_float32_and_c_contiguous():
    torch = torch_cuda()
    net = pn.mlp((6,), classes=3, hidden=(8,), device="cuda")
    with pytest.raises(pn.InputError, match=r"float64.*x\.float\(\)"):
        net.predict(torch.zeros((4, 6), dtype=torch.float64, device="cuda:0"))
    with pytest.raises(pn.InputError, match=r"C-contiguous.*x\.contiguous\(\)"):
        net.predict(torch.zeros((6, 4), device="cuda:0").t())


def test_torch_cuda_tensors_elsewhere_come_down_or_are_refused(device_name, rng):
    """On cpu and OpenCL, and on cuda:0 from another GPU: a host copy where torch makes
    one when asked, else the InputError with the fix."""
    torch = torch_cuda()
    if device_name.startswith("cuda"):
        if torch.cuda.device_count() < 2:
            pytest.skip("one GPU: no other one for the tensor to live on")
        where = "cuda:1"
    else:
        where = "cuda:0"
    x, _ = data(rng)
    net = pn.mlp((6,), classes=3, hidden=(8,), device=device_name)
    try:
        got = net.predict(torch.from_numpy(x).to(where))
    except pn.InputError as e:
        assert where in str(e) and "x.cpu()" in str(e), e
    else:
        assert np.array_equal(got, net.predict(x))


def test_torch_sees_the_weights_where_they_are(rng):
    torch = torch_cuda()
    net = pn.Sequential([pn.Dense(8, "relu"), pn.BatchNorm(), pn.Dense(3, "softmax")],
                        input_shape=5, device="cuda")
    bk, layer = net.backend, net.layers[0]
    before, lent = net.get_weights(), len(lending._lent)
    w = torch.from_dlpack(layer.weights()["w"])
    b = torch.from_dlpack(dlpack.to_dlpack(layer.b))        # at an offset into the flat vector
    assert (w.device, w.dtype, tuple(w.shape)) == (torch.device("cuda", 0), torch.float32,
                                                   (8, 5))
    assert w.data_ptr() == bk._address(layer.w) and b.data_ptr() == bk._address(layer.b)
    assert np.array_equal(w.cpu().numpy(), before["0.w"])
    w.mul_(2.0)                                         # torch writes: portanet sees it
    torch.from_dlpack(net.layers[1].weights()["running_var"]).fill_(4.0)
    torch.cuda.synchronize()
    after = net.get_weights()
    assert np.array_equal(after["0.w"], 2 * before["0.w"])
    assert np.all(after["1.running_var"] == 4.0)
    net.set_weights({**after, "0.b": np.arange(8, dtype=np.float32)})  # portanet writes
    bk.synchronize()                                    # its stream is not torch's
    assert b.cpu().tolist() == list(range(8))
    assert len(lending._lent) == lent + 2                # the fill's tensor is gone already
    del w, b
    assert len(lending._lent) == lent                    # torch called the deleters
