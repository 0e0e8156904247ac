"""Networks to ONNX and back (the extra `onnx`).

Export writes each layer as the ONNX operators of its inference form: Dense -> Gemm,
Conv2D -> Conv, activations as their operators, the pools, Flatten, BatchNorm ->
BatchNormalization with the running statistics, Residual -> its layers, the shortcut and
Add, Dropout -> Dropout (the identity in inference, kept so that an import trains as the
network did). The input is samples-first, (N, C, H, W) or (N, F), as users feed predict,
with N left free.

Import reads a graph in two passes. The first takes the nodes in order: constants and the
shape arithmetic of reshapes are evaluated (with a stand-in for the free batch size), and
each node on the activation stream becomes an Op: a layer with its weights, an activation,
a bias, a flatten, or an Add of two streams. The second walks the stream from the input:
activations and biases join the layer before them, and where the stream forks, the Add
that every path from the fork passes through closes a Residual block, whose shortcut is
the input itself or one 1x1 convolution (Dense for vectors), as portanet's are.
"""
import io
import math
import os
import stat

import numpy as np

from . import checkpoint, layers as L
from .errors import InputError, ModelFileError, PortanetError, ShapeError

OPSET = 17                 # the default: read by ONNX Runtime, TensorRT and OpenVINO alike
MIN_OPSET = 13             # Softmax over one axis, Unsqueeze's axes as an input
GELU_OPSET = 20            # the first opset with a Gelu operator

# the free batch size while reshapes' shape arithmetic is evaluated on import
BATCH = 2**31 - 1

# ONNX activation operators <-> portanet's activations (LeakyRelu and Elu with the
# alpha portanet's kernels use)
_ACTIVATIONS = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Softmax": "softmax",
                "LeakyRelu": "leaky_relu", "Elu": "elu", "Gelu": "gelu"}
_ALPHA = {"LeakyRelu": 0.01, "Elu": 1.0}
MONOTONE = ("relu", "leaky_relu", "elu", "sigmoid", "tanh")     # non-decreasing
HOMOGENEOUS = ("relu", "leaky_relu")                            # f(c x) = c f(x), c >= 0


def _onnx():
    try:
        import onnx
    except ImportError as e:
        raise InputError("ONNX export and import need the onnx package: pip install "
                         "'portanet[onnx]'") from e
    return onnx


# -- export ----------------------------------------------------------------------------


def to_onnx(net, path, opset=None):
    """Write `net` as an ONNX model to `path` (atomically), its input samples-first with
    a free batch dimension; checked with onnx.checker before it is written. opset: OPSET
    where None."""
    onnx = _onnx()
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
    onnx = _onnx()
    g = _Graph(onnx, opset)
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
    helper = _onnx().helper
    opsets = [helper.make_opsetid("", opset)]
    return helper.make_model(graph, opset_imports=opsets,
                             ir_version=helper.find_min_ir_version_for(opsets), **fields)


class _Graph:
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
        elif isinstance(layer, L.Residual):
            x = self.residual(layer, path, x, shape, weights)
        elif isinstance(layer, L.Dropout):       # the identity in inference; kept for import
            x = self.node("Dropout", [x, self.const(f"{path}.ratio", np.float32(layer.rate))])
        else:
            raise InputError(f"{layer}: no ONNX form for {kind} layers")
        return self.activation(getattr(layer, "activation", "linear"), x), layer.out_shape

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
        op = next(op for op, act in _ACTIVATIONS.items() if act == kind)
        if op == "Gelu" and self.opset < GELU_OPSET:     # 0.5 x (1 + erf(x / sqrt 2))
            scaled = self.node("Div", [x, self.const(f"sqrt2_{self.count}", math.sqrt(2))])
            one = self.node("Add", [self.node("Erf", [scaled]),
                                    self.const(f"one_{self.count}", 1.0)])
            return self.node("Mul", [self.node("Mul", [x, one]),
                                     self.const(f"half_{self.count}", 0.5)])
        attrs = {"axis": 1} if op == "Softmax" else \
            {"alpha": _ALPHA[op]} if op in _ALPHA else {}
        return self.node(op, [x], **attrs)


# -- import ----------------------------------------------------------------------------


SUPPORTED = ("Gemm, MatMul (+ Add), Conv, BatchNormalization, MaxPool, AveragePool, "
             "GlobalAveragePool (or ReduceMean over H and W), Flatten, Reshape, Relu, "
             "Sigmoid, Tanh, Softmax, LeakyRelu, Elu, Gelu (or its erf form), x * Sigmoid(x), "
             "Add (residual), Dropout, Identity; constants and Shape arithmetic for reshapes")

