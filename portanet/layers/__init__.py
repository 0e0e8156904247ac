"""Layers, written once against the Backend interface.

Activations are (features, batch): a column per sample. A trainable layer's parameters
(Dense: w (out x in), b (out,)) are views of one flat vector the network allocates (`flat`),
and the optimizer's state (`state`) is laid out alike; it has views z, a of its batch
buffers, and its input a_prev is a view of the previous layer's a. Backward overwrites
activations with gradients and writes the gradient products where the optimizer says, so
a training step allocates nothing.

Modules: base (the protocol and what walks it), dense (Dense, Conv2D, Embedding, pools,
Dropout, Flatten), blocks (BatchNorm, LayerNorm, Residual), attention
(MultiHeadAttention); this one names them and reads a saved layer back.
"""
from ..backends.base import conv_out
from ..errors import InputError
from .base import (DELTA_AND_BIAS, MAX_NESTING, Layer, Masks, Tokens, _short, masking,
                   nesting_error, parameter_views, walk, walk_one)
from .attention import MultiHeadAttention
from .blocks import BatchNorm, LayerNorm, Residual
from .dense import (AvgPool2D, Conv2D, Dense, Dropout, Embedding, Flatten, GlobalAvgPool2D,
                    MaxPool2D, _Pool2D)

__all__ = ["Layer", "Tokens", "Dense", "Embedding", "Conv2D", "MaxPool2D", "AvgPool2D", "GlobalAvgPool2D",
           "Dropout", "Flatten", "BatchNorm", "LayerNorm", "MultiHeadAttention", "Residual", "LAYERS", "MAX_NESTING",
           "DELTA_AND_BIAS", "Masks", "masking", "from_config", "walk", "walk_one", "parameter_views",
           "conv_out", "nesting_error"]

LAYERS = {"Dense": Dense, "Embedding": Embedding, "Flatten": Flatten, "Conv2D": Conv2D, "MaxPool2D": MaxPool2D,
          "Dropout": Dropout, "AvgPool2D": AvgPool2D, "GlobalAvgPool2D": GlobalAvgPool2D,
          "BatchNorm": BatchNorm, "LayerNorm": LayerNorm,
          "MultiHeadAttention": MultiHeadAttention, "Residual": Residual}



def from_config(name, config, depth=0):
    """The layer saved as (name, config), or an InputError saying what is wrong. depth:
    the Residual blocks around it, which may nest MAX_NESTING deep (refused before
    the configuration inside is read)."""
    if name not in LAYERS:
        raise InputError(f"unknown layer type {name!r}; portanet has {', '.join(LAYERS)}")
    if not isinstance(config, dict) or not all(isinstance(k, str) for k in config):
        raise InputError(f"{name}: its configuration must be a mapping of argument names, "
                         f"got {_short(config)}")
    if name == "Residual" and isinstance(config.get("layers"), list):
        if depth >= MAX_NESTING:
            raise nesting_error(f"{depth + 1} or more", "the saved Residual blocks")
        config = dict(config, layers=[from_config(*_pair(l), depth + 1)
                                      for l in config["layers"]])
    try:
        return LAYERS[name](**config)
    except TypeError as e:           # a missing or unknown argument
        raise InputError(f"{name}({', '.join(config)}): {e}") from e


def _pair(saved):
    if not (isinstance(saved, (list, tuple)) and len(saved) == 2 and isinstance(saved[0], str)):
        raise InputError(f"Residual: each of its saved layers must be [name, configuration], "
                         f"got {_short(saved)}")
    return saved
