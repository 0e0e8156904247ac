"""Callbacks (portanet/callbacks.py) driven through their hooks by a fake network that has
only what a callback may use (get_weights, set_weights, save, stop_training), in the
order fit calls them; and once through the real Sequential.fit."""
import inspect
import math

import numpy as np
import pytest

import portanet as pn
from portanet.callbacks import Callback, EarlyStopping, ModelCheckpoint, checked
from portanet.errors import InputError, ModelFileError, PortanetError


class FakeNet:
    """Weights that training changes in place (as the NumPy backend's arrays are), so a
    callback that keeps them without copying them sees them change."""

    def __init__(self):
        self.weights = {"0.w": np.zeros((2, 3)), "0.b": np.zeros(2)}
        self.stop_training = False
        self.saved, self.restored = [], []
        self.fail_save = False

    def train_epoch(self, epoch):
        for w in self.weights.values():
            w[...] = epoch + 1                  # the weights say which epoch made them

    def get_weights(self):
        return self.weights                     # no copy, on purpose

    def set_weights(self, weights):
        assert set(weights) == set(self.weights)
        self.restored.append({k: np.array(v) for k, v in weights.items()})
        for k, v in weights.items():
            self.weights[k][...] = v

    def save(self, path):
        if self.fail_save:
            raise ModelFileError(f"could not save {path}: disk full")
        with open(path, "w") as f:
            f.write(str(self.weights["0.b"][0]))
        self.saved.append(path)

    @property
    def epoch_made(self):
        return int(self.weights["0.w"][0, 0])


def fit(net, callbacks, values, monitor="val_loss", metrics=True):
    """fit's protocol (callbacks.py's docstring): values[e] is the monitored number of
    epoch e; other logged numbers are fixed. Returns the list of each epoch's logs."""
    names = ["loss", "accuracy", "lr", "seconds", monitor]
    net.stop_training = False
    for cb in callbacks:
        cb.on_train_begin(net, {"epochs": len(values), "metrics": names} if metrics else {})
    seen = []
    for epoch, value in enumerate(values):
        net.train_epoch(epoch)
        logs = {"loss": 0.5, "accuracy": 0.75, "lr": 0.01, "seconds": 1.0, monitor: value}
        seen.append(logs)
        for cb in callbacks:
            cb.on_epoch_end(net, epoch, logs)
        if net.stop_training:
            break
    for cb in callbacks:
        cb.on_train_end(net, seen[-1])
    return seen


# -- EarlyStopping -------------------------------------------------------------------------

def test_stops_after_patience_epochs_without_improvement():
    net, es = FakeNet(), EarlyStopping(patience=2)
    seen = fit(net, [es], [1.0, 0.8, 0.9, 0.85, 0.7, 0.6])
    assert len(seen) == 4                       # epochs 2 and 3 did not beat 0.8
    assert es.stopped_epoch == 3 and net.stop_training
    assert es.best == 0.8 and es.best_epoch == 1
    assert net.restored == [] and net.epoch_made == 4     # no restore asked for


def test_patience_zero_stops_at_the_first_epoch_that_does_not_improve():
    net, es = FakeNet(), EarlyStopping(monitor="loss", patience=0)
    seen = fit(net, [es], [3.0, 2.0, 2.5, 1.0], monitor="loss")
    assert len(seen) == 3 and es.stopped_epoch == 2


def test_improving_every_epoch_never_stops():
    net, es = FakeNet(), EarlyStopping(patience=0)
    seen = fit(net, [es], [5.0, 4.0, 3.0, 2.0])
    assert len(seen) == 4 and es.stopped_epoch == 0 and not net.stop_training
    assert es.best == 2.0 and es.best_epoch == 3


def test_min_delta_is_the_least_change_that_counts():
    net, es = FakeNet(), EarlyStopping(patience=1, min_delta=0.1)
    seen = fit(net, [es], [1.0, 0.95, 0.5])     # 0.95 is better, but not by 0.1
    assert len(seen) == 2 and es.best == 1.0
    net, es = FakeNet(), EarlyStopping(patience=1, min_delta=0.1)
    assert len(fit(net, [es], [1.0, 0.85, 0.7])) == 3