# What a file may make, every size checked before the array is made. The file: protobuf's
# limit (a larger model keeps its weights in external data files).
MAX_FILE_BYTES = 2 << 30
# Folded constants together, and the network's parameters and buffers, at most GROWTH times
# the values the file's tensors hold plus FLOOR: an exporter folds shape arithmetic (a few
# values) and casts or transposes of stored weights (one weight's size each), never a
# broadcast that multiplies them; FLOOR is room for the biases portanet adds (MatMul's).
GROWTH = 4
FLOOR = 1 << 20


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
    MAX_FILE_BYTES; external data are regular files inside the model's folder (links
    resolved), each tensor's bytes within its file, as many as its type and shape take, no
    two tensors on the same bytes; every weight finite (running variances >= 0) and every
    attribute in its range; constant folding, and the network's parameters, at most GROWTH
    times the values the file holds plus FLOOR; residual blocks nested at most
    layers.MAX_NESTING deep (the walk stops there). A file that breaks one is a
    ModelFileError, a graph portanet has no layers for an InputError, each naming the file
    and the node or tensor."""
    from .network import Sequential
    onnx = _onnx()
    if isinstance(model, (str, os.PathLike)):
        where = model
        model = _load(onnx, model)
    elif isinstance(model, onnx.ModelProto):
        where = "the ONNX model"
        _read_external(onnx, model, None, where)
    else:
        raise InputError(f"from_onnx takes a path or an onnx.ModelProto, got "
                         f"{type(model).__name__}")
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as e:
        raise ModelFileError(f"{where} is not a valid ONNX model: {e}") from e
    reader = _Reader(onnx, model.graph, where)
    layers, named = reader.network()
    last = layers[-1]
    output = getattr(last, "activation", "linear")
    if loss is None:
        loss = {"softmax": "softmax_cross_entropy", "sigmoid": "binary_cross_entropy"}.get(
            output, "mse")
    elif loss == "softmax_cross_entropy" and output == "linear" and isinstance(last, L.Dense):
        last.activation = "softmax"
    reader.check_sizes(layers, named)
    try:
        net = Sequential(layers, reader.input_shape, loss, device, dtype, seed)
    except ShapeError as e:
        raise InputError(f"{where}: its layers do not make a portanet network: {e}") from e
    values = net.get_weights()
    for key, value in named.items():
        values[key] = np.asarray(value).reshape(values[key].shape)
    net.set_weights(values)
    return net


def _load(onnx, path):
    """The ModelProto in the file at `path`, its external data read (_read_external). The
    file is stat'ed before it is opened and opened without blocking, so that a FIFO or a
    device is refused, never read."""
    what = f"{path} as an ONNX model"
    try:
        _check_regular(path, os.stat(path))
        with _open(path) as f:
            info = os.fstat(f.fileno())         # what was opened, were it swapped since
            _check_regular(path, info)
            if info.st_size > MAX_FILE_BYTES:
                raise ModelFileError(
                    f"{path} is {info.st_size / 2**30:.1f} GiB, more than the "
                    f"{MAX_FILE_BYTES >> 30} GiB an ONNX file can be (protobuf's limit): a "
                    f"larger model keeps its weights in external data files beside it")
            data = f.read(info.st_size)
    except OSError as e:                        # missing, unreadable
        raise ModelFileError(f"cannot read {what}: {e}") from e
    # the format onnx.load would take from the name (.onnx: protobuf; .txtpb, .json: text)
    registry = getattr(getattr(onnx, "serialization", None), "registry", None)
    fmt = registry and registry.get_format_from_file_extension(os.path.splitext(path)[1])
    try:
        model = onnx.load_model(io.BytesIO(data), load_external_data=False,
                                **({"format": fmt} if fmt else {}))
    except ValueError as e:
        raise ModelFileError(f"cannot read {what}: {e}") from e
    except Exception as e:      # protobuf's DecodeError is no OSError or ValueError
        raise ModelFileError(f"{path} is not an ONNX model ({type(e).__name__}: {e})") from e
    _read_external(onnx, model, os.path.dirname(os.path.abspath(path)), path)
    return model


def _open(path, flags=0):
    """The file at path opened to read without blocking: a FIFO that no one writes returns
    at once (and is then refused, by its fstat)."""
    flags |= os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    return os.fdopen(os.open(path, flags), "rb")


def _check_regular(path, info):
    """A ModelFileError unless os.stat's `info` of the model's path is a regular file's."""
    kind = _irregular(info)
    if kind == "a folder":
        raise ModelFileError(f"{path} is a folder, not a regular file: give the ONNX file's "
                             f"path")
    if kind:
        raise ModelFileError(f"{path} is not a regular file ({kind}): give the path of an "
                             f"ONNX file")


def _irregular(info):
    """What os.stat's `info` is unless a regular file ("a folder", "a FIFO", ...), else
    None."""
    mode = info.st_mode
    if stat.S_ISREG(mode):
        return None
    return ("a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "a device" if stat.S_ISCHR(mode)
            or stat.S_ISBLK(mode) else "not a file")


def _tensors(model):
    """Every TensorProto of a model: the initializers and attributes of its graph and of
    the graphs inside its nodes (walked without recursion)."""
    graphs = [model.graph]
    while graphs:
        graph = graphs.pop()
        yield from graph.initializer
        for sparse in graph.sparse_initializer:
            yield from (sparse.values, sparse.indices)
        for node in graph.node:
            for a in node.attribute:
                if a.HasField("t"):
                    yield a.t
                yield from a.tensors
                sparse = list(a.sparse_tensors)
                if a.HasField("sparse_tensor"):
                    sparse.append(a.sparse_tensor)
                for tensor in sparse:
                    yield from (tensor.values, tensor.indices)
                if a.HasField("g"):
                    graphs.append(a.g)
                graphs.extend(a.graphs)


