"""Networks to ONNX (the extra `onnx`), and the vocabulary export and import share.

Export writes each layer as the ONNX operators of its inference form: Dense -> Gemm,
Conv2D -> Conv, activations as their operators, the pools, Flatten, BatchNorm ->
BatchNormalization with the running statistics, LayerNorm -> LayerNormalization (over the
features; over the channels of images, between two Transposes), Residual -> its layers,
the shortcut and Add, Dropout -> Dropout (the identity in inference, kept so that an import trains as the
network did). The input is samples-first, (N, C, H, W) or (N, F), as users feed predict,
with N left free.

A sequence (a network from Embedding: token ids (N, T) in, int64) is (N, T, features) in
the graph, as PyTorch holds one: Embedding -> Gather of its table (+ Add of the positions'
rows), Dense a token at a time -> MatMul + Add, LayerNorm -> LayerNormalization over the
features, MultiHeadAttention -> MatMul + Add of q, k and v, Split, ONNX's Attention (opset
23: the heads, causal) and MatMul + Add of the output projection; a softmax output is over
the last axis. It takes a network that exists and imports no network: the way back,
portanet.from_onnx, is onnx_import.py's.
"""
import math

import numpy as np

from . import checkpoint, layers as L
from .errors import InputError

OPSET = 17                 # the default: read by ONNX Runtime, TensorRT and OpenVINO alike
MIN_OPSET = 13             # Softmax over one axis, Unsqueeze's axes as an input
GELU_OPSET = 20            # the first opset with a Gelu operator
LAYERNORM_OPSET = 17       # the first with LayerNormalization
ATTENTION_OPSET = 23       # the first with Attention (scaled dot-product, heads, causal)

# ONNX activation operators <-> portanet's activations (LeakyRelu and Elu with the
# alpha portanet's kernels use)
ACTIVATIONS = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Softmax": "softmax",
               "LeakyRelu": "leaky_relu", "Elu": "elu", "Gelu": "gelu"}
ALPHA = {"LeakyRelu": 0.01, "Elu": 1.0}


def require_onnx():
    """The onnx package, or an InputError saying how to install it."""
    try:
        import onnx
    except ImportError as e:
        raise InputError("ONNX export and import need the onnx package: pip install "
                         "'portanet[onnx]'") from e
    return onnx


def to_onnx(net, path, opset=None):
    """Write `net` as an ONNX model to `path` (atomically), its input samples-first with
    a free batch dimension; checked with onnx.checker before it is written. opset: where
    None, OPSET, or ATTENTION_OPSET for a network with attention."""
    onnx = require_onnx()
    opset = default_opset(net) if opset is None else opset
    newest = onnx.defs.onnx_opset_version()
    if isinstance(opset, bool) or not isinstance(opset, int) or not MIN_OPSET <= opset <= newest:
        raise InputError(f"opset must be a whole number from {MIN_OPSET} to {newest} (this "
                         f"onnx package's newest), got {opset!r}")
    model = export_model(net, opset)
    onnx.checker.check_model(model, full_check=True)
    return checkpoint.write_atomically(path, lambda tmp: onnx.save_model(model, tmp),
                                       "the ONNX model")


def default_opset(net):
    """The opset an export takes unless told: OPSET, the first with Attention where the
    network has one."""
    attention = any(isinstance(layer, L.MultiHeadAttention) for _, layer in net.walk())
    return ATTENTION_OPSET if attention else OPSET


def export_model(net, opset=None):
    """The ModelProto of `net` (see to_onnx)."""
    opset = default_opset(net) if opset is None else opset
    onnx = require_onnx()
    g = _Builder(onnx, opset)
    weights = net.get_weights()
    ids = isinstance(net.layers[0], L.Embedding)
    g.value_info("input", net.input_shape, ids=ids)
    x, shape = "input", net.input_shape
    for path, layer in zip(map(str, range(len(net.layers))), net.layers):
        x, shape = g.layer(layer, path, x, shape, weights)
    g.node("Identity", [x], out="output")
    graph = onnx.helper.make_graph(g.nodes, "portanet", [g.inputs[0]],
                                   [g.value_info("output", net.output_shape)], g.initializers)
    model = make_model(graph, opset, producer_name="portanet")
    from . import __version__
    model.producer_version = __version__
    return model


