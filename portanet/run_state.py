"""The training state of a checkpoint: what fit needs to go on from where it stopped.

`Run` is that state (epochs done, the history, fit's random generator, the settings that
must be the same to resume); `training_metadata` writes it, with the optimizer's step count
and Dropout's steps, as the JSON of a checkpoint's "training" entry, and `read_training`
reads it back checked entry by entry. saving.py stores and reads the entry beside the
network's tensors; training.py makes the Run and resumes from it. This module holds the
schema both share and imports neither.
"""
import dataclasses
import json
import math

import numpy as np

from .errors import ModelFileError
from .files import parse_json
from .layers import masking


@dataclasses.dataclass
class Run:
    """What fit needs to go on from where it stopped: saved in checkpoints
    (training_metadata), read back checked (read_training)."""
    epoch: int                  # epochs done
    history: dict
    rng: dict                   # the shuffling generator's bit_generator.state
    settings: dict              # what must be the same to resume (batch size, optimizer...)


def optimizer_config(optimizer):
    """The optimizer as fit's settings record it: {"name", "config"}, its fields as JSON
    holds them (tuples as lists); clip_norm only where it is set, as files written before
    it existed say."""
    return {"name": optimizer.name,
            "config": {k: list(v) if isinstance(v, tuple) else v
                       for k, v in dataclasses.asdict(optimizer).items()
                       if not (k == "clip_norm" and v is None)}}


def training_metadata(net, run):
    """The JSON of a checkpoint's training state (beside the optimizer's tensors), which
    read_training checks entry by entry."""
    state = net.optimizer_state
    return json.dumps({"epoch": run.epoch, "history": run.history, "rng": run.rng,
                       "settings": run.settings, "step": state.t,
                       "optimizer": optimizer_config(state.optimizer),
                       "dropout_steps": {path: layer.step
                                         for path, layer in masking(net.layers)}},
                      allow_nan=False)


# The entries of a checkpoint's training state (training_metadata), and of its settings:
# those every checkpoint holds, and those recorded since (an older file holds none of them:
# saving.resume fills them in, read_training those it can tell from the file itself).
TRAINING_ENTRIES = ("epoch", "history", "rng", "settings", "step", "optimizer",
                    "dropout_steps")
SETTINGS = ("batch_size", "optimizer", "schedule", "seed", "shuffle", "samples")
SCHEDULE_UNITS = ("epoch", "step")     # what a schedule counts (fit's schedule_unit)
LATER_SETTINGS = ("precision", "loss_scale", "loss", "validation", "ranks", "schedule_unit")


def history_names(scaled, validated):
    """The numbers fit logs each epoch (its history's keys): the loss scale's with loss
    scaling, the validation's with validation data."""
    return (["loss", "accuracy", "lr", "seconds"]
            + (["loss_scale", "skipped_steps"] if scaled else [])
            + (["val_loss", "val_accuracy"] if validated else []))


def _whole(value, low=0):
    """value is an int >= low (not a bool, not a float, however whole)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _number(value):
    """value is a finite int or float (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value)


def _optimizer_entry(value):
    return isinstance(value, dict) and set(value) == {"name", "config"} \
        and isinstance(value["name"], str) and isinstance(value["config"], dict)


# What each setting must be; saving.resume then compares them with the run resuming.
_SETTING_KINDS = {
    "batch_size": (lambda v: _whole(v, 1), "a whole number >= 1"),
    "samples": (lambda v: _whole(v, 1), "a whole number >= 1"),
    "seed": (_whole, "a whole number >= 0"),
    "ranks": (lambda v: _whole(v, 1), "a whole number >= 1"),
    "shuffle": (lambda v: isinstance(v, bool), "true or false"),
    "validation": (lambda v: isinstance(v, bool), "true or false"),
    "schedule": (lambda v: isinstance(v, str), "a schedule's text"),
    "schedule_unit": (lambda v: v in SCHEDULE_UNITS, "epoch or step"),
    "precision": (lambda v: isinstance(v, str), "a precision's name"),
    "loss": (lambda v: isinstance(v, str), "a loss's name"),
    "optimizer": (_optimizer_entry, '{"name": ..., "config": {...}}'),
    "loss_scale": (lambda v: v is None or isinstance(v, dict), "null or a mapping"),
}

# fit's shuffling generator, whose bit_generator.state a checkpoint holds
_GENERATOR = type(np.random.default_rng(0).bit_generator)


def _rng_state(rng):
    """What is wrong with a saved state of fit's generator (PCG64: a 128-bit state and
    increment, a buffered 32-bit half), or None."""
    if not isinstance(rng, dict) or set(rng) != {"bit_generator", "state", "has_uint32",
                                                 "uinteger"}:
        return "is not a generator's state (bit_generator, state, has_uint32, uinteger)"
    if rng["bit_generator"] != _GENERATOR.__name__:
        return f"is of the generator {rng['bit_generator']!r}, not {_GENERATOR.__name__}"
    inner = rng["state"]
    if not isinstance(inner, dict) or set(inner) != {"state", "inc"} or not all(
            _whole(inner[k]) and inner[k] < 1 << 128 for k in inner):
        return "holds no 128-bit state and increment"
    if not (rng["has_uint32"] in (0, 1) and _whole(rng["has_uint32"])
            and _whole(rng["uinteger"]) and rng["uinteger"] < 1 << 32):
        return "holds no 32-bit buffer (has_uint32 0 or 1, uinteger below 2**32)"
    try:
        _GENERATOR().state = rng
    except (ValueError, TypeError, KeyError, OverflowError) as e:
        return f"is refused by NumPy's {_GENERATOR.__name__} ({e})"
    return None


