"""The first pass of an ONNX import: a graph's nodes, in order, as constants and Ops.

`Graph` takes the nodes in the graph's (topological) order. Its `Constants` hold the
initializers, Constant nodes and what folding makes of them: nodes of constants only, and
the shape arithmetic of reshapes (a Shape of the stream, with BATCH standing in for the
free batch size), evaluated once the elements each makes are counted against the budget
(GROWTH times the values the file holds plus FLOOR). Every other node is on the activation
stream and becomes an `Op`: a layer made with its weights (each weight counted against the
same budget and checked finite), an activation, a bias, a flatten, a skip, or an Add of
two streams. Which layers the Ops make, and where residual blocks are, is the second pass
(onnx_import.py). A file that breaks a rule is a ModelFileError, a node portanet has no
layer for an InputError, each naming the node.
"""
import math

import numpy as np

from . import layers as L
from .errors import InputError, ModelFileError, PortanetError
from .onnx_export import ACTIVATIONS, ALPHA

SUPPORTED = ("Gemm, MatMul (+ Add), Conv, BatchNormalization, LayerNormalization (over "
             "features), MaxPool, AveragePool, "
             "GlobalAveragePool (or ReduceMean over H and W), Flatten, Reshape, Relu, "
             "Sigmoid, Tanh, Softmax, LeakyRelu, Elu, Gelu (or its erf form), x * Sigmoid(x), "
             "Add (residual), Dropout, Identity; for token ids (N, T): Gather of a table (+ "
             "Add of positions), and over (N, T, features) MatMul + Add, Split into q, k, v "
             "and Attention; constants and Shape arithmetic for reshapes")

# the free batch size while reshapes' shape arithmetic is evaluated on import
BATCH = 2**31 - 1

# What a file may make, every size checked before the array is made: folded constants
# together, and the network's parameters and buffers, at most GROWTH times the values the
# file's tensors hold plus FLOOR: an exporter folds shape arithmetic (a few values) and
# casts or transposes of stored weights (one weight's size each), never a broadcast that
# multiplies them; FLOOR is room for the biases portanet adds (MatMul's).
GROWTH = 4
FLOOR = 1 << 20


class NodeErrors:
    """The errors an import of the model at `where` raises about one of its nodes."""
    where = None

    def unsupported(self, node, why=""):
        return InputError(f"{self.where}: node {_name(node)} ({node.op_type}) is not "
                          f"supported{': ' + why if why else ''}; portanet reads {SUPPORTED}")

    def damaged(self, node, why):
        return ModelFileError(f"{self.where}: node {_name(node)} ({node.op_type}): {why}: "
                              f"the model is damaged; export it again")


class Constants(NodeErrors):
    """The graph's constant values by name ({name: array} in `values`): its initializers
    and Constant nodes, read when made, then whatever `fold` and `shape` add. `stored` is
    how many values the file holds; `budget` bounds the elements that folding makes
    (`folded`) and, apart, the weights that layers take (`taken`)."""

    def __init__(self, onnx, graph, where):
        self.onnx, self.where = onnx, where
        self.values = {}
        for t in graph.initializer:
            try:
                self.values[t.name] = onnx.numpy_helper.to_array(t)
            except (ValueError, TypeError, KeyError) as e:
                raise ModelFileError(f"{where}: initializer {t.name!r} cannot be read "
                                     f"({type(e).__name__}: {e}): the model is damaged") \
                    from e
        for node in graph.node:                 # constants first: `stored` counts them
            if node.op_type == "Constant":
                read_node(self, node, lambda attrs: self.constant(node, attrs))
        # the values the file holds, which bound what folding and the layers may make
        self.stored = sum(c.size for c in self.values.values())
        self.budget = GROWTH * self.stored + FLOOR
        self.folded = self.taken = 0

    def const(self, node, name):
        """The constant `name` that node takes, or an InputError: node computes on it as
        portanet's layers do not (a weight, a shape), and only constants can be read."""
        if name not in self.values:
            raise self.unsupported(node, f"its input {name!r} must be a constant")
        return self.values[name]

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

    def constant(self, node, attrs):
        if not attrs:
            raise self.damaged(node, "a Constant of no value")
        if "value" in attrs:
            value = self.onnx.numpy_helper.to_array(attrs["value"])
        else:
            key = next(iter(attrs))
            value = np.array(attrs[key], np.float32 if "float" in key else np.int64)
        self.values[node.output[0]] = value

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
        self.values[node.output[0]] = np.asarray(folds[t]())

    def shape(self, node, attrs, dims):
        """A Shape node of the stream, whose samples are of shape `dims`: their shape after
        BATCH (the free batch size's stand-in), sliced by its start and end."""
        full = np.array([BATCH, *dims], np.int64)
        self.values[node.output[0]] = full[attrs.get("start", 0):attrs.get("end", None)]


