"""ONNX graphs into portanet networks: portanet.from_onnx (the extra `onnx`).

Import reads a graph in two passes. The first (onnx_graph.Graph, over a file read and
checked by onnx_file.py) takes the nodes in order: constants and the shape arithmetic of
reshapes are evaluated (with a stand-in for the free batch size), and each node on the
activation stream becomes an Op: a layer with its weights, an activation, a bias, a
flatten, or an Add of two streams. The second (`Stream`, here) walks the stream from the
input: activations and biases join the layer before them, and where the stream forks, the
Add that every path from the fork passes through closes a Residual block, whose shortcut is
the input itself or one 1x1 convolution (Dense for vectors), as portanet's are. This module
makes the Sequential, so it sits above network.py; export (onnx_export.py) sits below it.
"""
import math
import os

import numpy as np

from . import layers as L, onnx_file
from .errors import InputError, ModelFileError, ShapeError
from .network import Sequential
from .onnx_export import require_onnx
from .onnx_graph import FLOOR, GROWTH, Graph, NodeErrors

MONOTONE = ("relu", "leaky_relu", "elu", "sigmoid", "tanh")     # non-decreasing
HOMOGENEOUS = ("relu", "leaky_relu")                            # f(c x) = c f(x), c >= 0


def from_onnx(model, device=None, dtype="float32", loss=None, seed=0):
    """A portanet network from an ONNX model (a path or a ModelProto) whose nodes map
    onto portanet's layers, such as what torch.onnx.export writes for MLPs, LeNet-style
    CNNs and ResNet blocks; it predicts as the graph does and can be trained further.

    loss: by default the graph's output decides: softmax -> softmax_cross_entropy,
    sigmoid -> binary_cross_entropy, anything else -> mse. A graph ending in logits (as
    a PyTorch classifier does) gets a softmax output with loss="softmax_cross_entropy",
    the loss PyTorch's CrossEntropyLoss computes from them; predict then gives the
    probabilities.

    Everything is checked before it is made: the file is a regular file of at most
    onnx_file.MAX_FILE_BYTES; external data are regular files inside the model's folder
    (links resolved), each tensor's bytes within its file, as many as its type and shape
    take, no two tensors on the same bytes; every weight finite (running variances >= 0)
    and every attribute in its range; constant folding, and the network's parameters, at
    most onnx_graph.GROWTH times the values the file holds plus FLOOR; residual blocks
    nested at most layers.MAX_NESTING deep (the walk stops there). A file that breaks one
    is a ModelFileError, a graph portanet has no layers for an InputError, each naming the
    file and the node or tensor."""
    onnx = require_onnx()
    if isinstance(model, (str, os.PathLike)):
        where = model
        model = onnx_file.read(onnx, model)
    elif isinstance(model, onnx.ModelProto):
        where = "the ONNX model"
        onnx_file.read_external(onnx, model, None, where)
    else:
        raise InputError(f"from_onnx takes a path or an onnx.ModelProto, got "
                         f"{type(model).__name__}")
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as e:
        raise ModelFileError(f"{where} is not a valid ONNX model: {e}") from e
    graph = Graph(onnx, model.graph, where)
    stream = Stream(graph)
    layers, named = stream.network()
    last = layers[-1]
    output = getattr(last, "activation", "linear")
    if loss is None:
        loss = {"softmax": "softmax_cross_entropy", "sigmoid": "binary_cross_entropy"}.get(
            output, "mse")
    elif loss == "softmax_cross_entropy" and output == "linear" and isinstance(last, L.Dense):
        last.activation = "softmax"
    stream.check_sizes(layers, named)
    try:
        net = Sequential(layers, graph.input_shape, loss, device, dtype, seed)
    except ShapeError as e:
        raise InputError(f"{where}: its layers do not make a portanet network: {e}") from e
    values = net.get_weights()
    for key, value in named.items():
        values[key] = np.asarray(value).reshape(values[key].shape)
    net.set_weights(values)
    return net


