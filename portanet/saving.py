"""Networks to files and back: the architecture and the parameters of a Sequential.

The file layer (safetensors, atomic writes, the bounded reader of old .npz files) is
portanet/checkpoint.py; this module maps a network onto it: save (with a checkpoint's
training state, run_state.py), load_weights and resume into a network that exists, each
file checked against the network's architecture and parameters before anything is
written. It also holds the one rule for weights that come into a network by any way
(checked_weights). Making a network from a file (portanet.load) is loading.py's, above
network.py, which this module does not import.
"""
import numpy as np

from . import checkpoint, run_state
from .errors import InputError, ModelFileError


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
    with checkpoint.read(path, max_bytes=max_bytes(net.backend)) as f:
        run, step, dropout_steps = _resumable(net, f, path, settings, epochs)
        state = net.optimizer_state.tensors()
        write_parameters(net, f, path, extra=state)
        net.optimizer_state.t = step
        for name, layer in net.walk():
            if name in dropout_steps:
                layer.step = dropout_steps[name]
    return run


def check_resume(net, path, settings, epochs):
    """What resume checks, without writing anything: fit calls it before it prepares
    anything for the run, so that a checkpoint it cannot resume leaves the network as it
    was."""
    with checkpoint.read(path, max_bytes=max_bytes(net.backend)) as f:
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
    with checkpoint.read(path, max_bytes=max_bytes(net.backend)) as f:
        _check_same(net, f, path)
        write_parameters(net, f, path)


def _check_same(net, f, path):
    mine = architecture(net)
    theirs = file_architecture(f.architecture, path)
    if [theirs[k] for k in ("layers", "input_shape")] != [mine[k] for k in ("layers", "input_shape")]:
        raise ModelFileError(f"{path} holds a different architecture: {describe(theirs)} "
                             f"vs this network's {describe(mine)}; use "
                             f"portanet.load({str(path)!r}) to rebuild it")


def _parameters(net):
    """{"path.name": device array} of every parameter and saved buffer, the names in the
    file ("0.w", "3.1.gamma", "3.proj.b": see Sequential.walk)."""
    return {f"{path}.{name}": x for path, layer in net.walk()
            for name, x in layer.params().items()}


def check_tensors(path, found, wanted, what, whose):
    """Refuse, naming each difference, a file whose tensors ({name: shape}) are not
    exactly the `wanted` ones in their shapes: what (e.g. "the network's parameters") the
    file was read for, whose (e.g. "the network's") each wanted shape is."""
    missing = sorted(set(wanted) - set(found))
    unexpected = sorted(set(found) - set(wanted))
    wrong = [f"{n} is {found[n]} in the file, {whose} is {wanted[n]}"
             for n in wanted if n in found and found[n] != wanted[n]]
    if missing or unexpected or wrong:
        raise ModelFileError(
            f"{path}: its tensors do not match {what}"
            + (f"; missing: {', '.join(missing[:5])}" if missing else "")
            + (f"; not in the network: {', '.join(unexpected[:5])}" if unexpected else "")
            + (f"; {'; '.join(wrong[:5])}" if wrong else "")
            + ": the file is damaged or was not written by net.save()")


def write_parameters(net, f, path, extra=None):
    """Every parameter (and the `extra` tensors, {name: device array}) from the open file
    f: names and shapes checked against the network first, then every tensor read and
    checked (checked_weights: real, finite in the network's dtype, BatchNorm
    variances >= 0) before any is written to the device. A checkpoint's optimizer state is
    skipped unless asked for in extra."""
    targets = {**_parameters(net), **(extra or {})}
    wanted = {name: x.shape for name, x in targets.items()}
    found = {name: tuple(shape) for name, (_, shape) in f.entries.items()
             if extra is not None or not name.startswith(TRAINING)}
    check_tensors(path, found, wanted, "the network's parameters", "the network's")
    values = checked_weights(
        {name: f.tensor(name) for name in wanted}, net.backend.dtype,
        lambda problem: ModelFileError(f"{path}: {problem}; the file is damaged or was not "
                                       f"written by net.save()"))
    for name, x in targets.items():
        net.backend.write(x, values[name])


def checked_weights(values, dtype, error):
    """{name: array} as `dtype`, checked whole by the one rule for weights that come into a
    network, whatever their way (set_weights, and so from_onnx and load_torch_state; files
    through write_parameters: load, load_weights, resume): every value a real
    number, finite in `dtype`, and every BatchNorm running variance (a name ending in
    "running_var") >= 0. The first tensor that breaks it is named, with the mend, in
    error(message), raised before anything is written."""
    out = {}
    for name, x in values.items():
        if not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)
                or x.dtype == np.bool_):
            raise error(f"{name} has dtype {x.dtype}: weights are real numbers")
        with np.errstate(over="ignore", invalid="ignore"):
            cast = x.astype(dtype)
        bad = ~np.isfinite(cast)
        if bad.any():
            at = tuple(int(i) for i in np.argwhere(bad)[0])
            was = x[at]
            if np.isfinite(was):            # 1e39 in float32
                raise error(f"{name} holds {float(was):g} at index {at}, beyond {dtype}'s "
                            f"range (it becomes inf): scale the weights, or build the "
                            f"network with dtype='float64'")
            raise error(f"{name} holds {'NaN' if np.isnan(was) else 'inf'} (first at index "
                        f"{at}): a network's weights are finite numbers; take them from "
                        f"before the training that made them diverge")
        if name.endswith("running_var") and (cast < 0).any():
            at = tuple(int(i) for i in np.argwhere(cast < 0)[0])
            raise error(f"{name} holds the negative value {float(cast[at]):g} at index {at}: "
                        f"a BatchNorm running variance is a variance, >= 0; give the "
                        f"variance itself (PyTorch's running_var)")
        out[name] = cast
    return out


def file_architecture(arch, path):
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


def max_bytes(backend):
    """No file may bring more tensor bytes than the device has memory in all."""
    return backend.memory_info()[1]


def describe(arch):
    layers = " -> ".join(f"{n}({', '.join(f'{v}' for v in c.values())})"
                         for n, c in arch["layers"])
    return f"input {tuple(arch['input_shape'])} -> {layers}"
