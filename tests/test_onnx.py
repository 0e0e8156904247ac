"""ONNX out and in. Networks trained in portanet on Fashion-MNIST, exported,
predict the test set in ONNX Runtime as in portanet (max abs difference <= 1e-5); the
export read back predicts the same on every device. Graphs written here the way PyTorch's
exporter writes them (MatMul + Add for Linear, a view's Shape arithmetic for Reshape,
relu after max pooling, "out += identity") are read and checked against ONNX Runtime,
and what portanet cannot read is an InputError naming the node."""
import numpy as np
import pytest
from click.testing import CliRunner

import portanet as pn
from portanet import onnx_export
from portanet.cli import main
from portanet.errors import InputError, ModelFileError

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
try:                            # the test extra has it; the GPU machine runs the rest
    import onnxruntime as ort
except ImportError:
    ort = None

TOLERANCE = 1e-5            # the issue's: max abs difference of the predictions
TRAIN = 1000                # Fashion-MNIST samples each model trains on, one epoch
TEST = {"mlp": 10000, "lenet": 2000, "resnet": 1000}    # test images predicted


@pytest.fixture(scope="module")
def trained(fashion, tmp_path_factory):
    """{model: (network trained on cpu, its ONNX file)}."""
    (x, y), _ = fashion
    folder = tmp_path_factory.mktemp("onnx")
    out = {}
    for name, optimizer in (("mlp", pn.SGD(0.05)), ("lenet", pn.SGD(0.05)),
                            ("resnet", pn.Adam(0.001))):
        net = pn.models.MODELS[name](input_shape=(784,) if name == "mlp" else (1, 28, 28),
                                     device="cpu")
        xs = x[:TRAIN].reshape(TRAIN, -1) if name == "mlp" else x[:TRAIN]
        net.fit(xs, y[:TRAIN], epochs=1, batch_size=50, optimizer=optimizer)
        path = folder / f"{name}.onnx"
        net.to_onnx(path)
        out[name] = net, path
    return out


def _test_images(fashion, name):
    _, (x, _) = fashion
    x = x[:TEST[name]]
    return x.reshape(len(x), -1) if name == "mlp" else x


def run_ort(model, x):
    """ONNX Runtime's output for x of a model file or ModelProto (skips without it)."""
    if ort is None:
        pytest.skip("onnxruntime is not installed here")
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    runtime = ort.InferenceSession(source, providers=["CPUExecutionProvider"])
    return runtime.run(None, {runtime.get_inputs()[0].name: x})[0]


@pytest.mark.parametrize("name", ["mlp", "lenet", "resnet"])
def test_a_trained_network_predicts_in_onnxruntime_as_in_portanet(trained, fashion, name):
    net, path = trained[name]
    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    dims = model.graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param == "N" and [d.dim_value for d in dims[1:]] == list(net.input_shape)
    x = _test_images(fashion, name)
    ours, theirs = net.predict(x), run_ort(path, x)
    assert np.abs(ours - theirs).max() <= TOLERANCE
    assert np.allclose(ours.sum(axis=1), 1, atol=1e-5)       # the softmax is in the graph
    # and the models learned something, so that equal predictions are not trivially equal
    assert (ours.argmax(axis=1) == fashion[1][1][:len(x)]).mean() > 0.5


@pytest.mark.parametrize("name", ["mlp", "lenet", "resnet"])
def test_the_round_trip_predicts_the_same(trained, fashion, name, device_name):
    net, path = trained[name]
    x = _test_images(fashion, name)[:500 if device_name == "cpu" else 100]
    back = pn.from_onnx(path, device=device_name)
    assert back.loss.name == "softmax_cross_entropy"
    assert back.architecture()["layers"] == [  # the same layers (Dense on images: Flatten)
        l for l in net.architecture()["layers"]]
    got, want = back.predict(x), net.predict(x)
    if device_name == "cpu":
        assert np.array_equal(got, want)
    else:
        assert np.abs(got - want).max() <= TOLERANCE


