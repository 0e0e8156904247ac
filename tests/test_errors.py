"""Bad input is a clear PortanetError naming what is wrong and how to fix it."""
import gzip
import struct

import numpy as np
import pytest

import portanet as pn
from portanet.data import read_idx


@pytest.fixture
def net():
    return pn.mlp((4,), classes=3, hidden=(5,), device="cpu")


def data(n=10, width=4):
    rng = np.random.default_rng(0)
    return rng.standard_normal((n, width)).astype(np.float32), rng.integers(0, 3, n)


def test_wrong_input_width(net):
    x, y = data(width=5)
    with pytest.raises(pn.ShapeError, match=r"\(5,\).*expects \(4,\).*shape \(N, 4\)"):
        net.fit(x, y)
    with pytest.raises(pn.ShapeError, match="expects"):
        net.predict(x)


def test_labels_out_of_range(net):
    x, y = data()
    y[3] = 7
    with pytest.raises(pn.InputError, match=r"label 7 at sample 3.*\[0, 3\)"):
        net.fit(x, y)
    y[3] = -1
    with pytest.raises(pn.InputError, match="label -1"):
        net.evaluate(x, y)


def test_mismatched_batch_sizes(net):
    x, y = data()
    with pytest.raises(pn.ShapeError, match="x has 10 samples but y has 9"):
        net.fit(x, y[:9])


def test_nan_in_input(net):
    x, y = data()
    x[6, 2] = np.nan
    with pytest.raises(pn.InputError, match="NaN.*sample 6"):
        net.fit(x, y)
    with pytest.raises(pn.InputError, match="NaN"):
        net.predict(x)


def test_wrong_dtype(net):
    x, y = data()
    with pytest.raises(pn.InputError, match=r"dtype int64.*astype\(np.float32\)"):
        net.fit((x * 10).astype(np.int64), y)
    with pytest.raises(pn.InputError, match="labels have dtype float"):
        net.fit(x, y.astype(np.float32))
    with pytest.raises(pn.ShapeError, match="float32 or float64"):
        pn.device("cpu", dtype="float16")


def test_unknown_device_lists_the_devices():
    with pytest.raises(pn.DeviceError, match=r"unknown device 'tpu'.*Available devices: cpu"):
        pn.device("tpu")
    with pytest.raises(pn.DeviceError, match="Available devices: cpu"):
        pn.mlp(device="cuda:7")


def test_device_from_environment(monkeypatch):
    monkeypatch.setenv("PORTANET_DEVICE", "nonsense")
    with pytest.raises(pn.DeviceError, match="nonsense"):
        pn.device()
    assert pn.device("cpu").name == "cpu"          # an explicit argument wins
    monkeypatch.setenv("PORTANET_DEVICE", "cpu")
    assert pn.device().name == "cpu"


def test_loss_and_output_must_match():
    with pytest.raises(pn.ShapeError, match="use activation='softmax'"):
        pn.Sequential([pn.Dense(3, "relu")], 4, loss="softmax_cross_entropy", device="cpu")
    with pytest.raises(pn.InputError, match="unknown activation 'mish'"):
        pn.Dense(3, "mish")


def _idx_bytes(array):
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(">" + "I" * array.ndim, *array.shape)
    return header + array.astype(np.uint8).tobytes()


def test_idx_roundtrip_and_corruption(tmp_path):
    images = np.arange(2 * 3 * 4).reshape(2, 3, 4) % 256
    raw = tmp_path / "ok-idx3-ubyte"
    raw.write_bytes(_idx_bytes(images))
    assert np.array_equal(read_idx(raw), images)
    gz = tmp_path / "ok.gz"
    gz.write_bytes(gzip.compress(_idx_bytes(images)))
    assert np.array_equal(read_idx(gz), images)

    truncated = tmp_path / "truncated"
    truncated.write_bytes(_idx_bytes(images)[:-5])
    with pytest.raises(pn.DataError, match="truncated or corrupt"):
        read_idx(truncated)
    bad_magic = tmp_path / "bad"
    bad_magic.write_bytes(b"\x12\x34" + _idx_bytes(images)[2:])
    with pytest.raises(pn.DataError, match="bad magic number"):
        read_idx(bad_magic)
    bad_gzip = tmp_path / "bad.gz"
    bad_gzip.write_bytes(gzip.compress(_idx_bytes(images))[:30])
    with pytest.raises(pn.DataError, match="damaged"):
        read_idx(bad_gzip)


def test_missing_dataset_says_where(monkeypatch, tmp_path):
    monkeypatch.setenv("PORTANET_DATA", str(tmp_path))
    monkeypatch.setattr("portanet.config.data_dirs", lambda: [tmp_path])
    with pytest.raises(pn.DataError, match=r"(?s)not found.*Looked in.*download=True"):
        pn.load_dataset("mnist")


