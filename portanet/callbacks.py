"""Callbacks: code that `fit` runs at fixed points of training, as in Keras.

The protocol (what `Sequential.fit(..., callbacks=[...])` does with them):

    net.stop_training = False
    for cb in callbacks: cb.on_train_begin(net, {"epochs": epochs, "metrics": names})
    for epoch in range(epochs):                     # epoch counts from 0
        ... train one epoch, validate ...
        logs = {"loss": ..., "accuracy": ..., "lr": ..., "seconds": ...,
                "val_loss": ..., "val_accuracy": ...}   # this epoch's numbers, as history's
        for cb in callbacks: cb.on_epoch_end(net, epoch, logs)
        if net.stop_training: break
    for cb in callbacks: cb.on_train_end(net, logs_of_the_last_epoch)

`metrics` in on_train_begin's logs names the keys every epoch's logs will have, so that a
callback watching a name that will never be there (val_loss without validation data)
fails before the first epoch rather than after it; a callback given no `metrics` checks
at the first epoch's end instead. Every hook is a no-op by default: subclass `Callback`
and override the ones you need. A callback reaches the network only through
`net.get_weights()`, `net.set_weights(weights)`, `net.save(path)` and
`net.stop_training`, so anything with those can drive one (the tests use a fake).

There is no History callback: fit builds the history itself and returns it.
"""
import math
import numbers
import os
import re
import string

import numpy as np

from . import distributed
from .errors import InputError, ModelFileError

MODES = ("auto", "min", "max")


class Callback:
    """Base class: every hook does nothing."""

    def on_train_begin(self, net, logs):
        """Before the first epoch; logs: {"epochs": n, "metrics": [names]} (either may
        be missing)."""

    def on_epoch_end(self, net, epoch, logs):
        """After each epoch (counted from 0); logs: that epoch's {name: number}."""

    def on_train_end(self, net, logs):
        """After the last epoch run (also when a callback stopped training); logs: the
        last epoch's numbers."""


def checked(callbacks):
    """fit's `callbacks` argument as a list, or an InputError saying what is wrong."""
    if callbacks is None:
        return []
    if isinstance(callbacks, Callback):
        return [callbacks]
    if not isinstance(callbacks, (list, tuple)):
        raise InputError(f"callbacks must be a list of callback objects such as "
                         f"[pn.callbacks.EarlyStopping(patience=3)], got {callbacks!r}")
    for cb in callbacks:
        if not isinstance(cb, Callback):
            raise InputError(f"{cb!r} is not a callback: subclass "
                             f"portanet.callbacks.Callback (its hooks are on_train_begin, "
                             f"on_epoch_end and on_train_end)")
    return list(callbacks)


def keep_apart(callbacks, checkpoint):
    """Refuse, before training, a ModelCheckpoint among callbacks whose path names or can
    name fit's `checkpoint` file (None: fit keeps none): a ModelCheckpoint's save holds the
    network but no training state, and would replace the file a run resumes from. A path
    is the same file after resolving it (relative or absolute, through symbolic links in
    any part of it, a hard link); a path with fields is refused where some numbers in its
    fields spell the checkpoint's path, and the rest (a link named by a field's value) when
    the save is formatted (on_epoch_end), before anything is written."""
    for cb in callbacks:
        if isinstance(cb, ModelCheckpoint):
            cb._keep_apart(checkpoint)


