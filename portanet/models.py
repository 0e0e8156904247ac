"""Networks from a short description, and the ready-made ones written in it.

A description is a sequence of layers, each `name(arguments)`:

    conv(16, 3, relu) conv(32, 3, relu) maxpool(2) flatten dense(10, softmax)

    dense(units, activation)                 Dense
    conv(filters, kernel, activation, stride=1, padding=0)   Conv2D
    maxpool(pool, stride=pool)               MaxPool2D
    dropout(rate)                            Dropout
    flatten                                  Flatten

The loss follows the last activation: softmax -> softmax cross-entropy, sigmoid -> binary
cross-entropy, anything else -> MSE (or give loss=...).
"""
import re

from .errors import InputError
from .layers import Conv2D, Dense, Dropout, Flatten, MaxPool2D
from .network import Sequential

LAYER_NAMES = {"dense": Dense, "conv": Conv2D, "maxpool": MaxPool2D, "dropout": Dropout,
               "flatten": Flatten}
LOSS_FOR = {"softmax": "softmax_cross_entropy", "sigmoid": "binary_cross_entropy"}
_NAME = re.compile(r"\s*(\w+)\s*")
_SEPARATOR = re.compile(r"\s*(?:,|->|;)?\s*")

LENET = "conv(16, 3, relu) conv(32, 3, relu) maxpool(2) flatten dense({classes}, {output})"


def parse(description):
    """[layer objects] from a description."""
    if not isinstance(description, str):
        raise InputError(f"a model description is text such as 'dense(10, softmax)', got "
                         f"{description!r}")
    layers, pos = [], 0
    text = description.strip()
    while pos < len(text):
        match = _NAME.match(text, pos)
        if not match:
            raise InputError(f"cannot read the model description at {text[pos:]!r}; write "
                             f"layers as name(arguments), e.g. 'dense(10, softmax)'")
        start, name, pos = pos, match.group(1).lower(), match.end()
        args = None
        if text.startswith("(", pos):
            close = text.find(")", pos)
            if close < 0 or "(" in text[pos + 1:close]:
                raise InputError(f"missing ')' in the model description after "
                                 f"{text[start:close if close >= 0 else None]!r}")
            args, pos = text[pos + 1:close], close + 1
        pos = _SEPARATOR.match(text, pos).end()
        layers.append(_layer(name, args))
    if not layers:
        raise InputError("the model description is empty")
    return layers


def _layer(name, args):
    """The layer for name(args), args being the text between the parentheses."""
    name = "conv" if name == "conv2d" else name
    if name not in LAYER_NAMES:
        raise InputError(f"unknown layer {name!r} in the model description; use one of "
                         f"{', '.join(LAYER_NAMES)} (or a ready-made model: "
                         f"{', '.join(MODELS)})")
    positional, keywords = [], {}
    for arg in filter(None, (a.strip() for a in (args or "").split(","))):
        key, _, value = arg.rpartition("=")
        value = _value(value.strip())
        if key:
            keywords[key.strip()] = value
        else:
            positional.append(value)
    cls = LAYER_NAMES[name]
    if cls is Conv2D and len(positional) > 2 and isinstance(positional[2], str):
        keywords["activation"] = positional.pop(2)
    try:
        return cls(*positional, **keywords)
    except (InputError, TypeError) as e:
        raise InputError(f"{name}({args or ''}): {e}") from e


def _value(text):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def from_description(description, input_shape, loss=None, device=None, dtype="float32", seed=0):
    """A Sequential network built from a description (see the module's docstring)."""
    layers = parse(description)
    if loss is None:
        loss = LOSS_FOR.get(getattr(layers[-1], "activation", None), "mse")
    return Sequential(layers, input_shape, loss, device, dtype, seed)


def _output(classes):
    return "sigmoid" if classes == 1 else "softmax"


def mlp(input_shape=(784,), classes=10, hidden=(512, 256), activation="relu",
        device=None, dtype="float32", seed=0):
    """Multi-layer perceptron: Dense hidden layers, then softmax (or one sigmoid output for
    two-class problems, classes=1) with its fused cross-entropy."""
    text = " ".join(f"dense({n}, {activation})" for n in hidden)
    text += f" dense({classes}, {_output(classes)})"
    return from_description(text, input_shape, device=device, dtype=dtype, seed=seed)


def lenet(input_shape=(1, 28, 28), classes=10, device=None, dtype="float32", seed=0):
    """The seed's CNN: conv 16 3x3 relu, conv 32 3x3 relu, maxpool 2x2, flatten, dense."""
    return from_description(LENET.format(classes=classes, output=_output(classes)),
                            input_shape, device=device, dtype=dtype, seed=seed)


MODELS = {"mlp": mlp, "lenet": lenet}