def test_the_imported_network_trains(trained, fashion, device_name):
    _, path = trained["lenet"]
    (x, y), (xt, yt) = fashion
    net = pn.from_onnx(path, device=device_name)
    before = net.evaluate(xt[:500], yt[:500])
    net.fit(x[TRAIN:TRAIN + 500], y[TRAIN:TRAIN + 500], epochs=1, batch_size=50,
            optimizer=pn.SGD(0.05))
    after = net.evaluate(xt[:500], yt[:500])
    assert after[0] < before[0]


# -- graphs as PyTorch's exporter writes them --------------------------------------------


def _graph(nodes, inits, in_shape, out, name="torchlike", opset=17, batch="batch_size"):
    graph = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info("input.1", TensorProto.FLOAT, [batch, *in_shape])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, [batch, None])],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    model = onnx_export.make_model(graph, opset)
    onnx.checker.check_model(model)
    return model


def _f32(rng, *shape, scale=0.3):
    return (scale * rng.standard_normal(shape)).astype(np.float32)


def torchlike_lenet(rng):
    """conv -> relu(max_pool(.)) -> conv -> relu -> x.view(x.size(0), -1) -> MatMul + Add
    -> relu -> Gemm: LeNet as torch's TorchScript exporter writes it."""
    n = helper.make_node
    inits = {"conv1.weight": _f32(rng, 6, 1, 5, 5), "conv1.bias": _f32(rng, 6),
             "conv2.weight": _f32(rng, 16, 6, 3, 3), "conv2.bias": _f32(rng, 16),
             "fc1.weight_t": _f32(rng, 16 * 6 * 6, 32, scale=0.05),
             "fc1.bias": _f32(rng, 32),
             "fc2.weight": _f32(rng, 10, 32), "fc2.bias": _f32(rng, 10),
             "zero": np.array(0, np.int64), "minus_one": np.array([-1], np.int64),
             "axes": np.array([0], np.int64)}
    nodes = [
        n("Conv", ["input.1", "conv1.weight", "conv1.bias"], ["c1"], name="/conv1/Conv",
          kernel_shape=[5, 5], pads=[2, 2, 2, 2], strides=[1, 1]),
        n("MaxPool", ["c1"], ["p1"], name="/MaxPool", kernel_shape=[2, 2], strides=[2, 2],
          pads=[0, 0, 0, 0], ceil_mode=0),
        n("Relu", ["p1"], ["r1"], name="/Relu"),
        n("Conv", ["r1", "conv2.weight", "conv2.bias"], ["c2"], name="/conv2/Conv",
          kernel_shape=[3, 3], strides=[2, 2]),
        n("Relu", ["c2"], ["r2"], name="/Relu_1"),
        n("Shape", ["r2"], ["s"], name="/Shape"),
        n("Gather", ["s", "zero"], ["g"], name="/Gather", axis=0),
        n("Unsqueeze", ["g", "axes"], ["u"], name="/Unsqueeze"),
        n("Concat", ["u", "minus_one"], ["shape"], name="/Concat", axis=0),
        n("Reshape", ["r2", "shape"], ["flat"], name="/Reshape"),
        n("MatMul", ["flat", "fc1.weight_t"], ["mm"], name="/fc1/MatMul"),
        n("Add", ["fc1.bias", "mm"], ["fc1"], name="/fc1/Add"),
        n("Relu", ["fc1"], ["r3"], name="/Relu_2"),
        n("Dropout", ["r3"], ["d"], name="/dropout/Dropout"),
        n("Gemm", ["d", "fc2.weight", "fc2.bias"], ["logits"], name="/fc2/Gemm",
          alpha=1.0, beta=1.0, transB=1)]
    return _graph(nodes, inits, (1, 28, 28), "logits")


