"""Networks to files and back: the architecture and the parameters of a Sequential.

The file layer (safetensors, atomic writes, the bounded reader of old .npz files) is
portanet/checkpoint.py; this module maps a network onto it and checks a file against the
architecture it declares before anything is allocated or written: the layers must be
ones portanet has, with valid arguments; the tensors exactly the parameters those layers
have, of their shapes, real and finite; their bytes within the device's memory.
"""
from . import checkpoint, layers as layer_module
from .errors import InputError, ModelFileError, ShapeError


def architecture(net):
    return {"input_shape": list(net.input_shape), "loss": net.loss.name,
            "layers": [[type(l).__name__, l.config()] for l in net.layers]}


def save(net, path):
    tensors = {name: net.backend.download(x) for name, x in _parameters(net).items()}
    checkpoint.write(path, architecture(net), tensors)


def load_weights(net, path):
    with checkpoint.read(path, max_bytes=_cap(net.backend)) as f:
        mine = architecture(net)
        theirs = _architecture(f.architecture, path)
        if [theirs[k] for k in ("layers", "input_shape")] != [mine[k] for k in ("layers", "input_shape")]:
            raise ModelFileError(f"{path} holds a different architecture: {describe(theirs)} "
                                 f"vs this network's {describe(mine)}; use "
                                 f"portanet.load({str(path)!r}) to rebuild it")
        _write_parameters(net, f, path)


def load(path, device=None, dtype="float32"):
    """A network rebuilt from a file written by Sequential.save, on any device."""
    from .network import Sequential
    from .backends import device as get_device
    backend = get_device(device, dtype)
    with checkpoint.read(path, max_bytes=_cap(backend)) as f:
        arch = _architecture(f.architecture, path)
        try:
            layers = [layer_module.from_config(name, cfg) for name, cfg in arch["layers"]]
            net = Sequential(layers, arch["input_shape"], arch["loss"], backend, dtype)
        except (InputError, ShapeError) as e:
            raise ModelFileError(f"{path}: the architecture in the file is not valid: {e}") from e
        _write_parameters(net, f, path)
    return net


def _parameters(net):
    """{"i.name": device array} of every parameter, the names in the file."""
    return {f"{i}.{name}": x for i, layer in enumerate(net.layers)
            for name, x in layer.params().items()}


def _write_parameters(net, f, path):
    """Every parameter from the open file f: names and shapes checked against the network
    first, then each tensor read (real, finite) before any is written to the device."""
    wanted = {name: x.shape for name, x in _parameters(net).items()}
    found = {name: tuple(shape) for name, (_, shape) in f.entries.items()}
    missing = sorted(set(wanted) - set(found))
    extra = sorted(set(found) - set(wanted))
    wrong = [f"{n} is {found[n]}, the network's is {wanted[n]}"
             for n in wanted if n in found and found[n] != wanted[n]]
    if missing or extra or wrong:
        raise ModelFileError(
            f"{path}: its tensors do not match the network's parameters"
            + (f"; missing: {', '.join(missing)}" if missing else "")
            + (f"; not in the network: {', '.join(extra[:5])}" if extra else "")
            + (f"; {'; '.join(wrong)}" if wrong else "")
            + ": the file is damaged or was not written by net.save()")
    values = {name: f.tensor(name) for name in wanted}
    for name, x in _parameters(net).items():
        net.backend.write(x, values[name].astype(net.backend.dtype))


def _architecture(arch, path):
    """The file's architecture with its keys checked (the layers are checked by building
    them): {"input_shape": [...], "loss": str, "layers": [[name, {config}], ...]}."""
    problem = None
    if not isinstance(arch, dict):
        problem = f"it is a {type(arch).__name__}, not a mapping"
    elif any(k not in arch for k in ("input_shape", "loss", "layers")):
        problem = f"it lacks {', '.join(k for k in ('input_shape', 'loss', 'layers') if k not in arch)}"
    elif not isinstance(arch["layers"], list) or not all(
            isinstance(l, list) and len(l) == 2 and isinstance(l[0], str) for l in arch["layers"]):
        problem = "its layers are not a list of [name, configuration] pairs"
    elif not isinstance(arch["input_shape"], list) or not isinstance(arch["loss"], str):
        problem = "input_shape must be a list and loss a name"
    if problem:
        raise ModelFileError(f"{path}: the architecture in the file is not valid ({problem}); "
                             f"the file is damaged or was not written by net.save()")
    return arch


def _cap(backend):
    """No file may bring more tensor bytes than the device has memory in all."""
    return backend.memory_info()[1]


def describe(arch):
    layers = " -> ".join(f"{n}({', '.join(f'{v}' for v in c.values())})"
                         for n, c in arch["layers"])
    return f"input {tuple(arch['input_shape'])} -> {layers}"