def make_model(graph, opset, **fields):
    """A ModelProto of `graph` in the default domain's `opset`, stamped with the oldest IR
    version that has that opset, not the newest that onnx knows: any runtime that runs the
    opset then reads the file (an older onnxruntime refuses a newer IR than its own)."""
    helper = require_onnx().helper
    opsets = [helper.make_opsetid("", opset)]
    return helper.make_model(graph, opset_imports=opsets,
                             ir_version=helper.find_min_ir_version_for(opsets), **fields)


class _Builder:
    """The nodes and initializers of an export, as they are made."""

    def __init__(self, onnx, opset):
        self.onnx, self.opset = onnx, opset
        self.nodes, self.initializers, self.inputs = [], [], []
        self.count = 0

    def value_info(self, name, shape, ids=False):
        """A value of per-sample `shape`: a sequence (features, T) as (N, T, features);
        ids: token ids, int64."""
        dims = ["N", shape[1], shape[0]] if isinstance(shape, L.Tokens) else ["N", *shape]
        info = self.onnx.helper.make_tensor_value_info(
            name, self.onnx.TensorProto.INT64 if ids else self.onnx.TensorProto.FLOAT, dims)
        if name == "input":
            self.inputs.append(info)
        return info

    def node(self, op, inputs, out=None, **attrs):
        self.count += 1
        out = out or f"{op.lower()}_{self.count}"
        self.nodes.append(self.onnx.helper.make_node(op, inputs, [out], name=f"{op}_{self.count}",
                                                     **attrs))
        return out

    def const(self, name, value):
        """An initializer: float32, or an int64 array as it is (shapes, splits)."""
        value = np.asarray(value)
        dtype = np.int64 if value.dtype == np.int64 else np.float32
        self.initializers.append(self.onnx.numpy_helper.from_array(
            np.array(value, dtype=dtype, order="C"), name))
        return name

    def layer(self, layer, path, x, shape, weights):
        """The nodes of one layer on x, of per-sample shape; (output, its shape)."""
        kind = type(layer).__name__
        if isinstance(layer, L.Conv2D):
            k, s, p = layer.k, layer.stride, layer.pad
            w = weights[f"{path}.w"].reshape(layer.units, shape[0], k, k)
            x = self.node("Conv", [x, self.const(f"{path}.w", w),
                                   self.const(f"{path}.b", weights[f"{path}.b"])],
                          kernel_shape=[k, k], strides=[s, s], pads=[p, p, p, p])
        elif isinstance(layer, L.Embedding):
            x = self.node("Gather", [self.const(f"{path}.table", weights[f"{path}.table"]), x],
                          axis=0)
            if layer.positions:
                x = self.node("Add", [x, self.const(f"{path}.pos", weights[f"{path}.pos"])])
        elif isinstance(layer, L.MultiHeadAttention):
            x = self.attention(layer, path, x, weights)
        elif isinstance(layer, L.Dense) and layer.tokens_of(shape):
            x = self.tokens_dense(path, x, weights[f"{path}.w"], weights[f"{path}.b"])
        elif isinstance(layer, L.Dense):
            if len(shape) != 1:
                x = self.node("Flatten", [x], axis=1)
            x = self.node("Gemm", [x, self.const(f"{path}.w", weights[f"{path}.w"]),
                                   self.const(f"{path}.b", weights[f"{path}.b"])], transB=1)
        elif isinstance(layer, L.GlobalAvgPool2D):
            x = self.node("Flatten", [self.node("GlobalAveragePool", [x])], axis=1)
        elif isinstance(layer, L._Pool2D):
            op = "MaxPool" if isinstance(layer, L.MaxPool2D) else "AveragePool"
            x = self.node(op, [x], kernel_shape=[layer.pool] * 2, strides=[layer.stride] * 2)
        elif isinstance(layer, L.Flatten):
            if isinstance(shape, L.Tokens):     # (N, T, features) -> portanet's (features, T)
                x = self.node("Transpose", [x], perm=[0, 2, 1])
            if len(shape) != 1:
                x = self.node("Flatten", [x], axis=1)
        elif isinstance(layer, L.BatchNorm):
            x = self.node("BatchNormalization", [x] + [
                self.const(f"{path}.{name}", weights[f"{path}.{name}"])
                for name in ("gamma", "beta", "running_mean", "running_var")],
                epsilon=layer.eps, momentum=1.0 - layer.momentum)
        elif isinstance(layer, L.LayerNorm):
            x = self.layernorm(layer, path, x, shape, weights)
        elif isinstance(layer, L.Residual):
            x = self.residual(layer, path, x, shape, weights)
        elif isinstance(layer, L.Dropout):       # the identity in inference; kept for import
            x = self.node("Dropout", [x, self.const(f"{path}.ratio", np.float32(layer.rate))])
        else:
            raise InputError(f"{layer}: no ONNX form for {kind} layers")
        return self.activation(getattr(layer, "activation", "linear"), x,
                               isinstance(layer.out_shape, L.Tokens)), layer.out_shape

    def tokens_dense(self, path, x, w, b, name="w", bias="b"):
        """x (N, T, in) times w^T plus b: a Dense a token at a time."""
        x = self.node("MatMul", [x, self.const(f"{path}.{name}", np.ascontiguousarray(w.T))])
        return self.node("Add", [x, self.const(f"{path}.{bias}", b)])

    def attention(self, layer, path, x, weights):
        """q, k and v of every token from one product, split; ONNX's Attention over them
        (its heads, causal); the output projection."""
        if self.opset < ATTENTION_OPSET:
            raise InputError(f"{layer}: ONNX has Attention from opset {ATTENTION_OPSET}; "
                             f"export with opset={ATTENTION_OPSET} or later")
        d = layer.dim
        qkv = self.tokens_dense(path, x, weights[f"{path}.w_qkv"], weights[f"{path}.b_qkv"],
                                "w_qkv", "b_qkv")
        parts = [f"{qkv}_{part}" for part in "qkv"]
        self.count += 1
        self.nodes.append(self.onnx.helper.make_node(
            "Split", [qkv, self.const(f"{path}.split", np.array([d, d, d], np.int64))], parts,
            name=f"Split_{self.count}", axis=2))
        y = self.node("Attention", parts, is_causal=int(layer.causal), q_num_heads=layer.heads,
                      kv_num_heads=layer.heads)
        return self.tokens_dense(path, y, weights[f"{path}.w_o"], weights[f"{path}.b_o"],
                                 "w_o", "b_o")

    def layernorm(self, layer, path, x, shape, weights):
        """LayerNormalization over the last axis: the features, or the channels of images
        moved there and back."""
        if self.opset < LAYERNORM_OPSET:
            raise InputError(f"{layer}: ONNX has LayerNormalization from opset "
                             f"{LAYERNORM_OPSET}; export with opset={LAYERNORM_OPSET} or later")
        images = len(shape) == 3
        if images:
            x = self.node("Transpose", [x], perm=[0, 2, 3, 1])
        x = self.node("LayerNormalization", [x, self.const(f"{path}.gamma", weights[f"{path}.gamma"]),
                                             self.const(f"{path}.beta", weights[f"{path}.beta"])],
                      axis=-1, epsilon=layer.eps)
        return self.node("Transpose", [x], perm=[0, 3, 1, 2]) if images else x

    def residual(self, block, path, x, shape, weights):
        inner, inner_shape = x, shape
        for i, layer in enumerate(block.layers):
            inner, inner_shape = self.layer(layer, f"{path}.{i}", inner, inner_shape, weights)
        shortcut = x
        if block.projection:
            shortcut, _ = self.layer(block.projection, f"{path}.proj", x, shape, weights)
        return self.node("Add", [inner, shortcut])

    def activation(self, kind, x, tokens=False):
        """The activation's nodes on x; a softmax over the features (the last axis of a
        sequence's (N, T, features))."""
        if kind == "linear":
            return x
        if kind == "silu":                                     # x sigmoid(x)
            return self.node("Mul", [x, self.node("Sigmoid", [x])])
        op = next(op for op, act in ACTIVATIONS.items() if act == kind)
        if op == "Gelu" and self.opset < GELU_OPSET:     # 0.5 x (1 + erf(x / sqrt 2))
            scaled = self.node("Div", [x, self.const(f"sqrt2_{self.count}", math.sqrt(2))])
            one = self.node("Add", [self.node("Erf", [scaled]),
                                    self.const(f"one_{self.count}", 1.0)])
            return self.node("Mul", [self.node("Mul", [x, one]),
                                     self.const(f"half_{self.count}", 0.5)])
        attrs = {"axis": -1 if tokens else 1} if op == "Softmax" else \
            {"alpha": ALPHA[op]} if op in ALPHA else {}
        return self.node(op, [x], **attrs)