def torchlike_resnet(rng):
    """A stem conv + BN + relu, a block with an identity shortcut and one with a strided
    1x1 projection (torch's "out += identity", "out = relu(out)"), a silu, global average
    pooling, flatten and a Gemm with transB=0."""
    n = helper.make_node
    inits = {}

    def conv(name, x, c_in, c_out, k, stride=1, pad=0):
        inits[f"{name}.weight"] = _f32(rng, c_out, c_in, k, k, scale=1 / np.sqrt(c_in * k * k))
        inits[f"{name}.bias"] = _f32(rng, c_out, scale=0.1)
        return n("Conv", [x, f"{name}.weight", f"{name}.bias"], [name], name=f"/{name}/Conv",
                 kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4)

    def bn(name, x, c):
        inits.update({f"{name}.weight": 1 + _f32(rng, c, scale=0.1),
                      f"{name}.bias": _f32(rng, c, scale=0.1),
                      f"{name}.running_mean": _f32(rng, c, scale=0.1),
                      f"{name}.running_var": np.abs(1 + _f32(rng, c, scale=0.1))})
        return n("BatchNormalization", [x] + [f"{name}.{t}" for t in (
            "weight", "bias", "running_mean", "running_var")], [name], name=f"/{name}/BN",
            epsilon=1e-5, momentum=0.9)

    def relu(x, out):
        return n("Relu", [x], [out], name=f"/{out}/Relu")

    inits["fc.weight_t"] = _f32(rng, 8, 10)
    inits["fc.bias"] = _f32(rng, 10)
    nodes = [conv("stem", "input.1", 3, 4, 3, pad=1), bn("stem_bn", "stem", 4),
             relu("stem_bn", "x0"),
             conv("b1c1", "x0", 4, 4, 3, pad=1), bn("b1bn1", "b1c1", 4), relu("b1bn1", "b1r"),
             conv("b1c2", "b1r", 4, 4, 3, pad=1), bn("b1bn2", "b1c2", 4),
             n("Add", ["b1bn2", "x0"], ["b1sum"], name="/block1/Add"), relu("b1sum", "x1"),
             conv("b2c1", "x1", 4, 8, 3, stride=2, pad=1), bn("b2bn1", "b2c1", 8),
             relu("b2bn1", "b2r"), conv("b2c2", "b2r", 8, 8, 3, pad=1),
             conv("b2down", "x1", 4, 8, 1, stride=2),
             n("Add", ["b2c2", "b2down"], ["b2sum"], name="/block2/Add"),
             n("Sigmoid", ["b2sum"], ["gate"], name="/block2/Sigmoid"),
             n("Mul", ["b2sum", "gate"], ["x2"], name="/block2/Mul"),
             n("GlobalAveragePool", ["x2"], ["gap"], name="/GlobalAveragePool"),
             n("Flatten", ["gap"], ["flat"], name="/Flatten", axis=1),
             n("Gemm", ["flat", "fc.weight_t", "fc.bias"], ["logits"], name="/fc/Gemm")]
    return _graph(nodes, inits, (3, 9, 9), "logits")


@pytest.mark.parametrize("make, shape", [(torchlike_lenet, (1, 28, 28)),
                                         (torchlike_resnet, (3, 9, 9))])
def test_graphs_as_pytorch_writes_them_predict_as_in_onnxruntime(make, shape, rng, tmp_path,
                                                                  device_name):
    model = make(rng)
    path = tmp_path / "model.onnx"
    onnx.save_model(model, str(path))
    x = rng.random((13, *shape), dtype=np.float32)
    net = pn.from_onnx(path, device=device_name)
    assert net.loss.name == "mse"                       # logits: nothing fused with them
    want = run_ort(path, x)
    assert np.abs(net.predict(x) - want).max() <= TOLERANCE * max(1, np.abs(want).max())
    if make is torchlike_resnet:
        kinds = [type(l).__name__ for l in net.layers]
        assert kinds == ["Conv2D", "BatchNorm", "Residual", "Residual", "GlobalAvgPool2D",
                         "Dense"]
        assert net.layers[3].projection is not None and net.layers[3].activation == "silu"
    # a classifier's logits: CrossEntropyLoss's softmax goes into the last layer
    probs = pn.from_onnx(model, device=device_name, loss="softmax_cross_entropy").predict(x)
    e = np.exp(want - want.max(axis=1, keepdims=True))
    assert np.abs(probs - e / e.sum(axis=1, keepdims=True)).max() <= TOLERANCE