@pytest.mark.parametrize("monitor, mode, values, run, best", [
    ("val_accuracy", "auto", [0.5, 0.6, 0.55, 0.58, 0.9], 4, 0.6),   # "acc": higher is better
    ("accuracy", "auto", [0.5, 0.4, 0.3], 3, 0.5),
    ("val_loss", "auto", [0.5, 0.6, 0.7], 3, 0.5),
    ("val_loss", "max", [0.5, 0.6, 0.55, 0.5], 4, 0.6),
    ("val_accuracy", "min", [0.5, 0.4, 0.45, 0.42], 4, 0.4),
    ("lr", "auto", [0.1, 0.2, 0.3], 3, 0.1),                          # not "acc": lower
])
def test_mode_sets_the_direction(monitor, mode, values, run, best):
    net, es = FakeNet(), EarlyStopping(monitor=monitor, patience=2, mode=mode)
    assert len(fit(net, [es], values, monitor=monitor)) == run
    assert es.best == best


def test_restore_best_weights_at_the_stop():
    net, es = FakeNet(), EarlyStopping(patience=2, restore_best_weights=True)
    fit(net, [es], [1.0, 0.8, 0.9, 0.85, 0.7])
    assert es.stopped_epoch == 3
    # the weights at the end of epoch 1, though the net trained on (in place) to epoch 3
    assert len(net.restored) == 1 and net.epoch_made == 2
    assert np.all(net.weights["0.b"] == 2) and np.all(net.weights["0.w"] == 2)


def test_restore_best_weights_when_the_epochs_run_out():
    net, es = FakeNet(), EarlyStopping(patience=5, restore_best_weights=True)
    fit(net, [es], [1.0, 0.7, 0.9, 0.8])
    assert es.stopped_epoch == 0 and not net.stop_training
    assert net.epoch_made == 2 and es.best_epoch == 1


def test_nan_never_improves_and_never_stops_at_the_first_epoch():
    net, es = FakeNet(), EarlyStopping(patience=0, restore_best_weights=True)
    seen = fit(net, [es], [math.nan, 1.0, math.nan])
    assert len(seen) == 3 and es.stopped_epoch == 2 and es.best == 1.0
    assert net.epoch_made == 2


def test_a_second_fit_starts_afresh():
    es = EarlyStopping(patience=1)
    fit(FakeNet(), [es], [1.0, 2.0, 3.0])
    assert es.stopped_epoch == 1
    net = FakeNet()
    seen = fit(net, [es], [9.0, 8.0, 7.0])      # 9 is worse than the first fit's best
    assert len(seen) == 3 and es.stopped_epoch == 0 and es.best == 7.0


def test_missing_validation_names_the_fix_before_training():
    net, es = FakeNet(), EarlyStopping(monitor="val_loss")
    with pytest.raises(InputError) as e:
        es.on_train_begin(net, {"epochs": 3, "metrics": ["loss", "accuracy", "lr", "seconds"]})
    text = str(e.value)
    assert "'val_loss'" in text and "'loss'" in text and "'accuracy'" in text
    assert "validation_data" in text and "validation_split" in text
    assert isinstance(e.value, PortanetError)


def test_missing_name_at_the_epoch_end_without_metrics():
    net, es = FakeNet(), EarlyStopping(monitor="val_accuracy")
    es.on_train_begin(net, {})
    with pytest.raises(InputError, match="validation_split"):
        es.on_epoch_end(net, 0, {"loss": 1.0, "accuracy": 0.5})
    es = EarlyStopping(monitor="los")
    with pytest.raises(InputError, match=r"'los'.*'accuracy', 'loss'.*one of those"):
        es.on_epoch_end(net, 0, {"loss": 1.0, "accuracy": 0.5})


def test_a_monitored_value_that_is_not_a_number():
    with pytest.raises(InputError, match="not a number"):
        EarlyStopping(monitor="loss").on_epoch_end(FakeNet(), 0, {"loss": "low"})


@pytest.mark.parametrize("kwargs", [
    {"patience": -1}, {"patience": 1.5}, {"patience": True}, {"patience": "2"},
    {"min_delta": -0.1}, {"min_delta": math.nan}, {"min_delta": math.inf},
    {"min_delta": None}, {"mode": "bigger"}, {"mode": None}, {"monitor": ""},
    {"monitor": None}, {"restore_best_weights": 1},
])
def test_early_stopping_arguments_are_checked(kwargs):
    with pytest.raises(InputError, match="EarlyStopping"):
        EarlyStopping(**kwargs)


# -- ModelCheckpoint -----------------------------------------------------------------------