def read_training(text, path, net):
    """(Run, the optimizer's step count, {Dropout path: its step}) from a checkpoint's
    training state (training_metadata's JSON), refused with a ModelFileError naming the
    entry unless every entry is what fit writes: epoch and step whole numbers >= 0; history
    {name: list of `epoch` finite numbers} of exactly the names that run logged; rng a
    state of fit's generator; settings a mapping of the known settings, each of its kind;
    dropout_steps {path: whole number >= 0} of exactly net's layers that draw dropout
    masks (layers.masking); optimizer the
    settings' optimizer at some finite learning rate. Nothing is changed: resume uses the
    values only once all are checked (and the settings compared with the run's)."""
    def bad(what):
        return ModelFileError(f"{path}: its training state {what}; the file is damaged or "
                              f"was not written by fit(checkpoint=...)")

    saved = parse_json(text, f"{path}: its training state", error=ModelFileError)
    if not isinstance(saved, dict):
        raise bad(f"is a {type(saved).__name__}, not a mapping")
    missing = [k for k in TRAINING_ENTRIES if k not in saved]
    unknown = sorted(set(saved) - set(TRAINING_ENTRIES))
    if missing or unknown:
        raise bad("lacks " + ", ".join(missing) if missing else
                  f"has entries portanet does not write ({', '.join(unknown)}: a newer "
                  f"portanet's file?)")
    epoch, step = saved["epoch"], saved["step"]
    if not _whole(epoch):
        raise bad(f"has epoch {epoch!r}: epochs done are a whole number >= 0")
    if not _whole(step):
        raise bad(f"has step {step!r}: the optimizer's steps are a whole number >= 0")

    settings = saved["settings"]
    if not isinstance(settings, dict):
        raise bad(f"has settings {settings!r}, not a mapping")
    missing = [k for k in SETTINGS if k not in settings]
    unknown = sorted(set(settings) - set(SETTINGS) - set(LATER_SETTINGS))
    if missing or unknown:
        raise bad(f"has settings without {', '.join(missing)}" if missing else
                  f"has settings portanet does not know ({', '.join(unknown)})")
    for key, value in settings.items():
        ok, kind = _SETTING_KINDS[key]
        if not ok(value):
            raise bad(f"has the setting {key} {value!r}, not {kind}")
    settings = dict(settings)
    settings.setdefault("loss_scale", None)
    settings.setdefault("schedule_unit", "epoch")      # schedules moved once an epoch before

    history = saved["history"]
    if not isinstance(history, dict):
        raise bad(f"has history {history!r}, not a mapping of lists")
    # a file from before validation was a setting tells it by its history
    settings.setdefault("validation", "val_loss" in history)
    names = history_names(settings["loss_scale"] is not None, settings["validation"])
    if sorted(history) != sorted(names):
        raise bad(f"has a history of {', '.join(map(str, history)) or 'nothing'}, where its "
                  f"run logged {', '.join(names)}")
    for name, values in history.items():
        if not (isinstance(values, list) and len(values) == epoch
                and all(map(_number, values))):
            raise bad(f"has history {name!r} {str(values)[:80]}: a list of {epoch} finite "
                      f"numbers (one an epoch) was written")

    problem = _rng_state(saved["rng"])
    if problem:
        raise bad(f"has an rng that {problem}")

    dropout_steps = saved["dropout_steps"]
    mine = [p for p, _ in masking(net.layers)]
    if not isinstance(dropout_steps, dict) or sorted(dropout_steps) != sorted(mine):
        raise bad(f"has dropout_steps {str(dropout_steps)[:80]}, where this network's "
                  f"layers that draw dropout masks are {', '.join(mine) or 'none'}")
    for name, value in dropout_steps.items():
        if not _whole(value):
            raise bad(f"has the dropout step {value!r} of layer {name}: steps are whole "
                      f"numbers >= 0")

    optimizer, same = saved["optimizer"], settings["optimizer"]
    if not (_optimizer_entry(optimizer) and optimizer["name"] == same["name"]
            and set(optimizer["config"]) == set(same["config"])
            and all(v == same["config"][k] for k, v in optimizer["config"].items()
                    if k != "lr")
            and _number(optimizer["config"]["lr"]) and optimizer["config"]["lr"] >= 0):
        raise bad(f"has the optimizer {str(optimizer)[:120]}, not its settings' "
                  f"{same['name']} {same['config']} at a finite learning rate")

    run = Run(epoch, {k: list(values) for k, values in history.items()},
              saved["rng"], settings)
    return run, step, dict(dropout_steps)