@pytest.mark.parametrize("opset", [17, 20])
def test_every_activation_goes_out_and_comes_back(rng, tmp_path, opset):
    # gelu: ONNX's Gelu from opset 20, before it 0.5 x (1 + erf(x / sqrt 2)), as PyTorch
    # writes it too
    acts = ["relu", "sigmoid", "tanh", "leaky_relu", "elu", "gelu", "silu"]
    layers = [pn.Dense(7, a) for a in acts] + [pn.BatchNorm("tanh"), pn.Dropout(0.3),
                                               pn.Dense(1, "sigmoid")]
    net = pn.Sequential(layers, 5, loss="binary_cross_entropy", device="cpu")
    path = tmp_path / "acts.onnx"
    net.to_onnx(path, opset=opset)
    model = onnx.load(str(path))
    ops = {node.op_type for node in model.graph.node}
    assert ("Gelu" in ops) == (opset >= 20) and ("Erf" in ops) == (opset < 20)
    # the IR version of the opset (8 for 17, 9 for 20), not onnx's newest, which an
    # onnxruntime older than the onnx package refuses
    assert model.ir_version == {17: 8, 20: 9}[opset]
    x = rng.standard_normal((11, 5)).astype(np.float32)
    back = pn.from_onnx(path)
    assert [getattr(l, "activation", None) for l in back.layers] == acts + ["tanh", None,
                                                                            "sigmoid"]
    assert back.loss.name == "binary_cross_entropy"
    assert np.array_equal(back.predict(x), net.predict(x))
    assert np.abs(net.predict(x) - run_ort(path, x)).max() <= TOLERANCE


def test_a_part_of_gelus_erf_form_alone_is_refused(rng):
    n = helper.make_node
    model = _graph([n("Div", ["input.1", "sqrt2"], ["d"]), n("Erf", ["d"], ["e"]),
                    n("Add", ["e", "two"], ["out"], name="plus two")],
                   {"sqrt2": np.array(np.sqrt(2), np.float32),
                    "two": np.array(2, np.float32)}, (4,), "out")
    with pytest.raises(InputError, match="'plus two' \\(Add\\).*erf form"):
        pn.from_onnx(model)


def test_pools_and_images_into_dense(rng, tmp_path):
    net = pn.Sequential([pn.Conv2D(3, 3, stride=2, padding=1, activation="elu"),
                         pn.AvgPool2D(2), pn.MaxPool2D(2, stride=1), pn.Dense(4, "softmax")],
                        (2, 13, 11), device="cpu")
    path = tmp_path / "pools.onnx"
    net.to_onnx(path)
    x = rng.standard_normal((5, 2, 13, 11)).astype(np.float32)
    assert np.abs(net.predict(x) - run_ort(path, x)).max() <= TOLERANCE
    assert np.array_equal(pn.from_onnx(path).predict(x), net.predict(x))


def _shifted(net, rng):
    """net with its LayerNorms' gamma and beta away from 1 and 0."""
    for layer in net.layers:
        if isinstance(layer, pn.LayerNorm):
            layer.gamma[...] = 1 + 0.5 * rng.standard_normal(layer.gamma.shape)
            layer.beta[...] = rng.standard_normal(layer.beta.shape)
    return net


def test_layernorm_goes_out_and_comes_back(rng, tmp_path):
    net = _shifted(pn.Sequential([pn.Dense(8, "relu"), pn.LayerNorm(eps=1e-3),
                                  pn.Dense(3, "softmax")], 5, device="cpu"), rng)
    path = tmp_path / "layernorm.onnx"
    net.to_onnx(path)
    x = rng.standard_normal((9, 5)).astype(np.float32)
    assert np.abs(net.predict(x) - run_ort(path, x)).max() <= TOLERANCE
    back = pn.from_onnx(path)
    assert repr(back.layers[1]) == "LayerNorm(eps=0.001)"
    assert np.array_equal(back.predict(x), net.predict(x))
    with pytest.raises(InputError, match="LayerNormalization from opset 17"):
        net.to_onnx(tmp_path / "old.onnx", opset=16)


