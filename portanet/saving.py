"""Networks to files and back: the architecture and the parameters of a Sequential.

The file layer (safetensors, atomic writes, the bounded reader of old .npz files) is
portanet/checkpoint.py; this module maps a network onto it and checks a file against the
architecture it declares before anything is allocated or written: the layers must be
ones portanet has, with valid arguments; the tensors exactly the parameters those layers
have, of their shapes, real and finite; their bytes, and the network's for one sample,
within the device's memory.
"""
from . import checkpoint, layers as layer_module, run_state
from .errors import InputError, ModelFileError, ShapeError
from .memory import elements, size_text


def architecture(net):
    return {"input_shape": list(net.input_shape), "loss": net.loss.name,
            "layers": [[type(l).__name__, l.config()] for l in net.layers]}


TRAINING = "optimizer."      # the prefix of the optimizer's tensors in a checkpoint


def save(net, path, run=None):
    """The network to `path`; with run (a run_state.Run, from fit's checkpoints) also the
    optimizer's state and what resuming needs, in the metadata's "training" entry."""
    tensors = {name: net.backend.download(x) for name, x in _parameters(net).items()}
    metadata = None
    if run is not None:
        tensors.update({name: net.backend.download(x)
                        for name, x in net.optimizer_state.tensors().items()})
        metadata = {"training": run_state.training_metadata(net, run)}
    checkpoint.write(path, architecture(net), tensors, metadata)


def resume(net, path, settings, epochs):
    """The run_state.Run saved in checkpoint `path`, after writing its parameters, optimizer
    state, step count and Dropout steps into net, whose optimizer state fit has prepared.
    The file must come from fit(checkpoint=...) of this architecture with the same
    settings (run_state.SETTINGS and LATER_SETTINGS: precision, batch size, optimizer,
    schedule, seed, shuffling, samples, loss scale, loss, validation, ranks), its training
    state whole and sound (run_state.read_training), and hold fewer than `epochs` epochs:
    else resuming could not end where the uninterrupted run would.
    Everything is checked before anything is written."""
    with checkpoint.read(path, max_bytes=_cap(net.backend)) as f:
        run, step, dropout_steps = _resumable(net, f, path, settings, epochs)
        state = net.optimizer_state.tensors()
        _write_parameters(net, f, path, extra=state)
        net.optimizer_state.t = step
        for name, layer in net.walk():
            if name in dropout_steps:
                layer.step = dropout_steps[name]
    return run


def check_resume(net, path, settings, epochs):
    """What resume checks, without writing anything: fit calls it before it prepares
    anything for the run, so that a checkpoint it cannot resume leaves the network as it
    was."""
    with checkpoint.read(path, max_bytes=_cap(net.backend)) as f:
        _resumable(net, f, path, settings, epochs)


# Where the setting comes from, said when it differs (the first of these that differs).
_SETTING_HINTS = {
    "precision": lambda theirs: (
        f"the precision is the network's: make it in {theirs} (precision= on Sequential, "
        f"the models and load; --precision; PORTANET_PRECISION)"),
    "loss_scale": lambda theirs: ("the loss scale is the network's: make it with the same "
                                  "loss_scale (Sequential, the models, load)"),
    "loss": lambda theirs: (f"the loss is the network's: make it with loss={theirs!r} "
                            f"(Sequential, the models, load keep the file's)"),
    "validation": lambda theirs: ("validate as the run that wrote it did "
                                  + ("(validation_data or validation_split)" if theirs else
                                     "(without validation_data or validation_split)")),
    "ranks": lambda theirs: f"run it on {theirs} ranks, as the run that wrote it",
}


def _resumable(net, f, path, settings, epochs):
    """(run, step, dropout_steps) of the open checkpoint f, once its architecture, its
    training state and its settings are found to be net's and fit's; nothing written."""
    _check_same(net, f, path)
    if "training" not in f.metadata:
        raise ModelFileError(f"{path} holds a network but no training state; resume "
                             f"from a file written by fit(checkpoint=...)")
    run, step, dropout_steps = run_state.read_training(f.metadata["training"], path, net)
    # a file written before a setting was recorded has it as the run resuming it (the
    # loss: its architecture's), as nothing of it can be told
    run.settings.setdefault("loss", f.architecture["loss"])
    for key in run_state.LATER_SETTINGS:
        run.settings.setdefault(key, settings.get(key))
    differ = [f"{k}: {run.settings.get(k)!r} in the file, {v!r} now"
              for k, v in settings.items() if run.settings.get(k) != v]
    if differ:
        hint = next((_SETTING_HINTS[k](run.settings[k]) for k in _SETTING_HINTS
                     if run.settings.get(k) != settings.get(k)), None)
        raise InputError(f"cannot resume from {path} with other settings ("
                         f"{'; '.join(differ)}); give fit the same ones"
                         + (f"; {hint}" if hint else ""))
    if run.epoch >= epochs:
        raise InputError(f"{path} holds {run.epoch} epochs already, fit asks for "
                         f"{epochs}: give epochs > {run.epoch} to train on")
    return run, step, dropout_steps


def load_weights(net, path):
    with checkpoint.read(path, max_bytes=_cap(net.backend)) as f:
        _check_same(net, f, path)
        _write_parameters(net, f, path)


