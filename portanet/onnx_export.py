"""Networks to ONNX (the extra `onnx`), and the vocabulary export and import share.

Export writes each layer as the ONNX operators of its inference form: Dense -> Gemm,
Conv2D -> Conv, activations as their operators, the pools, Flatten, BatchNorm ->
BatchNormalization with the running statistics, LayerNorm -> LayerNormalization (over the
features; over the channels of images, between two Transposes), Residual -> its layers,
the shortcut and Add, Dropout -> Dropout (the identity in inference, kept so that an import trains as the
network did). The input is samples-first, (N, C, H, W) or (N, F), as users feed predict,
with N left free. It takes a network that exists and imports no network: the way back,
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
    a free batch dimension; checked with onnx.checker before it is written. opset: OPSET
    where None."""
    onnx = require_onnx()
    opset = OPSET if opset is None else opset
    newest = onnx.defs.onnx_opset_version()
    if isinstance(opset, bool) or not isinstance(opset, int) or not MIN_OPSET <= opset <= newest:
        raise InputError(f"opset must be a whole number from {MIN_OPSET} to {newest} (this "
                         f"onnx package's newest), got {opset!r}")
    model = export_model(net, opset)
    onnx.checker.check_model(model, full_check=True)
    return checkpoint.write_atomically(path, lambda tmp: onnx.save_model(model, tmp),
                                       "the ONNX model")


def export_model(net, opset=OPSET):
    """The ModelProto of `net` (see to_onnx)."""
    onnx = require_onnx()
    g = _Builder(onnx, opset)
    weights = net.get_weights()
    g.value_info("input", net.input_shape)
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

    def value_info(self, name, shape):
        info = self.onnx.helper.make_tensor_value_info(
            name, self.onnx.TensorProto.FLOAT, ["N", *shape])
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
        self.initializers.append(self.onnx.numpy_helper.from_array(
            np.array(value, dtype=np.float32, order="C"), name))
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
        elif isinstance(layer, L.Dense):
            if layer.tokens_of(shape):
                raise InputError(f"{layer}: no ONNX form yet for a Dense layer over a "
                                 f"sequence, a token at a time")
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
        return self.activation(getattr(layer, "activation", "linear"), x), layer.out_shape

    def layernorm(self, layer, path, x, shape, weights):
        """LayerNormalization over the last axis: the features, or the channels of images
        moved there and back."""
        if self.opset < LAYERNORM_OPSET:
            raise InputError(f"{layer}: ONNX has LayerNormalization from opset "
                             f"{LAYERNORM_OPSET}; export with opset={LAYERNORM_OPSET} or later")
        if isinstance(shape, L.Tokens):
            raise InputError(f"{layer}: no ONNX form yet for a LayerNorm over a sequence")
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

    def activation(self, kind, x):
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
        attrs = {"axis": 1} if op == "Softmax" else \
            {"alpha": ALPHA[op]} if op in ALPHA else {}
        return self.node(op, [x], **attrs)
