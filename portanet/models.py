"""Networks from a short description, and the ready-made ones written in it.

A description is a sequence of layers, each `name(arguments)`:

    conv(16, 3, relu) conv(32, 3, relu) maxpool(2) flatten dense(10, softmax)

    dense(units, activation)                              Dense
    conv(filters, kernel, activation, stride=1, padding=0)   Conv2D (pad= for padding=)
    maxpool(pool, stride=pool)                            MaxPool2D
    avgpool(pool, stride=pool)                            AvgPool2D
    globalavgpool                                         GlobalAvgPool2D
    batchnorm(activation, momentum=0.1, eps=1e-5)         BatchNorm
    layernorm(eps=1e-5)                                   LayerNorm
    embedding(vocab, dim, positions=false)                Embedding
    attention(heads, causal=true, dropout=0)              MultiHeadAttention
    residual(layers..., activation)                       Residual
    dropout(rate)                                         Dropout
    flatten                                               Flatten

A residual block holds a description of its own, then its activation after a comma:
`residual(conv(32, 3, pad=1) batchnorm(relu) conv(32, 3, pad=1) batchnorm, relu)`. Blocks
may nest one inside another up to layers.MAX_NESTING (16) deep.
The loss follows the last activation: softmax -> softmax cross-entropy, sigmoid -> binary
cross-entropy, anything else -> MSE (or give loss=...).
"""
import math
import re

import numpy as np

from .errors import InputError
from .layers import (MAX_NESTING, AvgPool2D, BatchNorm, Conv2D, Dense, Dropout, Embedding,
                     Flatten, GlobalAvgPool2D, LayerNorm, MaxPool2D, MultiHeadAttention,
                     Residual, nesting_error)
from .network import Sequential

LAYER_NAMES = {"dense": Dense, "conv": Conv2D, "maxpool": MaxPool2D, "avgpool": AvgPool2D,
               "globalavgpool": GlobalAvgPool2D, "batchnorm": BatchNorm, "residual": Residual,
               "dropout": Dropout, "flatten": Flatten, "layernorm": LayerNorm,
               "embedding": Embedding, "attention": MultiHeadAttention}
ALIASES = {"conv2d": "conv", "bn": "batchnorm", "gap": "globalavgpool"}
KEYWORDS = {"pad": "padding"}
LOSS_FOR = {"softmax": "softmax_cross_entropy", "sigmoid": "binary_cross_entropy"}
SEPARATORS = " \t\n,;->"

LENET = "conv(16, 3, relu) conv(32, 3, relu) maxpool(2) flatten dense({classes}, {output})"

# A ResNet for 28 x 28 images: a stem, three stages of two residual blocks of two 3x3
# convolutions with batch normalization (the first block of the second and third stages
# halves the image and doubles the channels, with a 1x1 projection on the shortcut), global
# average pooling, dropout and the classifier. Two blocks per stage and the dropout are what
# it takes to pass 0.93 on Fashion-MNIST in 10 epochs of Adam (one block per stage, with or
# without dropout or weight decay, and twice the width stayed at 0.92-0.93 on an H100:
# docs/benchmarks-h100.md).
_BLOCK = "residual(conv({w}, 3, stride={s}, pad=1) batchnorm(relu) conv({w}, 3, pad=1) batchnorm, relu) "
RESNET_BLOCKS = ((32, 1), (32, 1), (64, 2), (64, 1), (128, 2), (128, 1))   # (width, stride)
RESNET = ("conv(32, 3, pad=1) batchnorm(relu) "
          + "".join(_BLOCK.format(w=w, s=s) for w, s in RESNET_BLOCKS)
          + "globalavgpool dropout(0.3) dense({classes}, {output})")
# the benchmark GPT (portanet bench's gpt-step, its PyTorch peer): nanoGPT's character-level
# baby GPT, its vocabulary (tinyshakespeare's 65 characters), context and batch
GPT_STEP = dict(vocab=65, context=256, layers=6, heads=6, dim=384, dropout=0.2, batch=64)
# the benchmark MLPs (portanet bench, its PyTorch peer): layer sizes, activations, loss and
# the batch a step takes
MLPS = {"mlp-big": ([10000, 5000, 1000, 10], ["tanh", "sigmoid", "sigmoid"],
                    "binary_cross_entropy", 10000),
        "mlp-small": ([1000, 500, 100, 10], ["relu", "relu", "softmax"],
                      "softmax_cross_entropy", 1000)}