def _check_same(net, f, path):
    mine = architecture(net)
    theirs = _architecture(f.architecture, path)
    if [theirs[k] for k in ("layers", "input_shape")] != [mine[k] for k in ("layers", "input_shape")]:
        raise ModelFileError(f"{path} holds a different architecture: {describe(theirs)} "
                             f"vs this network's {describe(mine)}; use "
                             f"portanet.load({str(path)!r}) to rebuild it")


def load(path, device=None, dtype="float32", precision=None, loss_scale="auto"):
    """A network rebuilt from a file written by Sequential.save, on any device, in any
    precision it computes (None: a Backend's own, else PORTANET_PRECISION, else fp32): the
    file holds float32 weights whatever the precision they were trained in, as PyTorch's
    state dicts do. loss_scale as Sequential's."""
    from .network import Sequential
    from .backends import device_for
    backend = device_for(device, dtype, precision)
    with checkpoint.read(path, max_bytes=_cap(backend)) as f:
        arch = _architecture(f.architecture, path)
        try:
            layers = [layer_module.from_config(name, cfg) for name, cfg in arch["layers"]]
            _check_declared(layers, arch["input_shape"], f, path, backend)
            net = Sequential(layers, arch["input_shape"], arch["loss"], backend, dtype,
                             loss_scale=loss_scale)
        except (InputError, ShapeError) as e:
            raise ModelFileError(f"{path}: the architecture in the file is not valid: {e}") from e
        _write_parameters(net, f, path)
    return net


def _check_declared(layers, input_shape, f, path, backend):
    """The sizes the file's architecture declares, bounded before the network is made
    (Sequential allocates every parameter and draws its initial values): the layers'
    shapes worked out (configure: nothing allocated), their parameters and one sample's
    activations within the device's memory, and each parameter and saved buffer one of the
    file's tensors, of its shape. So no layer is larger than the bytes the file holds, and
    a file that does not hold its network is refused before any of it is allocated."""
    from .network import _input_shape
    shape = _input_shape(input_shape)
    sample = elements(shape)
    for layer in layers:
        shape = layer.configure(backend, shape)
    walked = list(layer_module.walk(layers))
    declared = {f"{p}.{name}": tuple(int(n) for n in dims) for p, layer in walked
                for name, dims in {**layer.parameters(), **layer.buffers()}.items()}
    itemsize, cap = backend.dtype.itemsize, _cap(backend)
    weights = sum(elements(dims) for dims in declared.values()) * itemsize
    sample = (sample + sum(elements(layer.out_shape) for _, layer in walked)) * itemsize
    if weights + sample > cap:
        raise ModelFileError(
            f"{path}: its architecture declares {size_text(weights)} of parameters and "
            f"{size_text(sample)} for one sample's activations, more than the "
            f"{size_text(cap)} {backend.name} has; this file is not for this device")
    found = {name: tuple(e.shape) for name, e in f.entries.items()
             if not name.startswith(TRAINING)}
    missing = sorted(set(declared) - set(found))
    unexpected = sorted(set(found) - set(declared))
    wrong = [f"{n} is {found[n]} in the file, the layer's is {declared[n]}"
             for n in declared if n in found and found[n] != declared[n]]
    if missing or unexpected or wrong:
        raise ModelFileError(
            f"{path}: its tensors do not match the parameters of the layers it declares"
            + (f"; missing: {', '.join(missing[:5])}" if missing else "")
            + (f"; not in the network: {', '.join(unexpected[:5])}" if unexpected else "")
            + (f"; {'; '.join(wrong[:5])}" if wrong else "")
            + ": the file is damaged or was not written by net.save()")


def _parameters(net):
    """{"path.name": device array} of every parameter and saved buffer, the names in the
    file ("0.w", "3.1.gamma", "3.proj.b": see Sequential.walk)."""
    return {f"{path}.{name}": x for path, layer in net.walk()
            for name, x in layer.params().items()}


def _write_parameters(net, f, path, extra=None):
    """Every parameter (and the `extra` tensors, {name: device array}) from the open file
    f: names and shapes checked against the network first, then every tensor read and
    checked (network.checked_weights: real, finite in the network's dtype, BatchNorm
    variances >= 0) before any is written to the device. A checkpoint's optimizer state is
    skipped unless asked for in extra."""
    targets = {**_parameters(net), **(extra or {})}
    wanted = {name: x.shape for name, x in targets.items()}
    found = {name: tuple(shape) for name, (_, shape) in f.entries.items()
             if extra is not None or not name.startswith(TRAINING)}
    missing = sorted(set(wanted) - set(found))
    unexpected = sorted(set(found) - set(wanted))
    wrong = [f"{n} is {found[n]}, the network's is {wanted[n]}"
             for n in wanted if n in found and found[n] != wanted[n]]
    if missing or unexpected or wrong:
        raise ModelFileError(
            f"{path}: its tensors do not match the network's parameters"
            + (f"; missing: {', '.join(missing)}" if missing else "")
            + (f"; not in the network: {', '.join(unexpected[:5])}" if unexpected else "")
            + (f"; {'; '.join(wrong)}" if wrong else "")
            + ": the file is damaged or was not written by net.save()")
    from .network import checked_weights
    values = checked_weights(
        {name: f.tensor(name) for name in wanted}, net.backend.dtype,
        lambda problem: ModelFileError(f"{path}: {problem}; the file is damaged or was not "
                                       f"written by net.save()"))
    for name, x in targets.items():
        net.backend.write(x, values[name])


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