def test_save_file_from_another_architecture(net, tmp_path):
    other = pn.mlp((4,), classes=3, hidden=(6,), device="cpu")
    path = tmp_path / "other.safetensors"
    other.save(path)
    with pytest.raises(pn.ModelFileError, match=r"different architecture.*Dense\(6, relu\)"):
        net.load_weights(path)
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not a model")
    with pytest.raises(pn.ModelFileError, match="not a portanet model file"):
        pn.load(junk)


def test_out_of_memory_is_clear_and_recoverable(backend):
    if backend.kind == "cpu":
        pytest.skip("the host has no device memory limit to exceed")
    huge = 1 << 60
    with pytest.raises(pn.OutOfMemoryError, match=r"cannot allocate big one.*smaller batch"):
        backend.empty((huge // 4,), label="big one")
    x = backend.upload(np.ones(10, np.float32))          # still usable
    assert backend.download(x).sum() == 10


# -- API errors that escaped or misled ---------------------------------------------------

def test_fit_arguments_are_checked(net):
    x, y = data()
    with pytest.raises(pn.InputError, match=r"optimizer must be .*pn.SGD.*got 'adam'"):
        net.fit(x, y, optimizer="adam")
    with pytest.raises(pn.InputError, match="epochs must be a whole number >= 1, got 0"):
        net.fit(x, y, epochs=0)
    with pytest.raises(pn.InputError, match="batch_size must be a whole number"):
        net.fit(x, y, batch_size=2.5)
    with pytest.raises(pn.InputError, match="unknown schedule|cannot read the schedule"):
        net.fit(x, y, schedule="sometimes")


@pytest.mark.parametrize("kwargs, message", [
    (dict(lr=float("inf")), "lr must be a finite number"),
    (dict(lr=float("nan")), "lr must be a finite number"),
    (dict(lr=0.1, momentum=1.0), r"momentum must be a finite number in \[0, 1\)"),
    (dict(lr="0.1"), "lr must be a finite number"),
    (dict(lr=0.1, weight_decay=-1), "weight_decay"),
])
def test_sgd_arguments_are_checked(kwargs, message):
    with pytest.raises(pn.InputError, match=message):
        pn.SGD(**kwargs)


def test_layer_arguments_name_the_layer_and_the_fix():
    with pytest.raises(pn.InputError, match=r"Dense: units must be a whole number.*"
                                            r"activation='relu'"):
        pn.Dense("relu")
    with pytest.raises(pn.InputError, match="units must be a whole number >= 1, got True"):
        pn.Dense(True)
    with pytest.raises(pn.InputError, match=r"^conv\(8,3,relux\): Conv2D: unknown activation"):
        pn.from_description("conv(8,3,relux) flatten dense(2, softmax)", (1, 8, 8))
    with pytest.raises(pn.InputError, match=r"Conv2D: filters must"):
        pn.Conv2D(0, 3)
    with pytest.raises(pn.InputError, match="MaxPool2D: stride must"):
        pn.MaxPool2D(2, stride=0)
    with pytest.raises(pn.InputError, match=r"Dropout: rate must be a number in \[0, 1\)"):
        pn.Dropout("half")


def test_description_errors_point_at_the_text():
    with pytest.raises(pn.InputError, match=r"missing '\)' .*'dense\(10, softmax'"):
        pn.from_description("dense(10, softmax", (4,))
    with pytest.raises(pn.InputError, match=r"ready-made model: mlp, lenet"):
        pn.from_description("mlpp", (4,))
    with pytest.raises(pn.InputError, match="whole number"):
        pn.from_description("dense(10 softmax)", (4,))


def test_sequential_arguments_are_checked():
    with pytest.raises(pn.InputError, match="input_shape entries must be a whole number"):
        pn.Sequential([pn.Dense(2, "softmax")], [0], device="cpu")
    with pytest.raises(pn.InputError, match="'dense' is not a layer"):
        pn.Sequential(["dense"], 3, device="cpu")
    with pytest.raises(pn.ShapeError, match="non-empty list of layers"):
        pn.Sequential(pn.Dense(2, "softmax"), 3, device="cpu")


def test_inputs_are_checked_after_the_cast(net):
    """1e39 is a finite float64 but inf in float32: refused, not trained on."""
    x, y = data()
    big = x.astype(np.float64)
    big[4, 1] = 1e39
    with pytest.raises(pn.InputError, match=r"too large for float32.*sample 4"):
        net.fit(big, y)