def parse(description):
    """[layer objects] from a description, read in one pass over its parentheses (the text
    between them is sliced once): Residual blocks may nest layers.MAX_NESTING deep, and a
    description nested deeper is refused before any of it is built."""
    if not isinstance(description, str):
        raise InputError(f"a model description is text such as 'dense(10, softmax)', got "
                         f"{description!r}")
    text = description.strip()
    layers = _layers(text, 0, len(text), _groups(text))
    if not layers:
        raise InputError("the model description is empty")
    return layers


def _groups(text):
    """{index of each '(': (index of its ')', [indices of its own commas])}, in one pass;
    an InputError where they nest deeper than MAX_NESTING blocks around a layer's own
    arguments. A '(' left open is not in it; a ')' that closes nothing is left to _layers."""
    groups, open_ = {}, []
    for m in _PUNCTUATION.finditer(text):
        c, i = m.group(), m.start()
        if c == "(":
            open_.append((i, []))
            if len(open_) > MAX_NESTING + 1:
                raise nesting_error(f"{len(open_) - 1} or more",
                                    "the model description's residual blocks")
        elif open_ and c == ")":
            at, commas = open_.pop()
            groups[at] = (i, commas)
        elif open_:
            open_[-1][1].append(i)
    return groups


_PUNCTUATION = re.compile(r"[(),]")


def _layers(text, pos, end, groups):
    """The layers described by text[pos:end]."""
    layers = []
    while True:
        while pos < end and text[pos] in SEPARATORS:
            pos += 1
        if pos == end:
            return layers
        start = pos
        while pos < end and (text[pos].isalnum() or text[pos] == "_"):
            pos += 1
        if pos == start:
            raise InputError(f"cannot read the model description at {text[start:end]!r}; "
                             f"write layers as name(arguments), e.g. 'dense(10, softmax)'")
        name, args = text[start:pos].lower(), None
        while pos < end and text[pos] == " ":
            pos += 1
        if pos < end and text[pos] == "(":
            if pos not in groups or groups[pos][0] >= end:
                raise InputError(f"missing ')' in the model description at "
                                 f"{text[start:end]!r}")
            close, commas = groups[pos]
            args = (pos + 1, close, commas)
            pos = close + 1
        layers.append(_layer(name, text, args, groups))


def _pieces(text, args):
    """(start, end) of each top-level comma-separated piece of the arguments, those that
    are not blank."""
    if args is None:
        return []
    start, close, commas = args
    bounds = [start] + [c + 1 for c in commas]
    ends = list(commas) + [close]
    return [(a, b) for a, b in zip(bounds, ends) if text[a:b].strip()]


def _layer(name, text, args, groups):
    """The layer for name(args), args being (start, end, commas) of the text between the
    parentheses, or None."""
    name = ALIASES.get(name, name)
    shown = f"{name}({text[args[0]:args[1]] if args else ''})"
    if name not in LAYER_NAMES:
        raise InputError(f"unknown layer {name!r} in the model description; use one of "
                         f"{', '.join(LAYER_NAMES)} (or a ready-made model: "
                         f"{', '.join(MODELS)})")
    positional, keywords = [], {}
    pieces = _pieces(text, args)
    if name == "residual":
        if not pieces:
            raise InputError("residual(...) needs its layers, e.g. "
                             "'residual(conv(8, 3, pad=1) batchnorm, relu)'")
        positional.append(_layers(text, *pieces.pop(0), groups))
    for a, b in pieces:
        arg = text[a:b].strip()
        key, eq, value = arg.partition("=")
        if eq and "(" not in key:
            keywords[KEYWORDS.get(key.strip(), key.strip())] = _value(value.strip())
        else:
            positional.append(_value(arg))
    cls = LAYER_NAMES[name]
    if cls is Conv2D and len(positional) > 2 and isinstance(positional[2], str):
        keywords["activation"] = positional.pop(2)
    try:
        return cls(*positional, **keywords)
    except (InputError, TypeError) as e:
        raise InputError(f"{shown}: {e}") from e


def _value(text):
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def from_description(description, input_shape, loss=None, device=None, dtype="float32", seed=0,
                     precision=None, loss_scale="auto"):
    """A Sequential network built from a description (see the module's docstring)."""
    layers = parse(description)
    if loss is None:
        loss = LOSS_FOR.get(getattr(layers[-1], "activation", None), "mse")
    return Sequential(layers, input_shape, loss, device, dtype, seed, precision, loss_scale)


def _output(classes):
    return "sigmoid" if classes == 1 else "softmax"


