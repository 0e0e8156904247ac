"""A GPT to ONNX and back: token ids (N, T) in (int64), Gather of the table and Add of the
positions, (N, T, features) through LayerNormalization, MatMul + Add a token at a time,
and the attention as MatMul + Add, Split and ONNX's Attention (opset 23) with its
projection; a softmax over the last axis. ONNX Runtime must agree with portanet within
1e-5, and the import must be the same network with the same weights (so the same
predictions bit for bit), which trains on; only the attention's dropout stays behind
(ONNX's Attention has none)."""
import numpy as np
import pytest

import portanet as pn
from portanet import onnx_export
from portanet.errors import InputError

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402
from test_onnx import TOLERANCE, run_ort  # noqa: E402

VOCAB, T = 11, 8


def gpt(rng, causal=True):
    """A small GPT (two blocks) whose biases and norms are away from 0 and 1."""
    net = pn.gpt(VOCAB, T, layers=2, heads=2, dim=16, dropout=0.1, device="cpu", seed=1)
    if not causal:
        net = pn.from_description(
            f"embedding({VOCAB}, 16, positions=true) residual(layernorm attention(4, "
            f"causal=false)) layernorm dense({VOCAB}, softmax)", (T,), device="cpu", seed=1)
    w = net.get_weights()
    for name, value in w.items():
        if name.endswith(("b", "b_qkv", "b_o", "beta", "gamma")):
            value += 0.2 * rng.standard_normal(value.shape)
    net.set_weights(w)
    return net


@pytest.mark.parametrize("causal", [True, False])
def test_a_gpt_goes_out_and_comes_back(rng, tmp_path, causal):
    net = gpt(rng, causal)
    path = tmp_path / "gpt.onnx"
    net.to_onnx(path)
    model = onnx.load(path)
    assert model.opset_import[0].version == onnx_export.ATTENTION_OPSET
    assert model.graph.input[0].type.tensor_type.elem_type == TensorProto.INT64
    x = rng.integers(0, VOCAB, (6, T))
    want = net.predict(x)
    assert want.shape == (6, T, VOCAB)
    assert np.abs(run_ort(path, x.astype(np.int64)) - want).max() <= TOLERANCE
    back = pn.from_onnx(path)
    # the same layers, but the attention's dropout: ONNX's Attention has none
    leaves = [repr(pn.MultiHeadAttention(l.heads, l.causal))
              if isinstance(l, pn.MultiHeadAttention) else repr(l)
              for _, l in net.walk() if not isinstance(l, pn.Residual)]
    assert [repr(l) for _, l in back.walk() if not isinstance(l, pn.Residual)] == leaves
    ours, theirs = net.get_weights(), back.get_weights()
    assert sorted(ours) == sorted(theirs)
    assert all(np.array_equal(ours[k], theirs[k]) for k in ours)
    assert np.array_equal(back.predict(x), want)
    y = rng.integers(0, VOCAB, (6, T))
    before = back.evaluate(x, y)[0]
    back.fit(x, y, epochs=5, batch_size=6, optimizer=pn.AdamW(1e-2), verbose=0)
    assert back.evaluate(x, y)[0] < before


def test_attention_needs_opset_23(rng, tmp_path):
    with pytest.raises(InputError, match="Attention from opset 23"):
        gpt(rng).to_onnx(tmp_path / "old.onnx", opset=20)
    assert not (tmp_path / "old.onnx").exists()


def _graph(nodes, inits, out_shape=(T, 12)):
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", T])
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", *out_shape])
    graph = helper.make_graph(nodes, "g", [ids], [out], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)],
                             ir_version=10)


def _const(name, value):
    return onnx.numpy_helper.from_array(np.asarray(value), name)


@pytest.mark.parametrize("nodes, said", [
    ([helper.make_node("Gather", ["table", "ids"], ["e"], axis=0),
      helper.make_node("Split", ["e", "three"], ["q", "k", "v"], axis=2),
      helper.make_node("Attention", ["q", "k", "v"], ["y"], q_num_heads=2, kv_num_heads=1)],
     "heads other than q's and kv's alike"),
    ([helper.make_node("Gather", ["table", "ids"], ["e"], axis=0),
      helper.make_node("Split", ["e", "three"], ["q", "k", "v"], axis=2),
      helper.make_node("Attention", ["q", "k", "v"], ["y"], q_num_heads=2, kv_num_heads=2)],
     "portanet's takes q, k and v from one product"),
    ([helper.make_node("Gather", ["table", "ids"], ["y"], axis=1)],
     "a Gather other than of a table's rows"),
    ([helper.make_node("Gather", ["table", "ids"], ["e"], axis=0),
      helper.make_node("MatMul", ["e", "w"], ["qkv"]),
      helper.make_node("Split", ["qkv", "three"], ["q", "k", "v"], axis=2),
      helper.make_node("Attention", ["q", "k", "v"], ["y"], q_num_heads=2, kv_num_heads=2)],
     "the graph ends at an Attention"),
])
def test_what_a_gpt_import_cannot_represent_is_named(nodes, said):
    model = _graph(nodes, [_const("table", np.ones((VOCAB, 12), np.float32)),
                           _const("w", np.ones((12, 12), np.float32)),
                           _const("three", np.array([4, 4, 4], np.int64))],
                   (T, 4) if nodes[-1].op_type == "Attention" else (T, 12))
    with pytest.raises(InputError, match=said):
        pn.from_onnx(model)


def test_a_flattened_sequence_goes_out_and_comes_back(rng, tmp_path):
    """Flatten after a sequence: portanet flattens a sample's (features, T), ONNX's stream
    is (N, T, features), so a Transpose goes before the Flatten, and comes back as the
    Flatten."""
    net = pn.Sequential([pn.Embedding(VOCAB, 3, positions=True), pn.Flatten(),
                         pn.Dense(4, "softmax")], (T,), device="cpu", seed=2)
    path = tmp_path / "flat.onnx"
    net.to_onnx(path)
    x = rng.integers(0, VOCAB, (5, T))
    assert np.abs(run_ort(path, x.astype(np.int64)) - net.predict(x)).max() <= TOLERANCE
    back = pn.from_onnx(path)
    assert [type(l).__name__ for l in back.layers] == ["Embedding", "Flatten", "Dense"]
    assert np.array_equal(back.predict(x), net.predict(x))
