"""PyTorch state dicts onto portanet networks.

A state dict names tensors "<module>.<tensor>" ("0.weight", "features.3.running_mean"),
in the order the modules were registered. Its modules with tensors are matched, in that
order, with the network's layers that have parameters (Sequential.walk: Residual blocks'
layers in order, then their projection): Linear -> Dense (weight (out, in) is w),
Conv2d -> Conv2D (weight (F, C, k, k) is w as (F, C.k.k)), BatchNorm1d/2d -> BatchNorm
(weight, bias, running_mean, running_var; num_batches_tracked is not kept). A layer
without bias in PyTorch (bias=False before a BatchNorm) gets b = 0. Everything is
checked before any parameter is written.
"""
import os
from collections.abc import Mapping

import numpy as np

from . import layers as L
from .errors import InputError, ModelFileError, ShapeError
from .saving import checked_weights

SKIPPED = ("num_batches_tracked",)          # PyTorch bookkeeping that portanet keeps not


def load_torch_state(net, state):
    """Set net's parameters from a PyTorch state dict: a dict of tensors or arrays, a
    torch module, or a file (.safetensors read without torch; a torch.save pickle such as
    .pt/.pth needs torch, read with weights_only=True). The values pass set_weights' checks
    (finite, BatchNorm variances >= 0); the network is held for the whole call, so that
    another thread's fit cannot come between reading its weights and writing them."""
    tensors = _tensors(state)
    # set_weights' rule, here too so that the message names the state dict's key
    checked_weights(tensors, net.backend.dtype,
                    lambda problem: InputError(f"load_torch_state: {problem}"))
    with net._using("load_torch_state"):
        _load(net, tensors)


def _load(net, tensors):
    modules = _modules(tensors)
    layers = [(path, layer) for path, layer in net.walk() if layer.parameters()]
    if len(modules) != len(layers):
        raise ShapeError(
            f"the state dict has {len(modules)} modules with tensors "
            f"({', '.join(p or '(root)' for p, _ in modules) or 'none'}), the network "
            f"{len(layers)} layers with parameters ({', '.join(f'{p}: {l}' for p, l in layers)})"
            f": load a state dict of a torch.nn.Sequential with the same layers in the same "
            f"order")
    values = net.get_weights()
    for (prefix, found), (path, layer) in zip(modules, layers):
        for name, value in _mapped(prefix, found, path, layer).items():
            key = f"{path}.{name}"
            if value.shape != values[key].shape:
                raise ShapeError(f"{_key(prefix, _torch_name(name))} has shape {value.shape}; "
                                 f"layer {path} ({layer}) needs {values[key].shape}")
            values[key] = value
    net.set_weights(values)


def _mapped(prefix, found, path, layer):
    """{portanet name: array} of one module's tensors for one layer, or a ShapeError."""
    if isinstance(layer, L.BatchNorm):
        names = {"weight": "gamma", "bias": "beta", "running_mean": "running_mean",
                 "running_var": "running_var"}
        kind, required = "a BatchNorm", {"running_mean", "running_var"}
    elif isinstance(layer, L.Dense):
        names = {"weight": "w", "bias": "b"}
        kind, required = "a Conv2d" if isinstance(layer, L.Conv2D) else "a Linear", {"weight"}
    else:
        raise ShapeError(f"layer {path} ({layer}) has parameters portanet cannot map from "
                         f"PyTorch")
    unknown, missing = sorted(set(found) - set(names)), sorted(required - set(found))
    if unknown or missing:
        raise ShapeError(f"module {prefix or '(root)'} ({', '.join(sorted(found))}) does not "
                         f"match layer {path} ({layer}), which takes {kind}'s tensors "
                         f"({', '.join(names)})")
    weight = found["weight"]
    if isinstance(layer, L.Conv2D) and weight.shape != (layer.units, layer.in_shape[0],
                                                        layer.k, layer.k):
        raise ShapeError(f"{_key(prefix, 'weight')} has shape {weight.shape}; layer "
                         f"{path} ({layer}) is a Conv2d weight of "
                         f"{(layer.units, layer.in_shape[0], layer.k, layer.k)}")
    out = {names[n]: value for n, value in found.items()}
    if isinstance(layer, L.Conv2D):
        out["w"] = weight.reshape(layer.units, -1)        # (F, C, k, k) -> (F, C.k.k)
    # absent: bias=False before a BatchNorm, BatchNorm(affine=False)
    defaults = {"b": 0.0, "gamma": 1.0, "beta": 0.0}
    for name in set(names.values()) - set(out):
        out[name] = np.full(layer.parameters()[name], defaults[name])
    return out


def _key(prefix, name):
    return f"{prefix + '.' if prefix else ''}{name}"


def _torch_name(name):
    return {"w": "weight", "b": "bias", "gamma": "weight", "beta": "bias"}.get(name, name)


def _modules(tensors):
    """[(module prefix, {tensor name: array})] in the state dict's order."""
    modules = {}
    for key, value in tensors.items():
        prefix, _, name = key.rpartition(".")
        if name not in SKIPPED:
            modules.setdefault(prefix, {})[name] = value
    return list(modules.items())


def _tensors(state):
    """{key: float64 host array} of a state dict, a module or a file, checked finite."""
    if hasattr(state, "state_dict") and callable(state.state_dict):
        state = state.state_dict()
    if isinstance(state, (str, os.PathLike)):
        state = _read(os.fspath(state))
    if not isinstance(state, Mapping):
        raise InputError(f"load_torch_state takes a state dict, a torch module or a file "
                         f"path, got {type(state).__name__}")
    out = {}
    for key, value in state.items():
        if not isinstance(key, str):
            raise InputError(f"a state dict's keys are names, got {key!r}")
        if key.rpartition(".")[2] in SKIPPED:
            continue
        x = _host(value)
        if not np.issubdtype(x.dtype, np.floating) or not np.all(np.isfinite(x)):
            raise InputError(f"{key} is not a finite float tensor ({x.dtype}); a network's "
                             f"parameters are")
        out[key] = x.astype(np.float64)
    return out


def _host(value):
    """A tensor (torch, anything with DLPack, or array-like) as a host NumPy array."""
    if hasattr(value, "detach"):                          # a torch tensor, maybe on a GPU
        value = value.detach().cpu()
        if str(value.dtype) == "torch.bfloat16":         # NumPy has no bfloat16
            value = value.float()
        return value.numpy()
    if hasattr(value, "__dlpack__") and not isinstance(value, np.ndarray):
        return np.from_dlpack(value)
    return np.asarray(value)


def _read(path):
    if not os.path.isfile(path):
        raise ModelFileError(f"{path} is not a file: give a state dict file (.safetensors, "
                             f".pt, .pth)")
    if path.endswith(".safetensors"):
        import safetensors.numpy
        try:
            return safetensors.numpy.load_file(path)
        except Exception as e:      # safetensors raises its own errors for bad files
            raise ModelFileError(f"cannot read {path} as safetensors: {e}") from e
    try:
        import torch
    except ImportError as e:
        raise InputError(f"{path} is a PyTorch pickle, which only torch reads: pip install "
                         f"torch, or save the state dict with "
                         f"safetensors.torch.save_file and give that file") from e
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:          # pickle, zip and torch's own errors alike
        raise ModelFileError(f"cannot read {path} with torch.load(weights_only=True): "
                             f"{e}") from e
    for key in ("state_dict", "model_state_dict", "model"):     # a training checkpoint
        if isinstance(state, Mapping) and isinstance(state.get(key), Mapping):
            return state[key]
    return state