def mlp(input_shape=(784,), classes=10, hidden=(512, 256), activation="relu",
        device=None, dtype="float32", seed=0, precision=None, loss_scale="auto"):
    """Multi-layer perceptron: Dense hidden layers, then softmax (or one sigmoid output for
    two-class problems, classes=1) with its fused cross-entropy."""
    text = " ".join(f"dense({n}, {activation})" for n in hidden)
    text += f" dense({classes}, {_output(classes)})"
    return from_description(text, input_shape, device=device, dtype=dtype, seed=seed,
                            precision=precision, loss_scale=loss_scale)


def lenet(input_shape=(1, 28, 28), classes=10, device=None, dtype="float32", seed=0,
          precision=None, loss_scale="auto"):
    """The seed's CNN: conv 16 3x3 relu, conv 32 3x3 relu, maxpool 2x2, flatten, dense."""
    return from_description(LENET.format(classes=classes, output=_output(classes)),
                            input_shape, device=device, dtype=dtype, seed=seed,
                            precision=precision, loss_scale=loss_scale)


def resnet(input_shape=(1, 28, 28), classes=10, device=None, dtype="float32", seed=0,
           precision=None, loss_scale="auto"):
    """A small ResNet for 28 x 28 images (RESNET): 0.7 M parameters, three stages of two
    residual blocks of 32, 64 and 128 channels with batch normalization; train it with
    Adam."""
    return from_description(RESNET.format(classes=classes, output=_output(classes)),
                            input_shape, device=device, dtype=dtype, seed=seed,
                            precision=precision, loss_scale=loss_scale)


def gpt(vocab, context, layers=6, heads=6, dim=384, dropout=0.2, device=None,
        dtype="float32", seed=0, precision=None, loss_scale="auto"):
    """A GPT (Radford et al.), laid out as nanoGPT's: token and position embeddings, then
    `layers` pre-norm blocks, each a causal self-attention of `heads` heads and an MLP of
    4 dim gelu units, each added to its input, then a LayerNorm and a softmax over the
    vocabulary for every token: a language model over `context` tokens, its input (N,
    context) token ids and its targets the next token of each. The defaults are nanoGPT's
    character-level "baby GPT" (6 layers, 6 heads, 384 wide, dropout 0.2; for 65
    characters and a context of 256, 10.8 M parameters). Dropout goes after the
    embeddings, on the attention's probabilities and at the end of each block's branch, as
    nanoGPT's; unlike nanoGPT's, the output's weights are not tied to the token
    embedding's, and every Dense and LayerNorm has a bias. The weights start as GPT-2's: normal with
    deviation 0.02, the products that end a block's branch 0.02 / sqrt(2 layers), biases
    0 (drawn from seed). Train it with AdamW."""
    drop = f" dropout({dropout})" if dropout else ""
    attend = f"attention({heads}, dropout={dropout})" if dropout else f"attention({heads})"
    block = (f"residual(layernorm {attend}{drop}) "
             f"residual(layernorm dense({4 * dim}, gelu) dense({dim}){drop}) ")
    text = (f"embedding({vocab}, {dim}, positions=true){drop} " + block * layers
            + f"layernorm dense({vocab}, softmax)")
    net = from_description(text, (context,), device=device, dtype=dtype, seed=seed,
                           precision=precision, loss_scale=loss_scale)
    rng = np.random.default_rng([seed, 2])
    weights = net.get_weights()
    ends = set()                        # the products that end a residual branch
    for path, layer in net.walk():
        if isinstance(layer, Residual):
            last = [(p, l) for p, l in net.walk() if p.startswith(path + ".")
                    and isinstance(l, (Dense, MultiHeadAttention))][-1]
            ends.add(f"{last[0]}.{'w_o' if isinstance(last[1], MultiHeadAttention) else 'w'}")
    for name, value in weights.items():
        kind = name.rsplit(".", 1)[1]
        if kind in ("w", "w_qkv", "w_o"):
            deviation = 0.02 / math.sqrt(2 * layers) if name in ends else 0.02
            value[...] = rng.normal(0.0, deviation, value.shape)
        elif kind in ("b", "b_qkv", "b_o"):
            value[...] = 0.0
    net.set_weights(weights)
    return net


MODELS = {"mlp": mlp, "lenet": lenet, "resnet": resnet}


def build(model, input_shape, classes, **where):
    """The network named `model` (MODELS, or gpt: a language model over a vocabulary of
    `classes` and windows of input_shape[0] tokens) for inputs of input_shape and
    `classes` outputs, or, for any other string, the one its description builds (from_description); `where`:
    device, seed, precision and the like."""
    if model == "gpt":                      # a language model: classes is its vocabulary
        return gpt(classes, input_shape[0], **where)
    if model in MODELS:
        return MODELS[model](input_shape=input_shape, classes=classes, **where)
    return from_description(model, input_shape, **where)
