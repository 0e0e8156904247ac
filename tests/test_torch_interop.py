"""Models from PyTorch into portanet, where torch is installed (the GPU
machine): a LeNet trained in PyTorch, written by torch.onnx.export (the TorchScript
exporter, and the dynamo one where onnxscript is there) or as a state dict (torch.save),
predicts in portanet on every device as in PyTorch, and trains on from there. PyTorch
runs on the CPU in float32: the oracle is its own computation, not another device's."""
import numpy as np
import pytest

import portanet as pn

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
nn = torch.nn

TOLERANCE = 1e-5        # the issue's, on the probabilities; logits relative to their size
SAMPLES = 2048          # Fashion-MNIST images PyTorch trains on, and portanet fine-tunes on


def torch_lenet():
    """portanet's lenet() in PyTorch, with relu after max pooling as PyTorch code often
    writes it (the import moves it before the pool, where portanet fuses it)."""
    return nn.Sequential(nn.Conv2d(1, 16, 3), nn.ReLU(), nn.Conv2d(16, 32, 3), nn.MaxPool2d(2),
                         nn.ReLU(), nn.Flatten(), nn.Linear(32 * 12 * 12, 10))


class Block(nn.Module):
    def __init__(self, c_in, c_out, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        # torchvision's downsample: a 1x1 convolution and BatchNorm (in eval mode the
        # exporters fold the BatchNorm into the convolution, portanet's projection)
        self.down = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False),
                                  nn.BatchNorm2d(c_out)) if stride > 1 else None

    def forward(self, x):
        out = self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
        out = out + (self.down(x) if self.down is not None else x)
        return torch.relu(out)


def torch_resnet():
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         Block(8, 8, 1), Block(8, 16, 2), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(16, 10))


@pytest.fixture(scope="module")
def trained(fashion):
    """{name: PyTorch model trained one epoch on SAMPLES images, in eval mode}."""
    (x, y), _ = fashion
    out = {}
    for name, make in (("lenet", torch_lenet), ("resnet", torch_resnet)):
        torch.manual_seed(0)
        model = make()
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        for i in range(0, SAMPLES, 64):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(torch.from_numpy(x[i:i + 64])),
                                               torch.from_numpy(y[i:i + 64]))
            loss.backward()
            opt.step()
        out[name] = model.eval()
    return out


def exporters():
    import importlib.util
    return [pytest.param(False, id="torchscript"), pytest.param(
        True, id="dynamo", marks=pytest.mark.skipif(
            not importlib.util.find_spec("onnxscript"),
            reason="the dynamo exporter needs onnxscript"))]


def export(model, path, dynamo):
    x = torch.zeros(2, 1, 28, 28)
    if dynamo:
        torch.onnx.export(model, (x,), str(path), input_names=["input"], dynamo=True,
                          dynamic_shapes=({0: torch.export.Dim("N")},))
    else:
        torch.onnx.export(model, (x,), str(path), input_names=["input"], dynamo=False,
                          output_names=["logits"], dynamic_axes={"input": {0: "N"}},
                          opset_version=17)


def check_predictions(net, model, x):
    with torch.no_grad():
        logits = model(torch.from_numpy(x))
    want = torch.softmax(logits, 1).numpy()
    got = net.predict(x)
    assert np.abs(got - want).max() <= TOLERANCE
    return logits.numpy()


@pytest.mark.parametrize("dynamo", exporters())
@pytest.mark.parametrize("name", ["lenet", "resnet"])
def test_a_model_exported_by_pytorch_predicts_as_in_pytorch(trained, fashion, tmp_path,
                                                            device_name, name, dynamo):
    path = tmp_path / f"{name}.onnx"
    export(trained[name], path, dynamo)
    x = fashion[1][0][:1000]
    logits = pn.from_onnx(path, device=device_name)       # its logits, as PyTorch's
    with torch.no_grad():
        want = trained[name](torch.from_numpy(x)).numpy()
    assert np.abs(logits.predict(x) - want).max() <= TOLERANCE * np.abs(want).max()
    net = pn.from_onnx(path, device=device_name, loss="softmax_cross_entropy")
    check_predictions(net, trained[name], x)


def test_a_lenet_from_pytorch_fine_tunes(trained, fashion, tmp_path, device_name):
    path = tmp_path / "lenet.onnx"
    export(trained["lenet"], path, dynamo=False)
    (x, y), (xt, yt) = fashion
    net = pn.from_onnx(path, device=device_name, loss="softmax_cross_entropy")
    before = net.evaluate(xt[:2000], yt[:2000])
    history = net.fit(x[SAMPLES:2 * SAMPLES], y[SAMPLES:2 * SAMPLES], epochs=1, batch_size=64,
                      optimizer=pn.SGD(0.02))
    after = net.evaluate(xt[:2000], yt[:2000])
    assert np.isfinite(history["loss"][0]) and after[0] < before[0]


def test_a_state_dict_from_pytorch_predicts_as_in_pytorch(trained, fashion, tmp_path,
                                                          device_name):
    model = trained["lenet"]
    path = tmp_path / "lenet.pt"
    torch.save(model.state_dict(), path)
    x = fashion[1][0][:1000]
    for source in (model.state_dict(), model, path):
        net = pn.lenet(device=device_name)
        pn.load_torch_state(net, source)
        check_predictions(net, model, x)


@pytest.mark.parametrize("dynamo", exporters())
def test_gelu_and_silu_from_pytorch(tmp_path, device_name, dynamo):
    """Before opset 20 PyTorch writes gelu as 0.5 x (1 + erf(x / sqrt 2)) (the two exporters
    order the products differently), silu as x * sigmoid(x)."""
    torch.manual_seed(1)
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 32), nn.GELU(), nn.Linear(32, 16),
                          nn.SiLU(), nn.Linear(16, 10)).eval()
    path = tmp_path / "mlp.onnx"
    export(model, path, dynamo)
    net = pn.from_onnx(path, device=device_name)
    assert [getattr(l, "activation", None) for l in net.layers[1:]] == ["gelu", "silu",
                                                                         "linear"]
    x = np.random.default_rng(2).random((50, 1, 28, 28), dtype=np.float32)
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    assert np.abs(net.predict(x) - want).max() <= TOLERANCE * np.abs(want).max()
