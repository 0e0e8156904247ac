"""A checkpoint's training state is checked before resuming touches the network: every
value of its metadata by type and range (a hand-edited or damaged file is refused with a
PortanetError naming the value, and the network keeps its weights); what the run depends
on (its loss, validation, ...) compared with the run resuming it; and a checkpoint path
that a ModelCheckpoint would overwrite with a file holding no training state is refused
before training."""
import json
import os

import numpy as np
import pytest
import safetensors
import safetensors.numpy

import portanet as pn
from portanet.callbacks import ModelCheckpoint

FIT = dict(batch_size=8, optimizer=pn.Adam(0.01), seed=4)


def network(loss="softmax_cross_entropy", last="softmax"):
    return pn.Sequential([pn.Dense(6, "relu"), pn.Dropout(0.2, seed=1), pn.Dense(3, last)],
                         4, loss=loss, device="cpu", seed=2)


def data():
    rng = np.random.default_rng(0)
    return rng.standard_normal((20, 4)).astype(np.float32), rng.integers(0, 3, 20)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A real checkpoint of 2 epochs: (path, its tensors, its metadata)."""
    path = tmp_path_factory.mktemp("ck") / "run.safetensors"
    network().fit(*data(), epochs=2, checkpoint=path, **FIT)
    with safetensors.safe_open(str(path), framework="numpy") as f:
        metadata = dict(f.metadata())
    return path, safetensors.numpy.load_file(str(path)), metadata


def edited(written, tmp_path, change):
    """A copy of the checkpoint whose training state change(state) has edited in place; a
    str change is the state's text itself."""
    _, tensors, metadata = written
    if isinstance(change, str):
        text = change
    else:
        state = json.loads(metadata["training"])
        change(state)
        text = json.dumps(state)
    path = tmp_path / "edited.safetensors"
    safetensors.numpy.save_file(tensors, str(path), metadata=dict(metadata, training=text))
    return path


def refused(path, match, error=pn.PortanetError, net=None, **fit):
    """fit(resume=path) raises `error` matching `match`, and the network's weights and
    Dropout steps are what they were."""
    net = net or network()
    before = net.get_weights()
    steps = [l.step for _, l in net.walk() if isinstance(l, pn.Dropout)]
    with pytest.raises(error, match=match):
        net.fit(*data(), epochs=4, resume=path, **dict(FIT, **fit))
    after = net.get_weights()
    assert all(np.array_equal(before[k], after[k]) for k in before)
    assert steps == [l.step for _, l in net.walk() if isinstance(l, pn.Dropout)]


def put(key, value):
    return lambda s: s.__setitem__(key, value)


def put_in(outer, key, value):
    return lambda s: s[outer].__setitem__(key, value)


def without(key):
    return lambda s: s.pop(key)


