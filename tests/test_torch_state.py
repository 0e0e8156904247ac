"""PyTorch state dicts onto portanet networks. The state dicts here are what a
torch.nn.Sequential's state_dict() holds (names, shapes, PyTorch's layouts), made without
torch; the oracle is ONNX Runtime running the same tensors in PyTorch's layouts (Conv's
(F, C, k, k) weights, Gemm with transB), so that a mapping that scrambles a layout shows.
tests/test_torch_interop.py does the same with torch itself where it is installed."""
import numpy as np
import pytest
import safetensors.numpy

import portanet as pn
from portanet import onnx_export
from portanet.errors import InputError, ModelFileError, ShapeError

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def lenet_state(rng):
    """nn.Sequential(Conv2d(1, 4, 3), ReLU(), Conv2d(4, 6, 3, stride=2, bias=False),
    BatchNorm2d(6), ReLU(), MaxPool2d(2), Flatten(), Linear(54, 10))'s state dict."""
    f = lambda *s: rng.standard_normal(s).astype(np.float32) * 0.3   # noqa: E731
    return {"0.weight": f(4, 1, 3, 3), "0.bias": f(4), "2.weight": f(6, 4, 3, 3),
            "3.weight": 1 + f(6), "3.bias": f(6), "3.running_mean": f(6),
            "3.running_var": 1 + np.abs(f(6)), "3.num_batches_tracked": np.array(7),
            "7.weight": f(10, 54), "7.bias": f(10)}


def lenet_net(device="cpu"):
    return pn.Sequential([pn.Conv2D(4, 3, activation="relu"), pn.Conv2D(6, 3, stride=2),
                          pn.BatchNorm("relu"), pn.MaxPool2D(2), pn.Flatten(),
                          pn.Dense(10, "softmax")], (1, 16, 16), device=device)


def torch_layout_predictions(state, x):
    """The Sequential of lenet_state in ONNX Runtime, tensors in PyTorch's layouts."""
    n = helper.make_node
    inits = dict(state, zero_bias=np.zeros(6, np.float32))
    inits.pop("3.num_batches_tracked")
    nodes = [n("Conv", ["x", "0.weight", "0.bias"], ["c1"], kernel_shape=[3, 3]),
             n("Relu", ["c1"], ["r1"]),
             n("Conv", ["r1", "2.weight", "zero_bias"], ["c2"], kernel_shape=[3, 3],
               strides=[2, 2]),
             n("BatchNormalization", ["c2", "3.weight", "3.bias", "3.running_mean",
                                      "3.running_var"], ["b"], epsilon=1e-5),
             n("Relu", ["b"], ["r2"]), n("MaxPool", ["r2"], ["p"], kernel_shape=[2, 2],
                                         strides=[2, 2]),
             n("Flatten", ["p"], ["f"]), n("Gemm", ["f", "7.weight", "7.bias"], ["z"], transB=1),
             n("Softmax", ["z"], ["y"], axis=1)]
    graph = helper.make_graph(
        nodes, "torch", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    model = onnx_export.make_model(graph, 17)
    runtime = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return runtime.run(None, {"x": x})[0]


def test_a_sequential_state_dict_predicts_as_in_pytorch_layouts(rng, device_name):
    state = lenet_state(rng)
    net = lenet_net(device_name)
    pn.load_torch_state(net, state)
    x = rng.random((9, 1, 16, 16), dtype=np.float32)
    assert np.abs(net.predict(x) - torch_layout_predictions(state, x)).max() <= 1e-5
    w = net.get_weights()
    assert np.array_equal(w["0.w"], state["0.weight"].reshape(4, 9))
    assert np.array_equal(w["1.b"], np.zeros(6))                # bias=False: zero
    assert np.array_equal(w["2.running_var"], state["3.running_var"])


def test_files_modules_and_checkpoints(rng, tmp_path):
    state = lenet_state(rng)
    del state["3.num_batches_tracked"]                 # safetensors.numpy: no 0-d int
    path = tmp_path / "lenet.safetensors"
    safetensors.numpy.save_file({k: np.ascontiguousarray(v) for k, v in state.items()},
                                str(path))
    from_file, from_module = lenet_net(), lenet_net()
    pn.load_torch_state(from_file, path)

    class Module:                                       # anything with state_dict()
        def state_dict(self):
            return state
    pn.load_torch_state(from_module, Module())
    x = rng.random((4, 1, 16, 16), dtype=np.float32)
    assert np.array_equal(from_file.predict(x), from_module.predict(x))
    with pytest.raises(ModelFileError, match="not a file"):
        pn.load_torch_state(lenet_net(), tmp_path / "missing.pt")


def test_a_pickle_needs_torch(tmp_path):
    import importlib.util
    if importlib.util.find_spec("torch"):
        pytest.skip("torch is installed here; tests/test_torch_interop.py reads .pt files")
    path = tmp_path / "model.pt"
    path.write_bytes(b"PK\x03\x04")
    with pytest.raises(InputError, match="only torch reads.*safetensors"):
        pn.load_torch_state(lenet_net(), path)


@pytest.mark.parametrize("change, error, words", [
    (lambda s: [s.pop("7.bias"), s.pop("7.weight")], ShapeError,
     "3 modules with tensors .*4 layers"),
    (lambda s: s.update({"7.weight": np.zeros((10, 55), np.float32)}), ShapeError,
     r"7.weight has shape \(10, 55\); layer 5 .* needs \(10, 54\)"),
    (lambda s: s.update({"0.weight": np.zeros((4, 1, 5, 5), np.float32)}), ShapeError,
     r"0.weight has shape \(4, 1, 5, 5\).*Conv2d weight of \(4, 1, 3, 3\)"),
    (lambda s: s.update({"3.extra": np.zeros(6, np.float32)}), ShapeError,
     "module 3 .*extra.* does not match layer 2"),
    (lambda s: s["0.bias"].__setitem__(1, np.nan), InputError, "0.bias is not a finite"),
    (lambda s: s.update({"0.bias": np.arange(4)}), InputError, "0.bias is not a finite float"),
])
def test_a_state_dict_that_does_not_match_is_refused_before_anything_is_written(
        rng, change, error, words):
    net = lenet_net()
    before = net.get_weights()
    state = lenet_state(rng)
    change(state)
    with pytest.raises(error, match=words):
        pn.load_torch_state(net, state)
    after = net.get_weights()
    assert all(np.array_equal(before[k], after[k]) for k in before)
