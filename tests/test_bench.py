"""`portanet bench`: the JSON has the schema docs/benchmarks.md documents, and a device that
fails is reported with its error, not dropped. (Timings are never asserted.)"""
import json

import numpy as np
import pytest
from click.testing import CliRunner

import portanet as pn
from portanet import bench, peer
from portanet.cli import main

ROW_KEYS = {"workload": str, "case": str, "device": str, "precision": str, "status": str,
            "error": (str, type(None)), "median_s": (float, type(None)),
            "min_s": (float, type(None)), "max_s": (float, type(None)), "repeats": int,
            "inner": int,
            "throughput": (float, type(None)), "throughput_unit": (str, type(None)),
            "gflops": (float, type(None)), "fraction_of_peak": (float, type(None)),
            "peak_bytes": (int, type(None)), "gemm_path": (str, type(None)),
            "torch": (dict, type(None)), "ratio_to_torch": (float, type(None)),
            "torch_graph": (dict, type(None)), "ratio_to_torch_graph": (float, type(None))}


def test_list_names_every_workload():
    result = CliRunner().invoke(main, ["bench", "--list"])
    assert result.exit_code == 0
    for name in ("gemm", "mlp-big", "mlp-small", "lenet-step", "resnet-step", "lenet-infer",
                 "gpt-step"):
        assert name in result.output