class Op:
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


def read_node(reader, node, work):
    """work(the node's attributes as values, string attributes as text); a node whose
    values the onnx package or NumPy cannot take (ValueError, KeyError, ...) is a damaged
    file, a ModelFileError naming it. NumPy's warnings are off: a fold's inf is refused
    where it is used."""
    try:
        with np.errstate(all="ignore"):
            work({a.name: _text(reader.onnx.helper.get_attribute_value(a))
                  for a in node.attribute})
    except PortanetError:
        raise
    except (ValueError, KeyError, IndexError, TypeError, OverflowError) as e:
        raise ModelFileError(f"{reader.where}: node {_name(node)} ({node.op_type}) cannot "
                             f"be read: {type(e).__name__}: {e}") from e


class Graph(NodeErrors):
    """The first pass over `graph`: its constants (`constants`), its one input (`input`,
    samples of `input_shape`) and output, and the Ops of the activation stream: `ops`
    {output value: Op} in the graph's order, `users` {value: [Ops taking it]}, `shapes`
    {stream value: its per-sample shape}, and the BatchNorm running variances (`variances`:
    (node, name, array)), checked >= 0 once the layers are known. Every node is read in
    __init__."""

    def __init__(self, onnx, graph, where):
        self.onnx, self.where = onnx, where
        self.constants = Constants(onnx, graph, where)
        self.shapes, self.ops, self.users, self.pending = {}, {}, {}, {}
        self.splits = {}        # {q, k or v of a Split of the stream: (the Split, its input)}
        self.variances = []                     # (node, name, BatchNorm's running variance)
        inputs = [i for i in graph.input if i.name not in self.constants.values]
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
                read_node(self, node, lambda attrs: self.take(node, attrs))

    def take(self, node, attrs):
        """One node that is not a Constant: folded, a Shape of the stream, a part of gelu's
        erf form, or an Op on the stream."""
        stream = [i for i in node.input if i in self.shapes]
        if self.gelu(node, stream):
            return
        if node.op_type == "Split" and stream:
            self.split(node, attrs, stream[0])
            return
        if node.op_type == "Attention":
            self.add(self.attention(node, attrs))
            return
        if not stream:
            self.constants.fold(node, attrs)
        elif node.op_type == "Shape":
            self.constants.shape(node, attrs, self.shapes[stream[0]])
        else:
            self.add(self.stream_op(node, attrs, stream))

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

    def gelu(self, node, stream):
        """Whether node is one of gelu's erf form, 0.5 x (1 + erf(x / sqrt 2)), as PyTorch's
        exporters write gelu before opset 20 (in either order of the products): its partial
        values wait in `pending` as (stage, x) until the last product makes the activation."""
        t, ins = node.op_type, list(node.input)
        pend = [self.pending.get(i) for i in ins]

        def is_const(name, value):
            c = self.constants.values.get(name)
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
        self.add(Op(node, "act", [step[1]], node.output[0], self.shapes[step[1]],
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
            return Op(node, kind, list(inputs), out, out_shape, **more)

        if t == "Identity":
            return op("skip")
        if t == "Dropout":
            given = len(node.input) > 1 and node.input[1]
            rate = self.number(node, attrs, "ratio", 0.5, 0, 1, value=float(
                self.constants.const(node, node.input[1])) if given else None)
            layer = self.layer(node, f"ratio {rate}", lambda: L.Dropout(_float32(rate)))
            return op("layer", layer=layer, weights={})
        if t in ACTIVATIONS:
            self.check_activation(node, t, attrs, shape)
            return op("act", activation=ACTIVATIONS[t])
        if t == "Transpose" and isinstance(shape, L.Tokens):
            if list(attrs.get("perm", [])) != [0, 2, 1]:
                raise self.unsupported(node, "a transpose of a sequence other than its tokens "
                                             "and features")
            return op("skip", tuple(shape))     # (N, features, T): portanet's own order
        if isinstance(shape, L.Tokens) and t in ("Flatten", "Reshape"):
            raise self.unsupported(node, "a flatten of a sequence's (N, T, features) other "
                                         "than after a Transpose to (N, features, T)")
        if t in ("Flatten", "Reshape"):
            if t == "Flatten" and attrs.get("axis", 1) != 1:
                raise self.unsupported(node, "portanet flattens from axis 1")
            target = (BATCH, math.prod(shape))
            if t == "Reshape":
                target = _resolve((BATCH, *shape), self.constants.const(node, node.input[1]),
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
            b = self.constants.weight(node, next(i for i in node.input if i != x), "bias")
            made = self.ops.get(x)
            if isinstance(shape, L.Tokens) and made is not None and made.kind == "layer" \
                    and type(made.layer) is L.Embedding and not made.layer.positions \
                    and b.size == shape[0] * shape[1] and self.users.get(x) is None:
                # an embedding's positions: the row of each token added
                made.layer = L.Embedding(made.layer.vocab, made.layer.dim, positions=True)
                made.weights["pos"] = b.reshape(shape[1], shape[0]).astype(np.float64)
                return op("skip")
            if len(shape) not in (1, 2) or b.size != shape[0]:
                raise self.unsupported(node, f"an Add of a {b.shape} constant to {shape} "
                                             f"samples; portanet adds biases after MatMul")
            return op("bias", bias=b.reshape(-1))
        if t == "Gather":
            return self.embedding(node, attrs, x, shape, op)
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
            axes = attrs.get("axes") if "axes" in attrs else \
                self.constants.const(node, node.input[1]) \
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
            gamma, beta, mean = (self.constants.weight(node, i) for i in names[:3])
            var = self.constants.weight(node, names[3], "running variance")
            self.variances.append((node, names[3], var))     # checked >= 0 in check_sizes
            momentum = self.number(node, attrs, "momentum", 0.9, 0, 1)
            eps = self.number(node, attrs, "epsilon", 1e-5, 0, math.inf)
            # float32 attributes: 0.1 would come back as 0.10000002384185791
            layer = self.layer(node, f"epsilon {_float32(eps)!r}, momentum "
                                     f"{_float32(momentum)!r}", lambda: L.BatchNorm(
                                         momentum=_float32(1.0 - momentum), eps=_float32(eps)))
            return op("layer", layer=layer, weights={
                "gamma": gamma, "beta": beta, "running_mean": mean, "running_var": var})
        if t == "LayerNormalization":
            return self.layernorm(node, attrs, shape, op)
        raise self.unsupported(node)

    def layernorm(self, node, attrs, shape, op):
        """LayerNormalization over the features of vectors (axis -1 or 1), with a scale and
        a bias of one value each (or one for all)."""
        if len(shape) not in (1, 2) or attrs.get("axis", -1) not in (-1, len(shape)):
            raise self.unsupported(node, f"a normalization over axis {attrs.get('axis', -1)} "
                                         f"of {shape} samples; portanet's LayerNorm takes the "
                                         f"features of vectors or of a sequence's tokens")
        if len([o for o in node.output if o]) > 1:
            raise self.unsupported(node, "its mean and 1/std as outputs")
        if len(node.input) < 2 or not node.input[1]:
            raise self.damaged(node, "its scale is missing")
        n = shape[0]
        gamma = self.constants.weight(node, node.input[1], "scale")
        beta = self.constants.weight(node, node.input[2], "bias") \
            if len(node.input) > 2 and node.input[2] else np.zeros(n)
        for name, v in (("scale", gamma), ("bias", beta)):
            if v.size not in (1, n):
                raise self.unsupported(node, f"a {name} of shape {v.shape} for {n} features")
        eps = self.number(node, attrs, "epsilon", 1e-5, 0, math.inf)
        layer = self.layer(node, f"epsilon {_float32(eps)!r}",
                           lambda: L.LayerNorm(eps=_float32(eps)))
        return op("layer", layer=layer, weights={
            "gamma": np.broadcast_to(gamma.reshape(-1), (n,)).astype(np.float64),
            "beta": np.broadcast_to(beta.reshape(-1), (n,)).astype(np.float64)})

    def embedding(self, node, attrs, x, shape, op):
        """Gather of a constant table (vocab, dim) at the graph's token ids: Embedding."""
        if x != self.input or node.input[1] != x or attrs.get("axis", 0) != 0 \
                or len(shape) != 1:
            raise self.unsupported(node, "a Gather other than of a table's rows at the "
                                         "graph's token ids (N, T)")
        table = self.constants.weight(node, node.input[0], "table")
        if table.ndim != 2:
            raise self.unsupported(node, f"a table of shape {table.shape}")
        layer = self.layer(node, f"a table of {table.shape}",
                           lambda: L.Embedding(table.shape[0], table.shape[1]))
        return op("layer", L.Tokens((table.shape[1], shape[0])), layer=layer,
                  weights={"table": table.astype(np.float64)})

    def split(self, node, attrs, x):
        """A Split of a sequence's features into three equal parts (q, k and v), which
        only an Attention may take."""
        shape = self.shapes[x]
        parts = [o for o in node.output if o]
        sizes = self.constants.const(node, node.input[1]) if len(node.input) > 1 \
            and node.input[1] else attrs.get("split")
        sizes = [shape[0] // 3] * 3 if sizes is None else [int(v) for v in np.ravel(sizes)]
        if not isinstance(shape, L.Tokens) or attrs.get("axis", 0) not in (-1, 2) \
                or len(parts) != 3 or sizes != [shape[0] // 3] * 3 or shape[0] % 3:
            raise self.unsupported(node, "a Split other than of a sequence's features into "
                                         "three equal parts (q, k and v for an Attention)")
        for part in parts:
            self.splits[part] = (node, x)

    def attention(self, node, attrs):
        """ONNX's Attention over q, k and v of one Split of the stream, of equal heads, no
        mask or cache, the default scale: MultiHeadAttention's core, which Stream joins
        with the products on either side."""
        ins = [i for i in node.input if i]
        made = [self.splits.get(i) for i in ins]
        if len(ins) != 3 or None in made or len({id(m[0]) for m in made}) != 1 \
                or ins != [o for o in made[0][0].output if o]:
            raise self.unsupported(node, "an Attention other than over q, k and v of one "
                                         "Split of the stream, in that order")
        heads = int(attrs.get("q_num_heads", 0))
        x = made[0][1]
        dim = self.shapes[x][0] // 3
        if heads < 1 or attrs.get("kv_num_heads", heads) != heads or dim % heads \
                or attrs.get("softcap", 0.0) or attrs.get("qk_matmul_output_mode", 0) \
                or len([o for o in node.output if o]) != 1:
            raise self.unsupported(node, "heads other than q's and kv's alike dividing the "
                                         "features, a softcap, or outputs beside y")
        if "scale" in attrs and not math.isclose(attrs["scale"], (dim // heads) ** -0.5,
                                                 rel_tol=1e-6):
            raise self.unsupported(node, f"a scale other than 1 / sqrt({dim // heads})")
        causal = bool(attrs.get("is_causal", 0))
        layer = self.layer(node, f"{heads} heads",
                           lambda: L.MultiHeadAttention(heads, causal=causal))
        return Op(node, "attention", [x], node.output[0], L.Tokens((dim, self.shapes[x][1])),
                  layer=layer)

    def check_activation(self, node, t, attrs, shape):
        if t in ALPHA and not math.isclose(attrs.get("alpha", 0.01 if t == "LeakyRelu"
                                                     else 1.0), ALPHA[t], rel_tol=1e-6):
            raise self.unsupported(node, f"alpha {attrs['alpha']}; portanet's {t} has "
                                         f"alpha {ALPHA[t]}")
        if t == "Gelu" and attrs.get("approximate", "none") != "none":
            raise self.unsupported(node, "the tanh approximation; portanet's gelu is erf's")
        if t == "Softmax" and attrs.get("axis", -1) not in (-1, len(shape)):
            raise self.unsupported(node, "softmax over other than the features of vectors "
                                         "or of a sequence's tokens")

    def check_images(self, node, shape):
        if len(shape) != 3:
            raise self.unsupported(node, f"it takes images, the stream has {shape} samples")

    def dense(self, node, attrs, x, shape, op):
        tokens = isinstance(shape, L.Tokens)        # a product a token at a time
        if len(shape) != 1 and not (tokens and node.op_type == "MatMul"):
            raise self.unsupported(node, f"a product with {shape} samples; flatten first")
        if len(node.input) < 2:
            raise self.damaged(node, "its weight is missing")
        w = self.constants.weight(node, node.input[1])
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
                c = self.constants.weight(node, node.input[2], "bias")
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
        out = L.Tokens((w.shape[0], shape[1])) if tokens else (w.shape[0],)
        return op("layer", out, layer=layer,
                  weights={"w": w, "b": np.zeros(w.shape[0]) if b is None else b},
                  bias=b is not None)

    def scaled(self, node, factor, value, dtype, what):
        """factor * value in float64, refused where the graph's own type (dtype) would
        hold NaN or inf."""
        out = factor * value.astype(np.float64)
        with np.errstate(over="ignore"):
            cast = out.astype(dtype)
        if not np.isfinite(cast).all():
            self.constants.finite(node, cast, f"{what} (in {dtype})")
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
        w = self.constants.weight(node, node.input[1])
        if w.ndim != 4 or attrs.get("group", 1) != 1:
            raise self.unsupported(node, f"a weight of shape {w.shape}, group "
                                         f"{attrs.get('group', 1)}")
        k, s, p = self.window(node, attrs, w.shape[2:], shape)
        if w.shape[1] != shape[0]:
            raise self.unsupported(node, f"a weight for {w.shape[1]} channels on {shape[0]}")
        b = self.constants.weight(node, node.input[2], "bias") \
            if len(node.input) > 2 and node.input[2] else np.zeros(w.shape[0])
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
