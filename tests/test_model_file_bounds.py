"""What a model file or a model description declares is bounded before anything is
allocated or parsed deeply: a layer's parameters must be the file's tensors, of the shapes
the layer would have (so no layer is larger than the bytes the file holds), and the
network must fit the device's memory, before the network is made; Residual blocks nest at
most layers.MAX_NESTING deep, whether from a file, a description or Python."""
import json
import tracemalloc

import numpy as np
import pytest
import safetensors.numpy

import portanet as pn
from portanet import layers as layer_module, models

MAX_NESTING = layer_module.MAX_NESTING
SOFTMAX = ["Dense", {"units": 3, "activation": "softmax"}]


def model_file(tmp_path, layers, input_shape=(6,), tensors=None):
    """A model file of `layers` ([[name, config], ...], or their JSON text) holding
    `tensors` (default: those of Dense(8) -> Dense(3) on 6 inputs, 2 KB)."""
    if tensors is None:
        tensors = {"0.w": np.zeros((8, 6), np.float32), "0.b": np.zeros(8, np.float32),
                   "1.w": np.zeros((3, 8), np.float32), "1.b": np.zeros(3, np.float32)}
    text = layers if isinstance(layers, str) else json.dumps(layers)
    arch = (f'{{"input_shape": {json.dumps(list(input_shape))}, '
            f'"loss": "softmax_cross_entropy", "layers": {text}}}')
    path = tmp_path / "model.safetensors"
    safetensors.numpy.save_file(tensors, str(path), metadata={
        "format": "portanet-model-2", "architecture": arch})
    return path


def refused_small(path, match, limit=16 << 20):
    """pn.load refuses the file with a ModelFileError, and at its peak Python held less
    than `limit` bytes (NumPy's arrays are traced too)."""
    tracemalloc.start()
    try:
        with pytest.raises(pn.ModelFileError, match=match):
            pn.load(path, device="cpu")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < limit, f"{peak} bytes at the peak"


def test_a_huge_layer_over_small_tensors_is_refused_before_allocating(tmp_path):
    """Dense(1_000_000) declared over the tensors of Dense(8): the 2 KB file held its
    parameters (and their random initial values) in memory before it was refused."""
    path = model_file(tmp_path, [["Dense", {"units": 1_000_000, "activation": "relu"}],
                                 SOFTMAX])
    refused_small(path, r"0.w is \(8, 6\) in the file, the layer's is \(1000000, 6\)")


def test_a_layer_whose_tensors_are_missing_is_refused_before_allocating(tmp_path):
    path = model_file(tmp_path, [["Dense", {"units": 8, "activation": "relu"}],
                                 ["Dense", {"units": 1_000_000, "activation": "relu"}],
                                 ["Dense", {"units": 3, "activation": "softmax"}]])
    refused_small(path, "missing: 2.b, 2.w")


def test_a_network_larger_than_the_device_is_refused_by_its_declared_size(tmp_path):
    """Parameters beyond the device's memory are refused as such (the bytes it would
    need), and so is one sample's activations beyond it (an input of 10**13 values)."""
    path = model_file(tmp_path, [["Dense", {"units": 10**6}], SOFTMAX], (10**6,))
    refused_small(path, r"TiB.*parameters")
    path = model_file(tmp_path, [["GlobalAvgPool2D", {}], SOFTMAX], (8, 10**6, 10**6),
                      {"1.w": np.zeros((3, 8), np.float32), "1.b": np.zeros(3, np.float32)})
    refused_small(path, "TiB.*one sample")


def test_the_files_own_network_loads(tmp_path):
    path = model_file(tmp_path, [["Dense", {"units": 8, "activation": "relu"}], SOFTMAX])
    assert pn.load(path, device="cpu").predict(np.ones((2, 6), np.float32)).shape == (2, 3)


# -- a Residual block's projection ----------------------------------------------------


def brute_stride(inp, out):
    for stride in range(1, max(inp[1:]) + 1):
        if ((inp[1] - 1) // stride + 1, (inp[2] - 1) // stride + 1) == tuple(out[1:]):
            return stride
    return None


def test_the_projection_stride_is_the_smallest_that_fits():
    for h in range(1, 14):
        for w in range(1, 14):
            for oh in range(1, h + 1):
                for ow in (1, max(1, w // 2), w):
                    block = pn.Residual([pn.Dense(1)])
                    block.in_shape, want = (2, h, w), brute_stride((2, h, w), (3, oh, ow))
                    if want is None:
                        with pytest.raises(pn.ShapeError, match="1x1 convolution"):
                            block._projection((3, oh, ow))
                    else:
                        assert block._projection((3, oh, ow)).stride == want, (h, w, oh, ow)


def test_an_unmatchable_projection_is_refused_without_trying_every_stride(monkeypatch):
    """(1, 1, 10**12) images made larger inside the block: no stride matches, which was
    found by trying each of 10**12."""
    calls = []
    real = layer_module.conv_out

    def counted(*args):
        calls.append(args)
        assert len(calls) < 1000, "conv_out called for stride after stride"
        return real(*args)
    for module in (layer_module.dense, layer_module.blocks):    # where layers call it
        monkeypatch.setattr(module, "conv_out", counted)
    block = pn.Residual([pn.Conv2D(1, 1, padding=1)])
    with pytest.raises(pn.ShapeError, match="1x1 convolution"):
        block.configure(pn.device("cpu"), (1, 1, 10**12))


# -- nesting --------------------------------------------------------------------------


def nested_description(depth):
    return "residual(" * depth + "dense(4)" + ", relu)" * depth + " dense(3, softmax)"


def nested_config(depth):
    config = ["Dense", {"units": 4}]
    for _ in range(depth):
        config = ["Residual", {"layers": [config], "activation": "relu"}]
    return config


def test_residual_blocks_nest_up_to_the_limit_and_save_and_load(tmp_path):
    net = models.from_description(nested_description(MAX_NESTING), 4, device="cpu")
    path = tmp_path / "deep.safetensors"
    net.save(path)
    loaded = pn.load(path, device="cpu")
    x = np.ones((2, 4), np.float32)
    assert np.array_equal(loaded.predict(x), net.predict(x))


@pytest.mark.parametrize("depth", [MAX_NESTING + 1, 400, 5000])
def test_deeper_nesting_is_a_portanet_error_everywhere(tmp_path, depth):
    with pytest.raises(pn.InputError, match=f"more than the {MAX_NESTING}"):
        models.parse(nested_description(depth))
    with pytest.raises(pn.InputError, match=f"more than the {MAX_NESTING}"):
        layer_module.from_config(*nested_config(depth))
    if depth < 500:             # built in Python (a deeper list would need the recursion)
        block = pn.Dense(4)
        with pytest.raises(pn.InputError, match=f"more than the {MAX_NESTING}"):
            for _ in range(depth):
                block = pn.Residual([block], "relu")
    text = ('[["Residual", {"layers": [' * depth + '["Dense", {"units": 4}]'
            + '], "activation": "relu"}]' * depth + f", {json.dumps(SOFTMAX)}]")
    with pytest.raises(pn.ModelFileError, match=r"nested \d+ levels|nest \d+ or more deep"):
        pn.load(model_file(tmp_path, text, (4,), {}), device="cpu")

