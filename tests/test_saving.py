"""Networks to files and back: atomic saves that survive a
kill, destinations checked before training, safetensors files checked against the
architecture before anything is allocated, old .npz files still loading."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import safetensors.numpy
from click.testing import CliRunner

import portanet as pn
from portanet.cli import main


def small_net(device="cpu", hidden=8):
    return pn.mlp((6,), classes=3, hidden=(hidden,), device=device)


def test_save_is_safetensors_with_the_architecture(tmp_path):
    net = small_net()
    path = tmp_path / "net.safetensors"
    net.save(path)
    from safetensors import safe_open
    with safe_open(str(path), "np") as f:
        meta = f.metadata()
        assert sorted(f.keys()) == ["0.b", "0.w", "1.b", "1.w"]
        assert np.array_equal(f.get_tensor("0.w"), net.layers[0].w)
    assert meta["format"] == "portanet-model-2"
    assert json.loads(meta["architecture"])["layers"][0] == ["Dense", {"units": 8,
                                                                       "activation": "relu"}]


KILLER = textwrap.dedent("""
    import sys, portanet as pn
    net = pn.mlp((2000,), classes=10, hidden=(2000, 1000), device="cpu")   # ~25 MB
    print("ready", flush=True)
    while True:
        net.save(sys.argv[1])