class _Monitor(Callback):
    """What EarlyStopping and ModelCheckpoint share: a monitored name, its direction and
    the best value seen."""

    def __init__(self, monitor, mode):
        if not isinstance(monitor, str) or not monitor:
            raise InputError(f"{type(self).__name__}: monitor must be the name of a logged "
                             f"number such as 'val_loss' or 'accuracy', got {monitor!r}")
        if mode not in MODES:
            raise InputError(f"{type(self).__name__}: mode must be one of "
                             f"{', '.join(map(repr, MODES))}, got {mode!r}")
        self.monitor, self.mode = monitor, mode
        # auto: accuracies grow, everything else (losses) shrinks
        self.higher_is_better = mode == "max" or (mode == "auto" and "acc" in monitor)
        self.best = -math.inf if self.higher_is_better else math.inf

    def _improved(self, value, min_delta=0.0):
        """value beats best by more than min_delta; NaN never does."""
        if self.higher_is_better:
            return value - min_delta > self.best
        return value + min_delta < self.best

    def _check_names(self, names, when):
        if self.monitor not in names:
            raise self._missing(names, when)

    def _missing(self, names, when):
        have = ", ".join(map(repr, sorted(names))) or "none"
        if self.monitor.startswith("val_"):
            fix = ("validation numbers are logged only when fit validates: pass "
                   "validation_data=(x_val, y_val) or validation_split=0.1 to fit")
        else:
            fix = "monitor one of those"
        return InputError(f"{type(self).__name__} monitors {self.monitor!r}, but {when} "
                          f"only {have}; {fix}")

    def _value(self, logs):
        if self.monitor not in logs:
            raise self._missing(logs, "the epoch's logs hold")
        value = logs[self.monitor]
        if not isinstance(value, numbers.Real) or isinstance(value, bool):
            raise InputError(f"{type(self).__name__}: the logged {self.monitor!r} is "
                             f"{value!r}, not a number")
        return float(value)


class EarlyStopping(_Monitor):
    """Stop training when `monitor` has not improved for `patience` epochs.

    An epoch improves when its value beats the best so far by more than min_delta (lower
    is better for losses, higher for names containing "acc", in mode "auto"). After
    `patience` epochs in a row without improvement it sets net.stop_training, which fit
    reads after the epoch's callbacks, and records the epoch in `stopped_epoch` (counted
    from 0, as the epoch argument; 0 when training was not stopped). `best` is the best
    value seen, `best_epoch` its epoch.

    restore_best_weights: keep a host copy (net.get_weights()) of the weights at the end of
    the best epoch and set them back when training ends, whether this callback stopped it
    or the epochs ran out (Keras 3's behaviour): the network then holds the best epoch's
    weights, not the last epoch's.
    """

    def __init__(self, monitor="val_loss", patience=0, min_delta=0.0, mode="auto",
                 restore_best_weights=False):
        super().__init__(monitor, mode)
        whole = isinstance(patience, numbers.Integral) and not isinstance(patience, bool)
        if not whole or patience < 0:
            raise InputError(f"EarlyStopping: patience must be a whole number of epochs >= 0, "
                             f"got {patience!r}")
        real = isinstance(min_delta, numbers.Real) and not isinstance(min_delta, bool)
        if not real or not math.isfinite(min_delta) or min_delta < 0:
            raise InputError(f"EarlyStopping: min_delta must be a finite number >= 0 (the "
                             f"least change that counts as an improvement), got {min_delta!r}")
        if not isinstance(restore_best_weights, bool):
            raise InputError(f"EarlyStopping: restore_best_weights must be True or False, "
                             f"got {restore_best_weights!r}")
        self.patience, self.min_delta = int(patience), float(min_delta)
        self.restore_best_weights = restore_best_weights
        self._reset()

    def _reset(self):
        self.wait = 0
        self.stopped_epoch = 0
        self.best = -math.inf if self.higher_is_better else math.inf
        self.best_epoch = None
        self.best_weights = None

    def on_train_begin(self, net, logs):
        self._reset()                   # the same object may serve several fits
        if logs and logs.get("metrics") is not None:
            self._check_names(logs["metrics"], "fit will log")

    def on_epoch_end(self, net, epoch, logs):
        value = self._value(logs)
        self.wait += 1
        if self._improved(value, self.min_delta):
            self.best, self.best_epoch, self.wait = value, epoch, 0
            if self.restore_best_weights:
                self.best_weights = _host_copy(net.get_weights())
            return
        if self.restore_best_weights and self.best_weights is None:
            # no epoch has improved yet (a NaN): the first epoch's weights are the best
            self.best_weights, self.best_epoch = _host_copy(net.get_weights()), epoch
        if self.wait >= self.patience and epoch > 0:
            self.stopped_epoch = epoch
            net.stop_training = True

    def on_train_end(self, net, logs):
        if self.restore_best_weights and self.best_weights is not None:
            net.set_weights(self.best_weights)
        self.best_weights = None        # a host copy of every parameter: not kept longer

    def __repr__(self):
        return (f"EarlyStopping(monitor={self.monitor!r}, patience={self.patience}, "
                f"min_delta={self.min_delta}, mode={self.mode!r}, "
                f"restore_best_weights={self.restore_best_weights})")