def test_json_schema_and_failed_devices(tmp_path, monkeypatch):
    out = tmp_path / "out.json"
    result = CliRunner().invoke(main, ["bench", "--device", "cpu", "--device", "cuda:7",
                                       "--workload", "gemm", "--workload", "mlp-small",
                                       "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["schema"] == bench.SCHEMA
    assert {"python", "numpy", "portanet", "platform"} <= set(report["environment"])
    assert report["devices"]["cpu"]["status"] == "ok"
    assert report["devices"]["cpu"]["peak_gflops"]["fp32"] > 0
    assert report["devices"]["cuda:7"]["status"] == "failed"
    for row in report["results"]:
        for key, kind in ROW_KEYS.items():
            assert isinstance(row[key], kind), (key, row[key])
    cpu = [r for r in report["results"] if r["device"] == "cpu"]
    assert {r["workload"] for r in cpu} == {"gemm", "mlp-small"}
    assert all(r["status"] == "ok" and r["median_s"] > 0 and r["min_s"] <= r["median_s"]
               <= r["max_s"] and r["peak_bytes"] > 0 for r in cpu)
    assert len([r for r in cpu if r["workload"] == "gemm"]) == 3          # several sizes
    failed = [r for r in report["results"] if r["device"] == "cuda:7"]
    assert {r["workload"] for r in failed} == {"gemm", "mlp-small"}
    assert all(r["status"] == "failed" and "cuda" in r["error"] for r in failed)
    assert "FAILED" in result.output
    # the share column says what it is a share of: the fastest GEMM of this run, not the
    # hardware's peak (it was headed "%peak" without a word)
    assert "%best" in result.output and "%peak" not in result.output
    assert "share of the fastest GEMM measured on the same device in this run" in result.output


def test_a_workload_that_fails_is_reported(monkeypatch):
    def broken(bk, rng):
        def run():
            raise RuntimeError("kernel exploded")
        yield "case", run
    monkeypatch.setitem(bench.WORKLOADS, "broken", (broken, "always fails"))
    report = bench.run(["cpu"], ["broken"], peer=False, progress=lambda line: None)
    (row,) = report["results"]
    assert row["status"] == "failed" and "kernel exploded" in row["error"]


def test_plot(tmp_path):
    pytest.importorskip("matplotlib")
    report = bench.run(["cpu"], ["mlp-small"], peer=False, progress=lambda line: None)
    bench.plot(report, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_a_steps_products_are_counted_layer_by_layer():
    """An MLP's: each layer's forward and weight gradient, and past the first its input
    gradient. LeNet's: conv1 1x9 -> 16 at 26x26, conv2 144 -> 32 at 24x24, the dense 4608
    -> 10; a ResNet's include the layers inside its blocks."""
    m = 7
    mlp, _ = bench.training_step("mlp-small", pn.device("cpu"), m, np.random.default_rng(0))
    assert bench._products_flops(mlp, m) == 2 * m * (1000 * 500 * 2 + 500 * 100 * 3
                                                     + 100 * 10 * 3)
    lenet = pn.models.lenet(device="cpu")
    conv1, conv2, dense = 2 * 16 * 9 * 676 * m, 2 * 32 * 144 * 576 * m, 2 * 10 * 4608 * m
    assert bench._products_flops(lenet, m) == conv1 * 2 + conv2 * 3 + dense * 3
    # the ResNet's stem, then per stage: its first block's first conv (stride 2 past the
    # first stage), the other three, the projection (1x1), then the dense
    stem = 2 * 32 * 9 * 784 * m * 2
    stage1 = 4 * 3 * 2 * 32 * 288 * 784 * m
    stage2 = 3 * 2 * m * 196 * (64 * 288 + 3 * 64 * 576 + 64 * 32)
    stage3 = 3 * 2 * m * 49 * (128 * 576 + 3 * 128 * 1152 + 128 * 64)
    resnet = pn.models.resnet(device="cpu")
    assert bench._products_flops(resnet, m) == stem + stage1 + stage2 + stage3 + \
        3 * 2 * 10 * 128 * m


def test_resnet_step_runs_and_matches_torchs_network():
    """The resnet-step workload's step trains (one step on the reference, 4 images), and
    PyTorch's peer network has the same parameters, layer for layer."""
    bk = pn.device("cpu")
    net, step = bench.training_step("resnet-step", bk, 4, np.random.default_rng(0))
    before = net.get_weights()["0.w"].copy()
    step()
    assert not np.array_equal(net.get_weights()["0.w"], before)
    torch = pytest.importorskip("torch")
    shapes = [tuple(p.shape) for p in peer.torch_resnet(torch).parameters()]
    trained = {name: x for name, x in net.get_weights().items() if "running" not in name}
    assert sum(int(np.prod(s)) for s in shapes) == sum(x.size for x in trained.values())
    assert len(shapes) == len(trained)


def test_gpt_step_matches_torchs_network_and_counts_tokens():
    """The gpt-step workload is nanoGPT's baby GPT: PyTorch's peer has its parameters,
    tensor for tensor (10.8 M), and the step trains; a row counts tokens, 256 a sample."""
    bk = pn.device("cpu")
    net, step = bench.training_step("gpt-step", bk, 1, np.random.default_rng(0))
    before = net.get_weights()["0.table"].copy()
    step()
    assert not np.array_equal(net.get_weights()["0.table"], before)
    assert bench.step_batches("gpt-step", bk) == (2,)
    assert bench._products_flops(net, 1) > 6 * 10.7e6 * 256        # 6 N a token and more
    torch = pytest.importorskip("torch")
    g = bench.GPT_STEP
    model = peer.torch_gpt(torch, **{k: g[k] for k in ("vocab", "context", "layers", "heads",
                                                       "dim", "dropout")})
    shapes = sorted(tuple(p.shape) for p in model.parameters())
    assert shapes == sorted(x.shape for x in net.get_weights().values())


def test_the_table_shows_pytorchs_peak_beside_ours():
    """A row whose PyTorch peer measured its peak shows it in MiB beside portanet's; one
    without says n/a."""
    row = bench._row("resnet-step", "batch 128", "cuda",
                     timing={"median_s": 4e-3, "min_s": 4e-3, "max_s": 4e-3, "repeats": 10,
                             "inner": 3, "throughput": 32000.0, "throughput_unit": "images/s"},
                     peak_bytes=392 * 2**20, precision="fp32")
    row["torch"] = {"status": "ok", "median_s": 5e-3, "peak_bytes": 270 * 2**20}
    row["ratio_to_torch"] = 0.8
    other = dict(row, torch={"status": "unavailable", "reason": "not asked for"},
                 ratio_to_torch=None)
    lines = bench.table({"results": [row, other]}).splitlines()
    assert "torch MiB" in lines[0]
    assert "392.0     270.0" in lines[2]
    assert "392.0       n/a" in lines[3]


def test_pytorchs_peak_on_cuda():
    """Where PyTorch and a CUDA GPU are present: its LeNet step's eager peak, beyond what
    was allocated before, is counted (the model, its gradients and momentum, the batch and
    the activations: more than the 0.9 MiB of LeNet's parameters, far less than a GiB)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch sees no CUDA GPU here")
    figures = peer.torch_case("lenet-step", "batch 64", "cuda")
    assert 2**20 < figures["peak_bytes"] < 2**30