""")


def test_a_kill_during_save_never_leaves_a_broken_file(tmp_path):
    path = tmp_path / "big.safetensors"
    first = pn.mlp((2000,), classes=10, hidden=(2000, 1000), device="cpu")
    first.save(path)
    x = np.random.default_rng(0).standard_normal((3, 2000)).astype(np.float32)
    expected = first.predict(x)
    for delay in (0.0, 0.02, 0.05, 0.1, 0.2, 0.35):
        proc = subprocess.Popen([sys.executable, "-c", KILLER, str(path)],
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        loaded = pn.load(path, device="cpu")           # always the whole of one save
        assert np.array_equal(loaded.predict(x), expected)


def test_a_failed_save_leaves_the_previous_file(tmp_path, monkeypatch):
    net, other = small_net(), small_net(hidden=5)
    path = tmp_path / "net.safetensors"
    net.save(path)
    before = path.read_bytes()
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(28, "No space left on device")))
    with pytest.raises(pn.ModelFileError, match=r"could not save .*net.safetensors.*No space"):
        other.save(path)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["net.safetensors"]   # no temp left


@pytest.mark.parametrize("where", ["missing/net.safetensors", "", "file/net.safetensors"])
def test_bad_destinations_are_portanet_errors(tmp_path, where):
    (tmp_path / "file").write_text("a file, not a folder")
    with pytest.raises(pn.ModelFileError, match="cannot save"):
        small_net().save(tmp_path / where)


def test_cli_checks_the_save_path_before_training(tmp_path):
    result = CliRunner().invoke(main, ["train", "--dataset", "coordinates", "--epochs", "30",
                                       "--save", str(tmp_path / "no" / "such" / "net")])
    assert result.exit_code != 0
    assert "does not exist" in result.output and "Traceback" not in result.output
    assert "epoch 1/" not in result.output                   # refused before training


def test_old_npz_files_still_load(tmp_path):
    """The portanet-model-1 format: an .npz with the architecture as JSON bytes."""
    net = small_net()
    arch = {"format": "portanet-model-1", "input_shape": [6], "loss": "softmax_cross_entropy",
            "layers": [[type(l).__name__, l.config()] for l in net.layers]}
    arrays = {"architecture": np.frombuffer(json.dumps(arch).encode(), np.uint8)}
    for i, layer in enumerate(net.layers):
        for name, x in layer.params().items():
            arrays[f"{i}.{name}"] = np.array(x)
    path = tmp_path / "old.npz"
    np.savez(path, **arrays)
    x = np.random.default_rng(1).standard_normal((4, 6)).astype(np.float32)
    assert np.array_equal(pn.load(path).predict(x), net.predict(x))


def forged(tmp_path, architecture, tensors=None, name="forged.safetensors"):
    """A safetensors file with any architecture text and tensors."""
    net = small_net()
    if tensors is None:
        tensors = {f"{i}.{k}": np.array(x) for i, l in enumerate(net.layers)
                   for k, x in l.params().items()}
    path = tmp_path / name
    text = architecture if isinstance(architecture, str) else json.dumps(architecture)
    safetensors.numpy.save_file(tensors, str(path), metadata={"format": "portanet-model-2",
                                                               "architecture": text})
    return path


GOOD = {"input_shape": [6], "loss": "softmax_cross_entropy",
        "layers": [["Dense", {"units": 8, "activation": "relu"}],
                   ["Dense", {"units": 3, "activation": "softmax"}]]}


@pytest.mark.parametrize("change, message", [
    (lambda a: [a], "not a JSON object"),                                  # list-shaped
    (lambda a: {k: v for k, v in a.items() if k != "layers"}, "lacks layers"),
    (lambda a: dict(a, input_shape=[0]), "input_shape"),
    (lambda a: dict(a, input_shape="six"), "input_shape must be a list"),
    (lambda a: dict(a, layers=[["Dense", {"units": True, "activation": "relu"}],
                               a["layers"][1]]), "units must be a whole number"),
    (lambda a: dict(a, layers=[["Dense", ["units", 8]], a["layers"][1]]), "mapping"),
    (lambda a: dict(a, layers=[["Dense", {"unit": 8}], a["layers"][1]]), "unexpected keyword"),
    (lambda a: dict(a, layers=[["Lambda", {}], a["layers"][1]]), "unknown layer type"),
    (lambda a: dict(a, layers=[["Dense", {"units": 3, "activation": "softmax"}]]),
     "do not match"),
    (lambda a: dict(a, loss="hinge"), "unknown loss"),
    (lambda a: "[" * 100000, "not valid JSON"),                            # deep JSON
])
def test_forged_architectures_are_model_file_errors(tmp_path, change, message):
    path = forged(tmp_path, change(GOOD))
    with pytest.raises(pn.ModelFileError, match=message):
        pn.load(path)


def test_huge_architecture_is_refused_before_allocation(tmp_path):
    """Dense(10**6) on 10**6 inputs: refused by the plan, no MemoryError from NumPy."""
    arch = dict(GOOD, input_shape=[10**6], layers=[["Dense", {"units": 10**6}],
                                                    ["Dense", {"units": 3, "activation": "softmax"}]])
    with pytest.raises(pn.PortanetError, match="TiB"):
        pn.load(forged(tmp_path, arch))


@pytest.mark.parametrize("bad", [
    np.full((8, 6), np.nan, np.float32), np.full((8, 6), np.inf, np.float32),
    np.zeros((8, 6), np.complex64), np.zeros((8, 6), bool), np.zeros((8, 6), np.int32)])
def test_bad_weights_are_refused_and_leave_the_network_as_it_was(tmp_path, bad):
    net = small_net()
    tensors = {f"{i}.{k}": np.array(x) for i, l in enumerate(net.layers)
               for k, x in l.params().items()}
    target = small_net(hidden=8)
    target.layers[1].b[...] = 7.0
    before = [np.array(x) for l in target.layers for x in l.params().values()]
    path = forged(tmp_path, GOOD, dict(tensors, **{"0.w": bad}))
    with pytest.raises(pn.ModelFileError, match="0.w"):
        pn.load(path)
    with pytest.raises(pn.ModelFileError, match="0.w"):
        target.load_weights(path)
    after = [np.array(x) for l in target.layers for x in l.params().values()]
    assert all(np.array_equal(a, b) for a, b in zip(before, after))


def test_extra_tensors_are_refused_unread(tmp_path):
    net = small_net()
    tensors = {f"{i}.{k}": np.array(x) for i, l in enumerate(net.layers)
               for k, x in l.params().items()}
    path = forged(tmp_path, GOOD, dict(tensors, junk=np.zeros(10, np.float32)))
    with pytest.raises(pn.ModelFileError, match="not in the network: junk"):
        pn.load(path)