class ModelCheckpoint(_Monitor):
    """Save the network after every epoch, or only when `monitor` improved
    (save_best_only).

    path may hold fields filled from the epoch's logs and its number from 1, as
    str.format does: "ckpt-{epoch:03d}-{val_loss:.4f}.safetensors". Its folder is checked
    when training begins, so a path that cannot be written fails before the first epoch,
    not after it. `best` is the best monitored value seen, `last_saved` the path of the
    latest save (None before one).
    """

    def __init__(self, path, monitor="val_loss", save_best_only=False, mode="auto"):
        super().__init__(monitor, mode)
        try:
            path = os.fspath(path)
        except TypeError:
            raise InputError(f"ModelCheckpoint: path must be a file name such as "
                             f"'model-{{epoch:02d}}.safetensors', got {path!r}") from None
        if not isinstance(path, str) or not path:
            raise InputError(f"ModelCheckpoint: path must be a non-empty file name, "
                             f"got {path!r}")
        self.fields = _fields(path)
        if not isinstance(save_best_only, bool):
            raise InputError(f"ModelCheckpoint: save_best_only must be True or False, "
                             f"got {save_best_only!r}")
        self.path, self.save_best_only = path, save_best_only
        self.last_saved = None
        self._apart = None              # fit's checkpoint file, never to be written here

    def on_train_begin(self, net, logs):
        self.best = -math.inf if self.higher_is_better else math.inf
        names = logs.get("metrics") if logs else None
        if names is not None:
            if self.save_best_only:
                self._check_names(names, "fit will log")
            self._check_fields(names, "fit will log")
        if names is not None or set(self.fields) <= {"epoch"}:
            _check_folder(self._format(0, {n: 0.0 for n in names or ()}))

    def on_epoch_end(self, net, epoch, logs):
        value = self._value(logs) if self.save_best_only else None
        if self.save_best_only and not self._improved(value):
            return
        self._check_fields(logs, "the epoch's logs hold")
        path = self._format(epoch, logs)
        if self._apart is not None and _same_file(path, self._apart):
            raise self._clash(self._apart, f"formatted as {path!r}, names")
        if distributed.leader():        # in a distributed job, rank 0 writes the file
            net.save(path)
        self.last_saved = path
        if self.save_best_only:         # after the save: a failed one leaves best as it was
            self.best = value

    def _keep_apart(self, checkpoint):
        """Refuse this ModelCheckpoint where it names or can name the file `checkpoint`
        (see keep_apart); remember the file for the saves' own check."""
        self._apart = None
        if checkpoint is None:
            return
        checkpoint = os.fspath(checkpoint)
        if not self.fields:
            if _same_file(self.path.format(), checkpoint):
                raise self._clash(checkpoint, "names")
        else:
            names = {checkpoint, os.path.abspath(checkpoint), os.path.realpath(checkpoint)}
            if any(re.fullmatch(pattern, name) for pattern in _patterns(self.path)
                   for name in names):
                raise self._clash(checkpoint, "can name")
        self._apart = checkpoint

    def _clash(self, checkpoint, how):
        return InputError(f"ModelCheckpoint({self.path!r}) {how} the same file as fit's "
                          f"checkpoint={str(checkpoint)!r}: its saves hold the network but no "
                          f"training state, and would replace the checkpoint a run resumes "
                          f"from; give two paths, e.g. checkpoint='run.safetensors' and "
                          f"ModelCheckpoint('model-{{epoch:02d}}.safetensors')")

    def _check_fields(self, names, when):
        missing = [f for f in self.fields if f != "epoch" and f not in names]
        if missing:
            have = ", ".join(map(repr, sorted(names))) or "none"
            raise InputError(f"ModelCheckpoint: the path {self.path!r} uses "
                             f"{', '.join(map(repr, missing))}, but {when} only {have} "
                             f"(and 'epoch'); use those names in the path")

    def _format(self, epoch, logs):
        try:
            return self.path.format(**{**logs, "epoch": epoch + 1})
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as e:
            raise InputError(f"ModelCheckpoint: cannot fill in the path {self.path!r}: {e}; "
                             f"write fields as {{epoch:02d}} or {{val_loss:.4f}}") from e

    def __repr__(self):
        return (f"ModelCheckpoint({self.path!r}, monitor={self.monitor!r}, "
                f"save_best_only={self.save_best_only}, mode={self.mode!r})")