def _read_external(onnx, model, folder, where):
    """Read the model's external data into its tensors, checked by portanet itself
    whatever the onnx package checks: each location a relative path to a regular file
    inside `folder` once links are resolved, its offset and length within the file, the
    length what the tensor's type and shape take, and no two tensors on the same bytes
    (so that the bytes read are at most the files' sizes). folder None (a ModelProto in
    memory): external data are refused, there is no folder to read them from."""
    external = [t for t in _tensors(model) if t.data_location == onnx.TensorProto.EXTERNAL]
    if not external:
        return
    root = None if folder is None else os.path.realpath(folder)
    spans = {}                  # real path -> (its os.stat, [(offset, end, tensor)])
    for t in external:
        entries = {e.key: e.value for e in t.external_data}
        location = entries.get("location", "")
        say = f"{where}: tensor {t.name!r} takes its data from {location!r}"
        if root is None:
            raise ModelFileError(f"{where}: tensor {t.name!r} has its data in an external "
                                 f"file ({location!r}); give the model's path, not a "
                                 f"ModelProto, so that portanet reads it from the model's "
                                 f"folder")
        if not location or "\0" in location:
            raise ModelFileError(f"{say}, which names no file: the model is damaged")
        real = os.path.realpath(os.path.join(root, location))
        if os.path.isabs(location) or os.path.commonpath([root, real]) != root:
            raise ModelFileError(
                f"{say}, which is {real}, outside the model's folder {root}: external "
                f"data must be files in the model's folder, named relative to it (no "
                f"absolute path, '..' or link leading out)")
        try:
            info = os.stat(real)
        except OSError as e:
            raise ModelFileError(f"{say}, which cannot be read: {e.strerror or e}") from e
        if _irregular(info):
            raise ModelFileError(f"{say}, which is not a regular file ({_irregular(info)}): "
                                 f"external data are files in the model's folder; the "
                                 f"model is damaged")
        size = info.st_size
        offset, length = (_whole(say, key, entries.get(key)) for key in ("offset", "length"))
        offset = offset or 0
        length = size - offset if length is None else length
        if offset + length > size:
            raise ModelFileError(f"{say}: bytes {offset} to {offset + length}, past the end "
                                 f"of its {size} bytes: the model or its data is damaged "
                                 f"(a copy cut short?)")
        need, kind = _tensor_bytes(onnx, t, say)
        if length != need:
            raise ModelFileError(f"{say}: {length} bytes, but {kind} take {need} bytes: the "
                                 f"model or its data is damaged")
        spans.setdefault(real, (info, []))[1].append((offset, offset + length, t))
    for real, (info, taken) in spans.items():
        taken.sort(key=lambda span: span[:2])
        for (_, end, first), (start, then_end, then) in zip(taken, taken[1:]):
            if start < end:
                raise ModelFileError(f"{where}: tensor {then.name!r} takes bytes {start} to "
                                     f"{then_end} of {real}, the same bytes as "
                                     f"{first.name!r}: each tensor's data are its own; the "
                                     f"model is damaged or forged")
        try:
            with _open(real, getattr(os, "O_NOFOLLOW", 0)) as f:
                now = os.fstat(f.fileno())
                if (now.st_dev, now.st_ino) != (info.st_dev, info.st_ino):
                    raise ModelFileError(f"{where}: {real} was replaced while the model's "
                                         f"external data were checked; read it again")
                for start, end, t in taken:
                    f.seek(start)
                    data = f.read(end - start)
                    if len(data) != end - start:
                        raise ModelFileError(f"{where}: {real} ended before the data of "
                                             f"tensor {t.name!r}: it changed while read")
                    t.raw_data = data
                    t.data_location = onnx.TensorProto.DEFAULT
                    del t.external_data[:]
        except OSError as e:
            raise ModelFileError(f"{where}: cannot read the external data {real}: "
                                 f"{e.strerror or e}") from e


def _whole(say, key, text):
    """An external data entry's offset or length: None where absent, else a whole number
    >= 0."""
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise ModelFileError(f"{say}: its {key} {text!r} is not a whole number >= 0: the "
                             f"model is damaged")
    return value


# ONNX's types of fewer than 8 bits, packed into bytes
_BITS = {"INT4": 4, "UINT4": 4, "FLOAT4E2M1": 4, "INT2": 2, "UINT2": 2}