def test_layernorm_over_channels_goes_out_between_transposes(rng, tmp_path):
    """Over the channels of images: ONNX's LayerNormalization takes the last axis, so the
    channels go there and back. The import reads the features of vectors alone, and names
    the node it cannot read."""
    net = _shifted(pn.Sequential([pn.Conv2D(4, 3, activation="relu"), pn.LayerNorm(),
                                  pn.Flatten(), pn.Dense(2, "softmax")], (1, 6, 6),
                                 device="cpu"), rng)
    path = tmp_path / "channels.onnx"
    net.to_onnx(path)
    x = rng.standard_normal((4, 1, 6, 6)).astype(np.float32)
    assert np.abs(net.predict(x) - run_ort(path, x)).max() <= TOLERANCE
    with pytest.raises(InputError, match=r"\(Transpose\) is not supported"):
        pn.from_onnx(path)


# -- errors ------------------------------------------------------------------------------


def test_an_unsupported_node_is_named(rng):
    n = helper.make_node
    model = _graph([n("Gemm", ["input.1", "w", "b"], ["h"], name="fc", transB=1),
                    n("Softsign", ["h"], ["out"], name="/act/Softsign")],
                   {"w": _f32(rng, 3, 4), "b": _f32(rng, 3)}, (4,), "out")
    with pytest.raises(InputError, match=r"'/act/Softsign' \(Softsign\) is not supported.*"
                                         r"Gemm, MatMul"):
        pn.from_onnx(model)


@pytest.mark.parametrize("node, why", [
    (dict(op_type="Conv", inputs=["input.1", "w4"], kernel_shape=[3, 3], group=2), "group"),
    (dict(op_type="Conv", inputs=["input.1", "w4"], kernel_shape=[3, 3], pads=[1, 0, 1, 0]),
     "square and even"),
    (dict(op_type="MaxPool", inputs=["input.1"], kernel_shape=[2, 2], pads=[1, 1, 1, 1]),
     "pads"),
    (dict(op_type="Flatten", inputs=["input.1"], axis=2), "axis 1"),
])
def test_what_portanet_cannot_represent_is_refused(rng, node, why):
    spec = dict(node)
    op, inputs = spec.pop("op_type"), spec.pop("inputs")
    model = _graph([helper.make_node(op, inputs, ["out"], name="bad", **spec)],
                   {"w4": _f32(rng, 2, 2, 3, 3)}, (4, 6, 6), "out")
    with pytest.raises(InputError, match=f"'bad' \\({op}\\).*{why}"):
        pn.from_onnx(model)


def test_files_that_are_not_onnx(tmp_path):
    with pytest.raises(ModelFileError, match="cannot read"):
        pn.from_onnx(tmp_path / "missing.onnx")
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\xff" * 100)
    with pytest.raises(ModelFileError, match="junk.onnx"):
        pn.from_onnx(junk)
    with pytest.raises(InputError, match="a path or an onnx.ModelProto"):
        pn.from_onnx(42)
    graph = helper.make_graph(
        [helper.make_node("Relu", ["nowhere"], ["out"])], "broken",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 3])])
    broken = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ModelFileError, match="not a valid ONNX model.*nowhere"):
        pn.from_onnx(broken)