BAD = {
    "epoch -3": (put("epoch", -3), "epoch"),
    "epoch 1.9": (put("epoch", 1.9), "epoch"),
    "epoch true": (put("epoch", True), "epoch"),
    "epoch text": (put("epoch", "2"), "epoch"),
    "epoch missing": (without("epoch"), "epoch"),
    "step -1": (put("step", -1), "step"),
    "step -50": (put("step", -50), "step"),
    "step 2.5": (put("step", 2.5), "step"),
    "step null": (put("step", None), "step"),
    "rng {}": (put("rng", {}), "rng"),
    "rng list": (put("rng", [1, 2]), "rng"),
    "rng other generator": (put_in("rng", "bit_generator", "MT19937"), "rng"),
    "rng state text": (lambda s: s["rng"]["state"].__setitem__("state", "x"), "rng"),
    "rng state negative": (lambda s: s["rng"]["state"].__setitem__("state", -1), "rng"),
    "rng state too wide": (lambda s: s["rng"]["state"].__setitem__("inc", 1 << 130), "rng"),
    "rng has_uint32 2": (put_in("rng", "has_uint32", 2), "rng"),
    "history []": (put("history", []), "history"),
    "history loss 3": (put("history", {"loss": 3}), "history"),
    "history short": (lambda s: s["history"]["loss"].pop(), "history"),
    "history nan": (lambda s: s["history"]["loss"].__setitem__(0, float("nan")), "history"),
    "history text": (lambda s: s["history"]["accuracy"].__setitem__(1, "0.5"), "history"),
    "history bool": (lambda s: s["history"]["lr"].__setitem__(1, True), "history"),
    "history lacks a metric": (lambda s: s["history"].pop("seconds"), "history"),
    "history extra metric": (put_in("history", "val_loss", [1.0, 1.0]), "history"),
    "settings list": (put("settings", [1]), "settings"),
    "settings lacks seed": (lambda s: s["settings"].pop("seed"), "settings"),
    "settings unknown key": (put_in("settings", "colour", "red"), "settings"),
    "dropout step 1.5": (put("dropout_steps", {"1": 1.5}), "dropout"),
    "dropout step -1": (put("dropout_steps", {"1": -1}), "dropout"),
    "dropout step true": (put("dropout_steps", {"1": True}), "dropout"),
    "dropout not a dropout": (put("dropout_steps", {"1": 4, "0": 4}), "dropout"),
    "dropout missing": (put("dropout_steps", {}), "dropout"),
    "dropout list": (put("dropout_steps", [4]), "dropout"),
    "optimizer other": (put("optimizer", {"name": "sgd", "config": {"lr": 0.01}}),
                        "optimizer"),
    "optimizer other beta": (lambda s: s["optimizer"]["config"].__setitem__("beta1", 0.5),
                             "optimizer"),
    "optimizer lr nan": (lambda s: s["optimizer"]["config"].__setitem__("lr", float("nan")),
                         "optimizer"),
    "optimizer text": (put("optimizer", "adam"), "optimizer"),
    "unknown entry": (put("colour", "red"), "colour"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_training_state_is_refused_before_the_network_changes(written, tmp_path, case):
    change, says = BAD[case]
    refused(edited(written, tmp_path, change), says, pn.ModelFileError)


@pytest.mark.parametrize("text", ["{", "[" * 5000, "\u00ff", '{"epoch": NaN}', "[2]"])
def test_training_state_that_is_not_json_is_refused(written, tmp_path, text):
    refused(edited(written, tmp_path, text), "training state", pn.ModelFileError)


def test_the_checkpoint_as_written_resumes(written, tmp_path):
    """The edits above are refused for what they change: the file itself resumes, and so
    does one written before the settings recorded the loss, validation and ranks."""
    path, _, _ = written
    net = network()
    assert len(net.fit(*data(), epochs=3, resume=path, **FIT)["loss"]) == 3
    older = edited(written, tmp_path, lambda s: [s["settings"].pop(k)
                                                  for k in ("loss", "validation", "ranks")])
    assert len(network().fit(*data(), epochs=3, resume=older, **FIT)["loss"]) == 3


def test_another_loss_on_the_same_layers_is_refused(tmp_path):
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((20, 4)).astype(np.float32), rng.random((20, 3))
    path = tmp_path / "bce.safetensors"
    network("binary_cross_entropy", "sigmoid").fit(x, y, epochs=1, checkpoint=path, **FIT)
    net = network("mse", "sigmoid")
    before = net.get_weights()
    with pytest.raises(pn.InputError, match="loss: 'binary_cross_entropy' in the file, "
                                            "'mse' now"):
        net.fit(x, y, epochs=3, resume=path, **FIT)
    assert all(np.array_equal(v, net.get_weights()[k]) for k, v in before.items())
    network("binary_cross_entropy", "sigmoid").fit(x, y, epochs=2, resume=path, **FIT)


def test_resuming_with_other_validation_is_refused(written):
    """History lists of one run would be ragged in the other: a run validated from its
    first epoch resumes with validation, one without it without."""
    path, _, _ = written
    x, y = data()
    with pytest.raises(pn.InputError, match="validation: False in the file, True now"):
        network().fit(x, y, epochs=3, resume=path, validation_data=(x[:5], y[:5]), **FIT)


# -- a checkpoint and a ModelCheckpoint on one file -------------------------------------


def clash(tmp_path, checkpoint, saves, match="same file"):
    """fit(checkpoint=checkpoint, callbacks=[ModelCheckpoint(saves)]) is refused before
    training: the network unchanged, nothing written."""
    net = network()
    before = net.get_weights()
    listed = sorted(os.listdir(tmp_path))
    with pytest.raises(pn.InputError, match=match):
        net.fit(*data(), epochs=2, checkpoint=checkpoint,
                callbacks=[ModelCheckpoint(saves, monitor="loss")], **FIT)
    assert all(np.array_equal(v, net.get_weights()[k]) for k, v in before.items())
    assert sorted(os.listdir(tmp_path)) == listed


def test_a_model_checkpoint_on_the_checkpoint_file_is_refused_up_front(tmp_path):
    path = tmp_path / "run.safetensors"
    clash(tmp_path, path, path)
    clash(tmp_path, path, str(path))
    os.chdir(tmp_path)                                 # (pytest restores the folder)
    clash(tmp_path, path, "run.safetensors")
    clash(tmp_path, "run.safetensors", tmp_path / "." / "run.safetensors")


def test_a_link_to_the_checkpoint_file_is_the_same_file(tmp_path):
    path = tmp_path / "run.safetensors"
    network().fit(*data(), epochs=1, checkpoint=path, **FIT)
    os.symlink(path, tmp_path / "link.safetensors")
    os.symlink(tmp_path, tmp_path / "folder")
    clash(tmp_path, path, tmp_path / "link.safetensors")
    clash(tmp_path, tmp_path / "link.safetensors", path)
    clash(tmp_path, path, tmp_path / "folder" / "run.safetensors")
    net = network()                                    # the checkpoint still resumes
    assert len(net.fit(*data(), epochs=2, resume=path, **FIT)["loss"]) == 2


def test_a_model_checkpoint_pattern_that_names_the_checkpoint_is_refused(tmp_path):
    clash(tmp_path, tmp_path / "m-2.safetensors", tmp_path / "m-{epoch}.safetensors")
    clash(tmp_path, tmp_path / "m-002-0.50.safetensors",
          tmp_path / "m-{epoch:03d}-{loss:.2f}.safetensors")


def test_a_model_checkpoint_beside_the_checkpoint_runs(tmp_path):
    """Two paths, or a pattern that cannot give the checkpoint's name: both files are
    written, and the checkpoint resumes."""
    path = tmp_path / "m-final.safetensors"
    saves = ModelCheckpoint(tmp_path / "m-{epoch}.safetensors", monitor="loss")
    network().fit(*data(), epochs=2, checkpoint=path, callbacks=[saves], **FIT)
    assert sorted(os.listdir(tmp_path)) == ["m-1.safetensors", "m-2.safetensors",
                                            "m-final.safetensors"]
    assert len(network().fit(*data(), epochs=3, resume=path, **FIT)["loss"]) == 3


def test_a_model_checkpoint_that_formats_to_the_checkpoint_stops_before_writing(tmp_path):
    """Where a pattern's name is known only when it is formatted (a link it gives, named
    after the epoch, to the checkpoint), the save is refused then, before it writes: the
    checkpoint keeps its training state."""
    path = tmp_path / "run.safetensors"
    os.symlink(path, tmp_path / "m-2.bin")
    with pytest.raises(pn.InputError, match="same file"):
        network().fit(*data(), epochs=3, checkpoint=path, callbacks=[
            ModelCheckpoint(tmp_path / "m-{epoch}.bin", monitor="loss")], **FIT)
    assert len(network().fit(*data(), epochs=3, resume=path, **FIT)["loss"]) == 3