class Stream(NodeErrors):
    """The second pass over a Graph's Ops: the layers from its input to its output
    (`network`), each Op joined to the layer it belongs to, Residual blocks closed where
    the stream's forks join, and the layers' parameters matched with the graph's arrays
    (`check_sizes`) before any is allocated."""

    def __init__(self, graph):
        self.graph, self.where = graph, graph.where
        self.input, self.output = graph.input, graph.output
        self.ops, self.users, self.shapes = graph.ops, graph.users, graph.shapes
        self.projections = {}                   # id(Residual) -> its shortcut's weights

    def network(self):
        """([layers], {name in get_weights: the graph's array}) of the graph."""
        self.params, self.biased = {}, set()
        self.projecting = None      # an attention whose output projection comes next
        # the ops in the graph's (topological) order, where each is, and the stream values
        # from which a path reaches the output (the others are dead ends)
        self.order = list(self.ops.values())
        self.position = {op.output: i for i, op in enumerate(self.order)}
        self.alive = {self.output}
        for op in reversed(self.order):
            if op.output in self.alive:
                self.alive.update(op.inputs)
        layers = self.chain(self.input, self.output, depth=0)
        if self.projecting is not None and not self.projecting[1]:
            raise InputError(f"{self.where}: the graph ends at an Attention; portanet's "
                             f"attention ends in its output projection (MatMul + Add)")
        if not any(isinstance(l, L.Layer) and type(l) is not L.Flatten for l in layers):
            raise InputError(f"{self.where}: the graph computes nothing portanet has a layer "
                             f"for")
        named = {}
        for path, layer in L.walk(layers):
            for name, value in self.params.get(id(layer), {}).items():
                named[f"{path}.{name}"] = value
            for name, value in self.projections.get(id(layer), {}).items():
                named[f"{path}.proj.{name}"] = value
        return layers, named

    def chain(self, v, end, first=None, depth=0):
        """The layers from stream value v to `end`, beginning with op `first` if given;
        depth: how many blocks this chain is inside."""
        layers = []
        while v != end:
            users = [first] if first else self.users.get(v, [])
            first = None
            if not users:
                raise InputError(f"{self.where}: the stream ends at {v!r} before the graph's "
                                 f"output {end!r}")
            if len(users) == 1:
                op = users[0]
                if op.kind == "add":
                    raise self.unsupported(op.node, "an Add joining streams that do not "
                                                    "fork from one value")
                self.apply(layers, op)
                v = op.output
            else:
                block, v = self.residual(v, users, depth + 1)
                layers.append(block)
        return layers

    def apply(self, layers, op):
        last = layers[-1] if layers else None
        if self.projecting is not None and op.kind != "attention" and self.project(op):
            return
        if op.kind == "attention":
            self.attention(layers, op, last)
        elif op.kind == "layer":
            layers.append(op.layer)
            self.params[id(op.layer)] = op.weights
            if op.bias is not False:
                self.biased.add(id(op.layer))
        elif op.kind == "flatten":
            if len(self.shapes[op.inputs[0]]) >= 2 and not isinstance(last, L.GlobalAvgPool2D):
                layers.append(L.Flatten())
        elif op.kind == "act":
            if op.activation == "softmax" and not self.last(op):
                raise self.unsupported(op.node, "softmax is portanet's output activation only")
            # max pooling commutes with a non-decreasing activation (PyTorch's
            # relu(max_pool2d(conv(x))) is portanet's conv(relu) then the pool), dropout
            # with a positively homogeneous one: the activation goes to the layer before
            back = len(layers) - 1
            while back > 0 and (
                    isinstance(layers[back], L.MaxPool2D) and op.activation in MONOTONE
                    or isinstance(layers[back], L.Dropout) and op.activation in HOMOGENEOUS):
                back -= 1
            last = layers[back] if layers else None
            if not isinstance(last, (L.Dense, L.BatchNorm, L.Residual)) \
                    or last.activation != "linear":
                raise self.unsupported(op.node, f"an activation after {last or 'the input'}; "
                                       f"portanet applies activations in Dense, Conv2D, "
                                       f"BatchNorm and Residual layers")
            last.activation = op.activation
        elif op.kind == "bias":
            if type(last) is not L.Dense or last.activation != "linear" \
                    or id(last) in self.biased:
                raise self.unsupported(op.node, f"a bias after {last or 'the input'}")
            self.params[id(last)]["b"] = op.bias
            self.biased.add(id(last))
        elif op.kind != "skip":
            raise self.unsupported(op.node)

    def attention(self, layers, op, last):
        """MultiHeadAttention from the product that made q, k and v (the Dense before the
        Split, which it replaces) and the one after (project)."""
        d = op.shape[0]
        if type(last) is not L.Dense or last.activation != "linear" or last.units != 3 * d:
            raise self.unsupported(op.node, f"an Attention after {last or 'the input'}; "
                                            f"portanet's takes q, k and v from one product")
        layers[-1] = op.layer
        made = self.params.pop(id(last))
        self.params[id(op.layer)] = {"w_qkv": made["w"], "b_qkv": made["b"]}
        if id(last) in self.biased:
            self.biased.add(id(op.layer))
        self.projecting = (op.layer, False)

    def project(self, op):
        """Whether op is part of the output projection of the attention before it: its
        product (MatMul or Gemm), then its bias (none: zeros, and op goes on as itself)."""
        attention, multiplied = self.projecting
        params = self.params[id(attention)]
        d = op.shape[0]
        if not multiplied:
            if op.kind != "layer" or type(op.layer) is not L.Dense \
                    or op.weights["w"].shape != (d, d):
                raise self.unsupported(op.node, "an Attention's output other than into its "
                                                "projection (a product of as many outputs)")
            params["w_o"], params["b_o"] = op.weights["w"], op.weights["b"]
            self.projecting = None if op.bias is not False else (attention, True)
            return True
        if op.kind == "skip":
            return True
        self.projecting = None
        if op.kind == "bias":
            params["b_o"] = op.bias
            return True
        return False

    def last(self, op):
        """Whether only skips lie between op and the graph's output."""
        v = op.output
        while v != self.output:
            users = self.users.get(v, [])
            if len(users) != 1 or users[0].kind != "skip":
                return False
            v = users[0].output
        return True

    def residual(self, v, users, depth):
        """(the Residual block forking at v, the stream value after its Add); depth: how
        many blocks it is inside, itself included."""
        join = self.join(v)
        if depth > L.MAX_NESTING:       # before the walk goes deeper, not after
            raise InputError(f"{self.where}: residual blocks nested more than "
                             f"{L.MAX_NESTING} deep inside one another (the one that {join} "
                             f"closes), more than portanet builds (layers.MAX_NESTING): "
                             f"make the network flatter, blocks one after another")
        if len(users) != 2:
            raise self.unsupported(join.node, f"{len(users)} streams forking from {v!r}; "
                                              f"portanet's residual blocks have two")
        # the shortcut: v itself, or one 1x1 conv (Dense) from v into the Add; the second
        # of the Add's inputs first (PyTorch's "out += identity")
        for shortcut in reversed(join.inputs):
            if shortcut == v:
                inner_first = next((u for u in users if u is not join), None)
                break
            op = self.ops.get(shortcut)
            if op in users and op.kind == "layer" and _projection(op.layer):
                inner_first = next(u for u in users if u is not op)
                break
        else:
            raise self.unsupported(join.node, "a residual block whose shortcut is neither "
                                              "its input nor one 1x1 convolution or Gemm")
        inner_end = next((i for i in join.inputs if i != shortcut), None)
        if inner_first is None or inner_end is None:
            raise self.unsupported(join.node, "an Add of a value to itself")
        block = L.Residual(self.chain(v, inner_end, first=inner_first, depth=depth))
        if shortcut != v:
            op = self.ops[shortcut]
            stride = getattr(op.layer, "stride", 1)
            block.configure(_ShapeOnly(), self.shapes[v])
            if block.projection is None or getattr(block.projection, "stride", 1) != stride:
                raise self.unsupported(op.node, "a projection shortcut other than the one "
                                       "portanet gives a block of these shapes (a 1x1 "
                                       "convolution of the smallest stride, or none)")
            self.projections[id(block)] = op.weights
        return block, join.output

    def join(self, v):
        """The Add that every path from v to the output passes through, the first such
        (v's nearest post-dominating Add). The ops after v are taken in the graph's
        topological order, counting the edges from what v reaches that are still to be
        taken: an op that takes all those left is one that every path passes through.
        Its cost is the ops between v and the Add, so a graph of blocks is read in time
        linear in its size times its nesting."""
        start = self.position[v] + 1 if v in self.position else 0
        reached = {v}
        pending = self.live_uses(v)
        for i in range(start, len(self.order)):
            op = self.order[i]
            if op.output not in self.alive:
                continue
            taken = sum(i in reached for i in op.inputs)
            if not taken:
                continue
            pending -= taken
            if pending == 0 and op.kind == "add":
                return op
            reached.add(op.output)
            pending += self.live_uses(op.output)
        raise InputError(f"{self.where}: the streams forking from {v!r} never join in an Add")

    def live_uses(self, v):
        """How many inputs of ops on a path to the output v is (twice where one op takes
        it twice)."""
        return sum(op.output in self.alive for op in self.users.get(v, []))

    def check_sizes(self, layers, named):
        """Every parameter and buffer the layers declare (their shapes from the graph's)
        counted and matched with the graph's arrays before the network allocates one: each
        comes from the file, as many values as it holds; BatchNorm's running variances
        >= 0."""
        shape = self.graph.input_shape
        for layer in layers:
            shape = layer.configure(_ShapeOnly(), shape)
        declared = 0
        for path, layer in L.walk(layers):
            for name, dims in {**layer.parameters(), **layer.buffers()}.items():
                size = math.prod(dims)
                declared += size
                value = named.get(f"{path}.{name}")
                if value is not None and np.size(value) != size:
                    raise InputError(f"{self.where}: the graph's {name} for layer {path} "
                                     f"({layer}) has {np.size(value)} values, the layer "
                                     f"{size}")
        budget, stored = self.graph.constants.budget, self.graph.constants.stored
        if declared > budget:
            raise ModelFileError(
                f"{self.where}: its layers declare {declared} parameters, more than the "
                f"{budget} the file's tensors can give ({GROWTH} x the {stored} "
                f"values it holds + {FLOOR}): the model is damaged or forged")
        for node, name, var in self.graph.variances:
            if (var < 0).any():
                first = np.unravel_index(int(np.argmax(var < 0)), var.shape)
                raise self.damaged(node, f"its running variance {name!r} holds the negative "
                                         f"value {var[first]} (at index "
                                         f"{tuple(map(int, first))}); a variance is >= 0")


class _ShapeOnly:
    """Stands in for a backend while a block's shapes are worked out."""
    dtype = np.dtype(np.float32)


def _projection(layer):
    return (type(layer) is L.Dense or (type(layer) is L.Conv2D and layer.k == 1
                                       and layer.pad == 0)) and layer.activation == "linear"