def test_a_bad_opset_and_a_failed_export_leave_the_old_file(tmp_path, monkeypatch):
    net = pn.mlp((4,), classes=3, hidden=(5,), device="cpu")
    path = tmp_path / "net.onnx"
    net.to_onnx(path)
    before = path.read_bytes()
    for opset in (12, 10**6, "17"):
        with pytest.raises(InputError, match="opset must be"):
            net.to_onnx(path, opset=opset)

    def broken(model, f):
        with open(f, "wb") as out:
            out.write(b"half a model")
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(onnx, "save_model", broken)
    with pytest.raises(ModelFileError, match="No space left.*unchanged"):
        net.to_onnx(path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["net.onnx"]      # no temp left behind


def test_the_export_command(tmp_path, rng):
    net = pn.lenet(device="cpu")
    net.save(tmp_path / "lenet.safetensors")
    result = CliRunner().invoke(main, ["export", str(tmp_path / "lenet.safetensors"),
                                       str(tmp_path / "lenet.onnx")])
    assert result.exit_code == 0, result.output
    assert "opset 17" in result.output
    x = rng.random((3, 1, 28, 28), dtype=np.float32)
    assert np.abs(run_ort(tmp_path / "lenet.onnx", x) - net.predict(x)).max() <= TOLERANCE
    result = CliRunner().invoke(main, ["export", str(tmp_path / "none.safetensors"),
                                       str(tmp_path / "x.onnx")])
    assert result.exit_code == 1 and "none.safetensors" in result.output


def test_the_onnx_package_missing_is_said(monkeypatch, tmp_path):
    import builtins
    real = builtins.__import__

    def no_onnx(name, *args, **kwargs):
        if name == "onnx":
            raise ImportError("No module named 'onnx'")
        return real(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", no_onnx)
    with pytest.raises(InputError, match=r"portanet\[onnx\]"):
        onnx_export.to_onnx(pn.mlp((4,), 3, (5,), device="cpu"), tmp_path / "x.onnx")


@pytest.mark.parametrize("keepdims", [0, 1])
def test_a_mean_over_the_image_is_global_average_pooling(rng, keepdims):
    n = helper.make_node
    tail = [n("Gemm", ["m", "w", "b"], ["out"], transB=1)] if not keepdims else \
        [n("Flatten", ["m"], ["f"]), n("Gemm", ["f", "w", "b"], ["out"], transB=1)]
    model = _graph([n("Conv", ["input.1", "k", "kb"], ["c"], kernel_shape=[3, 3]),
                    n("ReduceMean", ["c", "axes"], ["m"], keepdims=keepdims), *tail],
                   {"k": _f32(rng, 5, 2, 3, 3), "kb": _f32(rng, 5), "w": _f32(rng, 3, 5),
                    "b": _f32(rng, 3), "axes": np.array([-1, -2], np.int64)}, (2, 7, 6), "out",
                   opset=18)
    x = rng.random((4, 2, 7, 6), dtype=np.float32)
    net = pn.from_onnx(model)
    assert [type(l).__name__ for l in net.layers] == ["Conv2D", "GlobalAvgPool2D", "Dense"]
    over_channels = _graph([n("ReduceMean", ["input.1", "axes"], ["out"], name="mean")],
                           {"axes": np.array([1], np.int64)}, (2, 7, 6), "out", opset=18)
    with pytest.raises(InputError, match="'mean' \\(ReduceMean\\).*rows and columns"):
        pn.from_onnx(over_channels)
    assert np.abs(net.predict(x) - run_ort(model, x)).max() <= TOLERANCE


def test_gemm_row_bias_and_gelu_attributes_as_pytorch_writes_them(rng):
    n = helper.make_node
    model = _graph([n("Gemm", ["input.1", "w", "b"], ["h"], transB=1),
                    n("Gelu", ["h"], ["g"], approximate="none"),
                    n("Gemm", ["g", "w2", "b2"], ["out"], transB=1)],
                   {"w": _f32(rng, 3, 4), "b": _f32(rng, 1, 3), "w2": _f32(rng, 2, 3),
                    "b2": _f32(rng, 2)}, (4,), "out", opset=20)
    net = pn.from_onnx(model)
    assert net.layers[0].activation == "gelu"
    x = rng.standard_normal((5, 4)).astype(np.float32)
    assert np.abs(net.predict(x) - run_ort(model, x)).max() <= TOLERANCE


def test_graphs_whose_tensors_do_not_fit_are_refused(rng):
    n = helper.make_node
    bn = _graph([n("BatchNormalization", ["input.1", "g", "b", "m", "v"], ["out"], name="bn")],
                {"g": _f32(rng, 3), "b": _f32(rng, 4), "m": _f32(rng, 4), "v": _f32(rng, 4)},
                (4,), "out")
    with pytest.raises(InputError, match="gamma for layer 0 .* 3 values, the layer 4"):
        pn.from_onnx(bn)
    tanh = _graph([n("Gelu", ["input.1"], ["out"], name="g", approximate="tanh")], {}, (4,),
                  "out", opset=20)
    with pytest.raises(InputError, match="tanh approximation"):
        pn.from_onnx(tanh)
