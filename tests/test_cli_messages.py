"""The command line speaks its own language: flags and shell commands in its messages,
a short report from export, and a device that profile can time."""
import re
import types

import pytest
from click.testing import CliRunner

import portanet as pn
from portanet import cli
from portanet.errors import DeviceError


def run(*args):
    return CliRunner().invoke(cli.main, [str(a) for a in args])


def test_a_missing_folder_is_fixed_in_the_shell(tmp_path):
    result = run("train", "--dataset", "coordinates", "--device", "cpu", "--save",
                 tmp_path / "runs" / "net.safetensors")
    assert result.exit_code == 1
    assert "--save: cannot save" in result.output
    assert f"(mkdir -p {tmp_path / 'runs'})" in result.output
    assert "os.makedirs" not in result.output


def test_divergence_says_the_lr_to_type():
    result = run("train", "--dataset", "coordinates", "--device", "cpu", "--epochs", 2,
                 "--lr", "1e30")
    assert result.exit_code == 1
    assert "learning rate 1e30; give a lower --lr (e.g. --lr 1e29)" in result.output
    assert "e+" not in result.output.splitlines()[-1]


def test_export_reports_in_a_few_short_lines(tmp_path):
    pytest.importorskip("onnx")
    net = pn.models.resnet(device="cpu")
    net.save(tmp_path / "r.safetensors")
    result = run("export", tmp_path / "r.safetensors", tmp_path / "r.onnx")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert len(lines) <= 4 and all(len(line) <= 100 for line in lines[1:]), lines
    assert lines[0].startswith(f"wrote {tmp_path / 'r.onnx'} (ONNX opset 17, ")
    assert "6 Residual" in result.output and "696,778 parameters" in result.output
    assert "input (N, 1, 28, 28) float32, output (N, 10) after softmax" in result.output


def fake_devices(monkeypatch, specs, simulators=()):
    monkeypatch.delenv("PORTANET_DEVICE", raising=False)
    monkeypatch.setattr(cli.backends, "list_devices",
                        lambda: ([("cpu", "NumPy")] + [(s, s) for s in specs], []))

    def device(spec):
        if spec == "opencl:9:0":
            raise DeviceError("refused here")
        return types.SimpleNamespace(simulator=spec in simulators)
    monkeypatch.setattr(cli.backends, "device", device)


def test_profile_picks_a_device_that_can_be_profiled(monkeypatch):
    fake_devices(monkeypatch, ["opencl:0:0", "opencl:9:0", "opencl:1:0"], ["opencl:0:0"])
    assert cli._profiled_device(None) == "opencl:1:0"       # not the simulator, nor cpu
    assert cli._profiled_device("opencl:0:0") == "opencl:0:0"


def test_profile_without_a_device_says_what_to_pass(monkeypatch):
    fake_devices(monkeypatch, ["opencl:0:0"], ["opencl:0:0"])
    with pytest.raises(pn.PortanetError, match="--device opencl:0:0"):
        cli._profiled_device(None)
    fake_devices(monkeypatch, [])
    with pytest.raises(pn.PortanetError, match=r"pip install 'portanet\[opencl\]'"):
        cli._profiled_device(None)


def test_profile_on_cpu_lists_the_devices_to_pass(monkeypatch):
    monkeypatch.setattr(cli.backends, "list_devices",
                        lambda: ([("cpu", "NumPy"), ("opencl:1:0", "x")], []))
    result = run("profile", "--device", "cpu")
    assert result.exit_code == 1
    assert "cpu cannot be profiled" in result.output and "--device opencl:1:0" in result.output


@pytest.mark.parametrize("word, extra", [("intel", "portanet[intel-cpu]"),
                                         ("pocl", "portanet[pocl]"),
                                         ("oclgrind", "portanet[oclgrind]")])
def test_a_missing_platform_names_what_installs_it(monkeypatch, word, extra):
    pytest.importorskip("pyopencl")
    from portanet.backends import opencl_devices
    monkeypatch.setattr(opencl_devices, "_platforms", lambda: [])
    with pytest.raises(DeviceError, match=re.escape(f"opencl:{word} comes with pip install '{extra}'")):
        opencl_devices.platform_number(word)


@pytest.mark.parametrize("flag, value, said", [
    ("--clip-norm", -1, "--clip-norm must be a finite number in (0, inf), got -1.0"),
    ("--weight-decay", -1, "--weight-decay must be a finite number in [0, inf), got -1.0"),
    ("--lr", 0, "--lr must be a finite number in (0, inf), got 0.0"),
    ("--momentum", 1.5, "--momentum must be a finite number in [0, 1), got 1.5"),
])
def test_an_optimizer_setting_out_of_range_names_its_flag(flag, value, said):
    result = run("train", "--dataset", "coordinates", "--device", "cpu", flag, value)
    assert result.exit_code == 2
    assert said in result.output
    assert "SGD:" not in result.output and "_" not in result.output.splitlines()[-1]