def test_checkpoint_every_epoch_with_fields(tmp_path):
    net = FakeNet()
    cb = ModelCheckpoint(str(tmp_path / "m-{epoch:02d}-{val_loss:.2f}.bin"))
    fit(net, [cb], [1.0, 0.5, 0.75])
    names = [p.rpartition("/")[2] for p in net.saved]
    assert names == ["m-01-1.00.bin", "m-02-0.50.bin", "m-03-0.75.bin"]
    assert cb.last_saved == net.saved[-1]
    assert (tmp_path / "m-03-0.75.bin").read_text() == "3.0"


def test_checkpoint_best_only(tmp_path):
    net = FakeNet()
    cb = ModelCheckpoint(tmp_path / "best.bin", monitor="val_accuracy", save_best_only=True)
    fit(net, [cb], [0.5, 0.7, 0.6, 0.8, 0.8], monitor="val_accuracy")
    assert len(net.saved) == 3                  # epochs 1, 2 and 4
    assert cb.best == 0.8
    assert (tmp_path / "best.bin").read_text() == "4.0"


def test_checkpoint_with_early_stopping(tmp_path):
    net = FakeNet()
    es = EarlyStopping(patience=1, restore_best_weights=True)
    cb = ModelCheckpoint(tmp_path / "e{epoch}.bin", save_best_only=True)
    fit(net, [cb, es], [2.0, 1.0, 1.5, 0.5])
    assert [p.rpartition("/")[2] for p in net.saved] == ["e1.bin", "e2.bin"]
    assert es.stopped_epoch == 2 and net.epoch_made == 2


def test_a_failed_save_leaves_best_as_it_was(tmp_path):
    net, cb = FakeNet(), ModelCheckpoint(tmp_path / "m.bin", save_best_only=True)
    cb.on_train_begin(net, {})
    cb.on_epoch_end(net, 0, {"val_loss": 1.0})
    net.fail_save = True
    with pytest.raises(ModelFileError):
        cb.on_epoch_end(net, 1, {"val_loss": 0.5})
    assert cb.best == 1.0
    net.fail_save = False
    cb.on_epoch_end(net, 2, {"val_loss": 0.7})  # still better than 1.0: saved
    assert cb.best == 0.7 and len(net.saved) == 2


def test_checkpoint_needs_its_monitor_only_for_best_only(tmp_path):
    net = FakeNet()
    fit(net, [ModelCheckpoint(tmp_path / "m.bin")], [1.0], monitor="loss")
    assert len(net.saved) == 1                  # no val_loss, and none needed
    with pytest.raises(InputError, match="validation_data"):
        fit(FakeNet(), [ModelCheckpoint(tmp_path / "m.bin", save_best_only=True)], [1.0],
            monitor="loss")


def test_checkpoint_path_fields_are_checked_before_training(tmp_path):
    net, cb = FakeNet(), ModelCheckpoint(tmp_path / "m-{val_acc:.2f}.bin")
    with pytest.raises(InputError, match=r"'val_acc'.*'val_loss'"):
        fit(net, [cb], [1.0])
    assert net.epoch_made == 0                  # before the first epoch
    with pytest.raises(InputError, match="'val_acc'"):   # no metrics: at the first epoch
        fit(FakeNet(), [cb], [1.0], metrics=False)


def test_checkpoint_folder_is_checked_before_training(tmp_path):
    net = FakeNet()
    cb = ModelCheckpoint(tmp_path / "no-such-folder" / "m-{epoch}.bin")
    with pytest.raises(ModelFileError, match="no-such-folder"):
        fit(net, [cb], [1.0, 0.5])
    assert net.epoch_made == 0 and net.saved == []


@pytest.mark.parametrize("kwargs, match", [
    ({"path": "m-{epoch.bin"}, "format string"),
    ({"path": "m-{}.bin"}, "fields are names"),
    ({"path": "m-{0}.bin"}, "fields are names"),
    ({"path": "m-{logs[loss]}.bin"}, "fields are names"),
    ({"path": None}, "file name"),
    ({"path": 3}, "file name"),
    ({"path": ""}, "non-empty"),
    ({"path": "m.bin", "mode": "up"}, "mode"),
    ({"path": "m.bin", "save_best_only": "yes"}, "save_best_only"),
    ({"path": "m.bin", "monitor": 0}, "monitor"),
])
def test_checkpoint_arguments_are_checked(kwargs, match):
    with pytest.raises(InputError, match=match):
        ModelCheckpoint(**kwargs)