def _tensor_bytes(onnx, t, say):
    """(the bytes a tensor of its type and shape takes, "3 x 4 float32")."""
    dims = list(t.dims)
    known = t.data_type in onnx.TensorProto.DataType.values()
    type_name = onnx.TensorProto.DataType.Name(t.data_type) if known else str(t.data_type)
    if not known or any(d < 0 for d in dims) or type_name in ("UNDEFINED", "STRING"):
        raise ModelFileError(f"{say}: a tensor of type {type_name} and shape {dims}, which "
                             f"external data cannot hold: the model is damaged")
    if type_name in _BITS:
        bits, name = _BITS[type_name], type_name.lower()
    else:
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type))
        bits, name = 8 * dtype.itemsize, dtype.name
    shape = " x ".join(map(str, dims)) or "a scalar"
    return -(-math.prod(dims) * bits // 8), f"{shape} {name}"


class _Op:
    """A node (or a few fused) on the activation stream: kind "layer" (with the layer and
    its weights), "act", "bias", "flatten", "skip" or "add"; inputs are stream values."""

    def __init__(self, node, kind, inputs, output, shape, **more):
        self.node, self.kind, self.inputs, self.output, self.shape = (
            node, kind, inputs, output, shape)
        self.layer = self.weights = self.activation = self.bias = None
        self.__dict__.update(more)

    def __repr__(self):
        return f"node {_name(self.node)} ({self.node.op_type})"


def _name(node):
    """How a message names a node: its name, else its first output."""
    return repr(node.name or (node.output[0] if node.output else ""))


class _Reader:
    def __init__(self, onnx, graph, where):
        self.onnx, self.where = onnx, where
        self.consts = {}
        for t in graph.initializer:
            try:
                self.consts[t.name] = onnx.numpy_helper.to_array(t)
            except (ValueError, TypeError, KeyError) as e:
                raise ModelFileError(f"{where}: initializer {t.name!r} cannot be read "
                                     f"({type(e).__name__}: {e}): the model is damaged") \
                    from e
        for node in graph.node:                 # constants first: `stored` counts them
            if node.op_type == "Constant":
                self.read(node)
        # the values the file holds, which bound what folding and the layers may make
        self.stored = sum(c.size for c in self.consts.values())
        self.budget = GROWTH * self.stored + FLOOR
        self.folded = self.taken = 0
        self.shapes, self.ops, self.users, self.pending = {}, {}, {}, {}
        self.projections = {}                   # id(Residual) -> its shortcut's weights
        self.variances = []                     # (node, name, BatchNorm's running variance)
        inputs = [i for i in graph.input if i.name not in self.consts]
        if len(inputs) != 1 or len(graph.output) != 1:
            raise InputError(f"{where}: portanet reads graphs of one input and one output; "
                             f"this one has {len(inputs)} and {len(graph.output)}")
        self.input, self.output = inputs[0].name, graph.output[0].name
        dims = [d.dim_value if d.HasField("dim_value") else None
                for d in inputs[0].type.tensor_type.shape.dim]
        if len(dims) not in (2, 4) or not all(d is not None and d > 0 for d in dims[1:]):
            raise InputError(f"{where}: its input {self.input!r} has shape {dims}; portanet "
                             f"reads (N, features) or (N, C, H, W) inputs of known sizes")
        self.input_shape = self.shapes[self.input] = tuple(dims[1:])
        for node in graph.node:
            if node.op_type != "Constant":
                self.read(node)

    # -- the first pass: node by node ------------------------------------------------------

    def unsupported(self, node, why=""):
        return InputError(f"{self.where}: node {_name(node)} ({node.op_type}) is not "
                          f"supported{': ' + why if why else ''}; portanet reads {SUPPORTED}")

    def damaged(self, node, why):
        return ModelFileError(f"{self.where}: node {_name(node)} ({node.op_type}): {why}: "
                              f"the model is damaged; export it again")

    def const(self, node, name):
        if name not in self.consts:
            raise self.unsupported(node, f"its input {name!r} must be a constant")
        return self.consts[name]

    def weight(self, node, name, role="weight"):
        """The constant `name` that a layer of node takes as a weight: counted against the
        budget before any copy of it is made, and refused unless real and finite."""
        value = self.const(node, name)
        self.taken += value.size
        if self.taken > self.budget:
            raise ModelFileError(
                f"{self.where}: node {_name(node)} ({node.op_type}) takes {name!r} "
                f"({value.size} values) as a {role}, which brings the layers' parameters "
                f"to {self.taken}, more than the {self.budget} the file's tensors can give "
                f"({GROWTH} x the {self.stored} values it holds + {FLOOR}): a weight shared "
                f"by many layers, or a damaged file")
        if value.dtype.kind not in "biuf":
            raise self.unsupported(node, f"a {role} {name!r} of type {value.dtype}")
        self.finite(node, value, f"{role} {name!r}")
        return value

    def finite(self, node, value, what):
        if value.dtype.kind == "f":
            ok = np.isfinite(value)
            if not ok.all():
                first = np.unravel_index(int(np.argmin(ok)), value.shape)
                raise self.damaged(node, f"its {what} holds NaN or inf (first at index "
                                         f"{tuple(map(int, first))})")

    def number(self, node, attrs, name, default, low, high, value=None):
        """Attribute `name` (or `value`) as a float: finite and in [low, high], the range
        ONNX gives it, else the file is damaged."""
        value = float(attrs.get(name, default) if value is None else value)
        if not math.isfinite(value):
            raise self.damaged(node, f"{name} {_float32(value)!r} is not a finite number")
        if not low <= value <= high:
            raise self.damaged(node, f"{name} {_float32(value)!r} is outside [{low}, {high}], "
                                     f"where ONNX defines it")
        return value

    def layer(self, node, what, make):
        """make(), a layer; a value portanet's layer does not take (its InputError) is an
        unsupported node, naming `what`."""
        try:
            return make()
        except InputError as e:
            raise self.unsupported(node, f"{what} ({e})") from e

    def read(self, node):
        try:
            with np.errstate(all="ignore"):     # a fold's inf is refused where it is used
                self._read(node)
        except PortanetError:
            raise
        except (ValueError, KeyError, IndexError, TypeError, OverflowError) as e:
            raise ModelFileError(f"{self.where}: node {_name(node)} ({node.op_type}) cannot "
                                 f"be read: {type(e).__name__}: {e}") from e

    def _read(self, node):
        attrs = {a.name: _text(self.onnx.helper.get_attribute_value(a))
                 for a in node.attribute}
        if node.op_type == "Constant":
            return self.constant(node, attrs)
        stream = [i for i in node.input if i in self.shapes]
        if self.gelu(node, stream):
            return
        if not stream:
            self.fold(node, attrs)
        elif node.op_type == "Shape":
            full = np.array([BATCH, *self.shapes[stream[0]]], np.int64)
            self.consts[node.output[0]] = full[attrs.get("start", 0):attrs.get("end", None)]
        else:
            self.add(self.stream_op(node, attrs, stream))

    def constant(self, node, attrs):
        if not attrs:
            raise self.damaged(node, "a Constant of no value")
        if "value" in attrs:
            value = self.onnx.numpy_helper.to_array(attrs["value"])
        else:
            key = next(iter(attrs))
            value = np.array(attrs[key], np.float32 if "float" in key else np.int64)
        self.consts[node.output[0]] = value

    def fold(self, node, attrs):
        """A node of constants only: evaluated now, once the elements it makes are counted
        (from the shapes, before anything is computed) against the budget."""
        t = node.op_type
        x = [self.const(node, i) if i else None for i in node.input]
        folds = {
            "Identity": lambda: x[0], "Cast": lambda: x[0].astype(
                self.onnx.helper.tensor_dtype_to_np_dtype(attrs["to"])),
            "Transpose": lambda: np.transpose(x[0], attrs.get("perm")),
            "Reshape": lambda: x[0].reshape(_resolve(x[0].shape, x[1], None)),
            "Gather": lambda: np.take(x[0], x[1], axis=attrs.get("axis", 0)),
            "Unsqueeze": lambda: np.expand_dims(x[0], tuple(
                attrs["axes"] if "axes" in attrs else x[1])),
            "Squeeze": lambda: np.squeeze(x[0], tuple(
                attrs["axes"] if "axes" in attrs else x[1]) if len(x) > 1 or "axes" in attrs
                else None),
            "Concat": lambda: np.concatenate(x, axis=attrs["axis"]),
            "Slice": lambda: _slice(*x), "Mul": lambda: x[0] * x[1],
            "Div": lambda: x[0] // x[1] if x[0].dtype.kind == "i" else x[0] / x[1],
            "Add": lambda: x[0] + x[1], "Sub": lambda: x[0] - x[1]}
        if t not in folds:
            raise self.unsupported(node, "a constant operation portanet does not evaluate")
        if not x or x[0] is None or t in ("Mul", "Div", "Add", "Sub") and (
                len(x) != 2 or x[1] is None):
            raise self.damaged(node, "an input is missing")
        count = _fold_elements(t, x, attrs)
        self.folded += count
        if self.folded > self.budget:
            raise ModelFileError(
                f"{self.where}: node {_name(node)} ({t}) would make a constant of {count} "
                f"elements, which brings the folded constants to {self.folded}, more than "
                f"the {self.budget} the file's tensors allow ({GROWTH} x the {self.stored} "
                f"values it holds + {FLOOR}): the model is damaged or forged; an exporter's "
                f"constants fold to shapes and to copies of its weights")
        self.consts[node.output[0]] = np.asarray(folds[t]())

    def gelu(self, node, stream):
        """Whether node is one of gelu's erf form, 0.5 x (1 + erf(x / sqrt 2)), as PyTorch's
        exporters write gelu before opset 20 (in either order of the products): its partial
        values wait in `pending` as (stage, x) until the last product makes the activation."""
        t, ins = node.op_type, list(node.input)
        pend = [self.pending.get(i) for i in ins]

        def is_const(name, value):
            c = self.consts.get(name)
            return c is not None and c.size == 1 and math.isclose(float(c.reshape(-1)[0]), value,
                                                                  rel_tol=1e-6)
        step = None
        if t in ("Div", "Mul") and len(ins) == 2 and len(stream) == 1 and not any(pend):
            x = stream[0]
            c = ins[1 - ins.index(x)]
            if (t == "Div" and ins[0] == x and is_const(c, math.sqrt(2))) or (
                    t == "Mul" and is_const(c, math.sqrt(0.5))):
                step = ("scaled", x)
        elif any(pend):
            j = next(k for k, p in enumerate(pend) if p)
            stage, x = pend[j]
            other = ins[1 - j] if len(ins) == 2 else None
            if t == "Erf" and stage == "scaled":
                step = ("erf", x)
            elif t == "Add" and stage == "erf" and is_const(other, 1.0):
                step = ("1+erf", x)
            elif t == "Mul" and stage == "1+erf" and is_const(other, 0.5):
                step = ("half", x)
            elif t == "Mul" and stage in ("1+erf", "half") and other == x:
                step = ("x(1+erf)" if stage == "1+erf" else "gelu", x)
            elif t == "Mul" and stage == "x(1+erf)" and is_const(other, 0.5):
                step = ("gelu", x)
            if step is None:
                raise self.unsupported(node, "a part of gelu's erf form other than PyTorch's")
        if step is None:
            return False
        if step[0] != "gelu":
            self.pending[node.output[0]] = step
            return True
        self.add(_Op(node, "act", [step[1]], node.output[0], self.shapes[step[1]],
                     activation="gelu"))
        return True

    def add(self, op):
        """op on the stream: its output's shape known, and it one of its inputs' users."""
        self.ops[op.output] = op
        self.shapes[op.output] = op.shape
        for v in op.inputs:
            self.users.setdefault(v, []).append(op)

    def stream_op(self, node, attrs, stream):
        t, out, x = node.op_type, node.output[0], stream[0]
        shape = self.shapes[x]

        def op(kind, out_shape=shape, inputs=(x,), **more):
            return _Op(node, kind, list(inputs), out, out_shape, **more)

        if t == "Identity":
            return op("skip")
        if t == "Dropout":
            given = len(node.input) > 1 and node.input[1]
            rate = self.number(node, attrs, "ratio", 0.5, 0, 1, value=float(
                self.const(node, node.input[1])) if given else None)
            layer = self.layer(node, f"ratio {rate}", lambda: L.Dropout(_float32(rate)))
            return op("layer", layer=layer, weights={})
        if t in _ACTIVATIONS:
            self.check_activation(node, t, attrs, shape)
            return op("act", activation=_ACTIVATIONS[t])
        if t in ("Flatten", "Reshape"):
            if t == "Flatten" and attrs.get("axis", 1) != 1:
                raise self.unsupported(node, "portanet flattens from axis 1")
            target = (BATCH, math.prod(shape))
            if t == "Reshape":
                target = _resolve((BATCH, *shape), self.const(node, node.input[1]),
                                  attrs.get("allowzero", 0))
                if tuple(target) == (BATCH, *shape):
                    return op("skip")
                if tuple(target) != (BATCH, math.prod(shape)):
                    raise self.unsupported(node, f"a reshape of {shape} samples to "
                                                 f"{_shown(target)}; portanet flattens only")
            return op("flatten", (math.prod(shape),))
        if t == "Add" and len(stream) == 2:
            if self.shapes[stream[0]] != self.shapes[stream[1]]:
                raise self.unsupported(node, f"an Add of {self.shapes[stream[0]]} and "
                                             f"{self.shapes[stream[1]]} samples")
            return op("add", inputs=stream)
        if t == "Add":
            b = self.weight(node, next(i for i in node.input if i != x), "bias")
            if len(shape) != 1 or b.size != shape[0]:
                raise self.unsupported(node, f"an Add of a {b.shape} constant to {shape} "
                                             f"samples; portanet adds biases after MatMul")
            return op("bias", bias=b.reshape(-1))
        if t == "Mul" and len(stream) == 2:
            gate = [v for v in stream if v in self.ops and self.ops[v].kind == "act"
                    and self.ops[v].activation == "sigmoid" and self.ops[v].inputs == [
                        w for w in stream if w != v]]
            if gate:                                          # x sigmoid(x): silu
                sigmoid = self.ops[gate[0]]
                self.users[sigmoid.inputs[0]].remove(sigmoid)
                silu = op("act", inputs=sigmoid.inputs, activation="silu")
                sigmoid.inputs = []             # its input's user now is the silu alone
                return silu
        if t in ("Gemm", "MatMul"):
            return self.dense(node, attrs, x, shape, op)
        if t == "Conv":
            return self.conv(node, attrs, shape, op)
        if t in ("MaxPool", "AveragePool"):
            return self.pool(node, attrs, shape, op)
        if t == "GlobalAveragePool":
            self.check_images(node, shape)
            return op("layer", (shape[0], 1, 1), layer=L.GlobalAvgPool2D(), weights={})
        if t == "ReduceMean":           # PyTorch's dynamo exporter: AdaptiveAvgPool2d(1)
            self.check_images(node, shape)
            axes = attrs.get("axes") if "axes" in attrs else self.const(node, node.input[1]) \
                if len(node.input) > 1 and node.input[1] else None
            if axes is None or sorted(int(a) % 4 for a in np.ravel(axes)) != [2, 3]:
                raise self.unsupported(node, "a mean over other than the image's rows and "
                                             "columns")
            keep = attrs.get("keepdims", 1)
            return op("layer", (shape[0], 1, 1) if keep else (shape[0],),
                      layer=L.GlobalAvgPool2D(), weights={})
        if t == "BatchNormalization":
            if attrs.get("training_mode", 0) or len([o for o in node.output if o]) > 1:
                raise self.unsupported(node, "batch statistics (training mode); export the "
                                             "model in eval mode")
            names = list(node.input[1:5])
            if len(names) != 4:
                raise self.damaged(node, f"{len(names)} of its 4 constant inputs")
            gamma, beta, mean = (self.weight(node, i) for i in names[:3])
            var = self.weight(node, names[3], "running variance")
            self.variances.append((node, names[3], var))     # checked >= 0 in check_sizes
            momentum = self.number(node, attrs, "momentum", 0.9, 0, 1)
            eps = self.number(node, attrs, "epsilon", 1e-5, 0, math.inf)
            # float32 attributes: 0.1 would come back as 0.10000002384185791
            layer = self.layer(node, f"epsilon {_float32(eps)!r}, momentum "
                                     f"{_float32(momentum)!r}", lambda: L.BatchNorm(
                                         momentum=_float32(1.0 - momentum), eps=_float32(eps)))
            return op("layer", layer=layer, weights={
                "gamma": gamma, "beta": beta, "running_mean": mean, "running_var": var})
        raise self.unsupported(node)

    def check_activation(self, node, t, attrs, shape):
        if t in _ALPHA and not math.isclose(attrs.get("alpha", 0.01 if t == "LeakyRelu"
                                                     else 1.0), _ALPHA[t], rel_tol=1e-6):
            raise self.unsupported(node, f"alpha {attrs['alpha']}; portanet's {t} has "
                                         f"alpha {_ALPHA[t]}")
        if t == "Gelu" and attrs.get("approximate", "none") != "none":
            raise self.unsupported(node, "the tanh approximation; portanet's gelu is erf's")
        if t == "Softmax" and (len(shape) != 1 or attrs.get("axis", -1) not in (1, -1)):
            raise self.unsupported(node, "softmax over other than the features of vectors")

    def check_images(self, node, shape):
        if len(shape) != 3:
            raise self.unsupported(node, f"it takes images, the stream has {shape} samples")

    def dense(self, node, attrs, x, shape, op):
        if len(shape) != 1:
            raise self.unsupported(node, f"a product with {shape} samples; flatten first")
        if len(node.input) < 2:
            raise self.damaged(node, "its weight is missing")
        w = self.weight(node, node.input[1])
        if w.ndim != 2:
            raise self.unsupported(node, f"a weight of shape {w.shape}")
        kind = w.dtype if w.dtype.kind == "f" else np.dtype(np.float32)
        b = None
        if node.op_type == "Gemm":
            if attrs.get("transA", 0):
                raise self.unsupported(node, "transA=1")
            alpha = self.number(node, attrs, "alpha", 1.0, -math.inf, math.inf)
            w = self.scaled(node, alpha, w if attrs.get("transB", 0) else w.T, kind,
                            f"alpha times {node.input[1]!r}")
            if len(node.input) > 2 and node.input[2]:
                c = self.weight(node, node.input[2], "bias")
                if c.size not in (1, w.shape[0]):
                    raise self.unsupported(node, f"a C of shape {c.shape} for {w.shape[0]} "
                                                 f"outputs")
                beta = self.number(node, attrs, "beta", 1.0, -math.inf, math.inf)
                b = self.scaled(node, beta, np.broadcast_to(c.reshape(-1), (w.shape[0],)),
                                c.dtype if c.dtype.kind == "f" else kind,
                                f"beta times {node.input[2]!r}")
        else:
            w = w.astype(np.float64).T                # x (N, in) @ B (in, out): w = B^T
        if w.shape[1] != shape[0]:
            raise self.unsupported(node, f"a weight for {w.shape[1]} inputs on {shape[0]}")
        layer = self.layer(node, f"{w.shape[0]} outputs", lambda: L.Dense(w.shape[0]))
        return op("layer", (w.shape[0],), layer=layer,
                  weights={"w": w, "b": np.zeros(w.shape[0]) if b is None else b},
                  bias=b is not None)

    def scaled(self, node, factor, value, dtype, what):
        """factor * value in float64, refused where the graph's own type (dtype) would
        hold NaN or inf."""
        out = factor * value.astype(np.float64)
        with np.errstate(over="ignore"):
            cast = out.astype(dtype)
        if not np.isfinite(cast).all():
            self.finite(node, cast, f"{what} (in {dtype})")
        return out

    def window(self, node, attrs, kernel, shape):
        """(k, stride, pad) of a square window with equal strides and pads, or an error."""
        self.check_images(node, shape)
        k = attrs.get("kernel_shape", kernel)
        s = attrs.get("strides", [1, 1])
        p = attrs.get("pads", [0, 0, 0, 0])
        if attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
            raise self.unsupported(node, f"auto_pad {attrs['auto_pad']!r}; give pads")
        if len(k) != 2 or k[0] != k[1] or s[0] != s[1] or len(set(p)) != 1:
            raise self.unsupported(node, f"kernel {list(k)}, strides {list(s)}, pads "
                                         f"{list(p)}: portanet's are square and even")
        if any(d != 1 for d in attrs.get("dilations", [1, 1])):
            raise self.unsupported(node, "dilations")
        return int(k[0]), int(s[0]), int(p[0])

    def conv(self, node, attrs, shape, op):
        if len(node.input) < 2:
            raise self.damaged(node, "its weight is missing")
        w = self.weight(node, node.input[1])
        if w.ndim != 4 or attrs.get("group", 1) != 1:
            raise self.unsupported(node, f"a weight of shape {w.shape}, group "
                                         f"{attrs.get('group', 1)}")
        k, s, p = self.window(node, attrs, w.shape[2:], shape)
        if w.shape[1] != shape[0]:
            raise self.unsupported(node, f"a weight for {w.shape[1]} channels on {shape[0]}")
        b = self.weight(node, node.input[2], "bias") if len(node.input) > 2 and node.input[2] \
            else np.zeros(w.shape[0])
        layer = self.layer(node, f"kernel {k}, stride {s}, pads {p}",
                           lambda: L.Conv2D(w.shape[0], k, stride=s, padding=p))
        out = (w.shape[0], *(L.conv_out(n, k, s, p) for n in shape[1:]))
        return op("layer", out, layer=layer, weights={"w": w, "b": b})

    def pool(self, node, attrs, shape, op):
        k, s, p = self.window(node, attrs, None, shape)
        out = [L.conv_out(n, k, s, 0) for n in shape[1:]]
        exact = all((n - k) % s == 0 for n in shape[1:])
        if p or attrs.get("storage_order", 0) or (attrs.get("ceil_mode", 0) and not exact):
            raise self.unsupported(node, "pads, ceil_mode or storage_order; portanet pools "
                                         "whole windows inside the image")
        kind = L.MaxPool2D if node.op_type == "MaxPool" else L.AvgPool2D
        layer = self.layer(node, f"kernel {k}, stride {s}", lambda: kind(k, s))
        return op("layer", (shape[0], *out), layer=layer, weights={})

    # -- the second pass: the stream from the input --------------------------------------

    def network(self):
        """([layers], {name in get_weights: the graph's array}) of the graph."""
        self.params, self.biased = {}, set()
        # the ops in the graph's (topological) order, where each is, and the stream values
        # from which a path reaches the output (the others are dead ends)
        self.order = list(self.ops.values())
        self.position = {op.output: i for i, op in enumerate(self.order)}
        self.alive = {self.output}
        for op in reversed(self.order):
            if op.output in self.alive:
                self.alive.update(op.inputs)
        layers = self.chain(self.input, self.output, depth=0)
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
        if op.kind == "layer":
            layers.append(op.layer)
            self.params[id(op.layer)] = op.weights
            if op.bias is not False:
                self.biased.add(id(op.layer))
        elif op.kind == "flatten":
            if len(self.shapes[op.inputs[0]]) == 3 and not isinstance(last, L.GlobalAvgPool2D):
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
        shape = self.input_shape
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
        if declared > self.budget:
            raise ModelFileError(
                f"{self.where}: its layers declare {declared} parameters, more than the "
                f"{self.budget} the file's tensors can give ({GROWTH} x the {self.stored} "
                f"values it holds + {FLOOR}): the model is damaged or forged")
        for node, name, var in self.variances:
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


def _fold_elements(t, x, attrs):
    """The elements a fold of op type t on constants x makes, from their shapes alone
    (Identity makes none; a view is counted as a copy)."""
    if t == "Identity":
        return 0
    if t in ("Mul", "Div", "Add", "Sub"):
        return math.prod(np.broadcast_shapes(x[0].shape, x[1].shape))
    if t == "Gather":
        axis = int(attrs.get("axis", 0))
        if not -x[0].ndim <= axis < x[0].ndim:
            raise ValueError(f"axis {axis} of a {x[0].ndim}-dimensional constant")
        rest = x[0].size // x[0].shape[axis] if x[0].shape[axis] else 0
        return rest * np.asarray(x[1]).size
    if t == "Concat":
        return sum(0 if a is None else a.size for a in x)
    return x[0].size


def _resolve(shape, target, allowzero):
    """ONNX Reshape's output shape: 0 copies the input's dimension (unless allowzero),
    one -1 takes what is left."""
    out = [int(shape[i]) if d == 0 and not allowzero else int(d)
           for i, d in enumerate(np.asarray(target).reshape(-1))]
    if out.count(-1) == 1:
        known = math.prod(d for d in out if d != -1)
        out[out.index(-1)] = math.prod(shape) // known if known else 0
    return out


def _slice(x, starts, ends, axes=None, steps=None):
    axes = range(len(starts)) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    index = [slice(None)] * x.ndim
    for a, s, e, st in zip(axes, starts, ends, steps):
        index[int(a)] = slice(int(s), int(e), int(st))
    return x[tuple(index)]


def _text(value):
    """An attribute's value, its bytes (a string attribute: b"none") as text."""
    return value.decode() if isinstance(value, bytes) else value


def _float32(value):
    """The shortest decimal that an ONNX float32 attribute stands for."""
    return float(f"{np.float32(value):.7g}")


def _shown(shape):
    return "(" + ", ".join("N" if d == BATCH else str(d) for d in shape) + ")"
