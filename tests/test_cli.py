"""The `portanet` command, through click's test runner."""
import json

import pytest
from click.testing import CliRunner

import portanet as pn
from portanet.cli import main


def run(*args):
    result = CliRunner().invoke(main, list(args))
    return result


def test_devices_lists_cpu_and_its_string():
    result = run("devices")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0].startswith("cpu ")


def test_train_coordinates_json(device_name, tmp_path):
    save = tmp_path / "coords.npz"
    result = run("train", "--dataset", "coordinates", "--epochs", "20", "--batch-size", "32",
                 "--lr", "0.1", "--device", device_name, "--json", "--save", str(save))
    assert result.exit_code == 0, result.output
    report = json.loads(result.output.strip().splitlines()[-1])
    for key in ("device", "model", "dataset", "epochs", "batch_size", "test_accuracy",
                "final_loss", "epoch_seconds"):
        assert key in report
    assert report["device"] == pn.device(device_name).name
    assert len(report["epoch_seconds"]) == 20
    assert report["test_accuracy"] >= 0.95
    assert "epoch 20/20" in result.output
    loaded = pn.load(save)
    (_, _), (xt, yt) = pn.data.coordinates(seed=0)
    assert loaded.evaluate(xt, yt)[1] == pytest.approx(report["test_accuracy"])


def test_train_fashion_mnist_limit():
    try:
        pn.load_dataset("fashion-mnist")
    except pn.DataError as e:
        pytest.skip(str(e))
    result = run("train", "--limit", "2000", "--epochs", "1", "--device", "cpu", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output.strip().splitlines()[-1])
    assert report["train_samples"] == 2000 and report["test_accuracy"] > 0.6


def test_train_bad_device_is_a_clean_error():
    result = run("train", "--dataset", "coordinates", "--device", "quantum")
    assert result.exit_code != 0
    assert "unknown device 'quantum'" in result.output and "Traceback" not in result.output


def test_train_lenet_subset(device_name):
    try:
        pn.load_dataset("fashion-mnist")
    except pn.DataError as e:
        pytest.skip(str(e))
    result = run("train", "--model", "lenet", "--limit", "1280", "--epochs", "1",
                 "--device", device_name, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output.strip().splitlines()[-1])
    assert report["model"] == "lenet" and report["test_accuracy"] > 0.5


def test_train_model_description():
    result = run("train", "--dataset", "coordinates", "--epochs", "3", "--device", "cpu",
                 "--model", "dense(16, tanh) dense(1, sigmoid)", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output.strip().splitlines()[-1])["test_accuracy"] > 0.6
    bad = run("train", "--dataset", "coordinates", "--model", "dense(16, gelu)")
    assert bad.exit_code != 0 and "unknown activation 'gelu'" in bad.output