def _same_file(a, b):
    """a and b are one file: the same path once relative parts and symbolic links are
    resolved, or (both existing) the same inode, as a hard link is."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:             # one of them does not exist (yet)
        return False


# What a number formatted by str.format may be spelled with: digits, sign, padding,
# decimal point, exponent, grouping, percent, inf and nan ({epoch:03d}, {val_loss:.4f}).
_NUMBER = r"[-+ 0-9.,_%eEinfaINFA]*"


def _patterns(path):
    """Regular expressions of the paths a ModelCheckpoint path with fields formats to,
    each field a number: as written, made absolute, and with its folder's links resolved
    (where the folder has no fields)."""
    def pattern(text):
        return "".join(re.escape(literal) + (_NUMBER if field is not None else "")
                       for literal, field, _, _ in string.Formatter().parse(text))
    out = [pattern(path)]
    if not os.path.isabs(path):
        out.append(re.escape(os.getcwd() + os.sep) + pattern(path))
    folder, name = os.path.split(path)
    if not _fields(folder):
        out.append(re.escape(os.path.join(os.path.realpath(folder.format() or "."), ""))
                   + pattern(name))
    return out


def _host_copy(weights):
    """{name: array} copied, so that later training cannot change it (on the NumPy
    backend get_weights may hand out the very arrays it trains)."""
    return {name: np.array(value, copy=True) for name, value in weights.items()}


def _fields(path):
    """The names of the fields of a str.format path; an InputError when it is not one."""
    try:
        parsed = list(string.Formatter().parse(path))
    except ValueError as e:
        raise InputError(f"ModelCheckpoint: the path {path!r} is not a valid format string "
                         f"({e}); double a brace that is part of the name: '{{{{'") from e
    names = []
    for _, field, _, _ in parsed:
        if field is None:
            continue
        if not field.isidentifier():
            raise InputError(f"ModelCheckpoint: the path {path!r} has the field {{{field}}}; "
                             f"fields are names of logged numbers or 'epoch', e.g. "
                             f"{{epoch:02d}} or {{val_loss:.4f}}")
        names.append(field)
    return names


def _check_folder(path):
    """The checkpoint's destination can be written: checkpoint.check_destination where
    portanet has it (it probes the folder with a file), else the folder exists."""
    try:
        from .checkpoint import check_destination
    except ImportError:
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise ModelFileError(f"cannot save checkpoints to {path}: the folder {folder} "
                                 f"does not exist; create it first (os.makedirs)") from None
        return
    check_destination(path)