def test_checkpoint_bad_format_spec(tmp_path):
    cb = ModelCheckpoint(tmp_path / "m-{epoch:.2q}.bin")
    with pytest.raises(InputError, match="cannot fill in"):
        fit(FakeNet(), [cb], [1.0])


# -- the protocol --------------------------------------------------------------------------

def test_base_callback_hooks_do_nothing():
    net, cb = FakeNet(), Callback()
    seen = fit(net, [cb], [1.0, 2.0])
    assert len(seen) == 2 and net.saved == [] and net.restored == []


def test_checked():
    es = EarlyStopping()
    assert checked(None) == [] and checked([]) == [] and checked(es) == [es]
    assert checked((es,)) == [es]
    with pytest.raises(InputError, match="not a callback"):
        checked([es, lambda epoch, logs: None])
    with pytest.raises(InputError, match="list of callback"):
        checked("early")


# -- through the real fit ------------------------------------------------------------------

def _fit_takes_callbacks():
    return "callbacks" in inspect.signature(pn.Sequential.fit).parameters


class Recorder(Callback):
    def __init__(self):
        self.calls = []

    def on_train_begin(self, net, logs):
        self.calls.append(("begin", dict(logs or {})))

    def on_epoch_end(self, net, epoch, logs):
        self.calls.append(("epoch", epoch, dict(logs)))

    def on_train_end(self, net, logs):
        self.calls.append(("end", dict(logs or {})))


@pytest.mark.skipif(not _fit_takes_callbacks(), reason="Sequential.fit has no callbacks yet")
def test_early_stopping_in_fit():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((96, 6)).astype(np.float32)
    y = rng.integers(0, 3, 96)
    xv, yv = x[:32], y[:32]

    def net():
        return pn.Sequential([pn.Dense(8, "relu"), pn.Dense(3, "softmax")], input_shape=6,
                             device="cpu", seed=3)

    # the loss falls, so "max" sees no improvement after epoch 0: a stop after epoch 1
    stopped, rec = net(), Recorder()
    es = EarlyStopping(monitor="loss", mode="max", patience=1, restore_best_weights=True)
    history = stopped.fit(x, y, epochs=6, batch_size=16, optimizer=pn.SGD(0.1, 0.9),
                          shuffle=False, validation_data=(xv, yv), callbacks=[rec, es])
    assert len(history["loss"]) == 2 and es.stopped_epoch == 1 and stopped.stop_training
    assert history["loss"][1] < history["loss"][0]
    # each epoch's logs are history's numbers; begin and end come once
    epochs = [c for c in rec.calls if c[0] == "epoch"]
    assert [c[0] for c in rec.calls] == ["begin", "epoch", "epoch", "end"]
    for epoch, (_, e, logs) in enumerate(epochs):
        assert e == epoch
        assert {"loss", "accuracy", "lr", "seconds", "val_loss", "val_accuracy"} <= set(logs)
        for name, value in logs.items():
            assert history[name][epoch] == value
    metrics = rec.calls[0][1].get("metrics")
    if metrics is not None:                     # what fit declares is what it logs
        assert set(metrics) == set(epochs[0][2])
    # restored: the weights of the end of epoch 0, which one epoch alone gives
    one = net()
    one.fit(x, y, epochs=1, batch_size=16, optimizer=pn.SGD(0.1, 0.9), shuffle=False)
    got, want = stopped.get_weights(), one.get_weights()
    assert set(got) == set(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)

    # a fit that stopped does not stop the next one at once
    again = net()
    h = again.fit(x, y, epochs=3, batch_size=16, optimizer=pn.SGD(0.1, 0.9), shuffle=False,
                  callbacks=[EarlyStopping(monitor="loss", patience=0)])
    assert len(h["loss"]) == 3


@pytest.mark.skipif(not _fit_takes_callbacks(), reason="Sequential.fit has no callbacks yet")
def test_early_stopping_on_val_loss_without_validation_in_fit():
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((32, 4)).astype(np.float32), rng.integers(0, 2, 32)
    net = pn.Sequential([pn.Dense(2, "softmax")], input_shape=4, device="cpu")
    with pytest.raises(InputError, match="validation_data"):
        net.fit(x, y, epochs=2, batch_size=8, callbacks=[EarlyStopping()])
