"""`portanet profile`: one training step, every launch and vendor call timed.
Times are never asserted beyond being measured; what is checked is that every call of the
step is there, in order, and that recording changes nothing."""
import json

import numpy as np
import pytest
from click.testing import CliRunner

import portanet as pn
from portanet import bench, profiler
from portanet.cli import main

GPU = ["opencl", "cuda"]


@pytest.mark.parametrize("device", GPU)
def test_profile_lists_every_call_of_a_lenet_step(device, tmp_path):
    try:
        bk = pn.device(device)
    except pn.DeviceError as e:
        pytest.skip(str(e))
    out = tmp_path / "p.json"
    result = CliRunner().invoke(main, ["profile", "lenet-step", "--device", device,
                                       "--batch-size", "8", "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    # a split-K gemm's second launch (gemm_split_sum) and a long product's later pieces of
    # K depend on the device and the route
    calls = [r["call"].split(" ")[0] for r in report["calls"]
             if r["call"] != "gemm_split_sum" and " piece " not in r["call"]
             or " piece 1/" in r["call"]]
    # forward: the two conv layers on their routed paths (implicit GEMM "conv ...",
    # conv_direct, or im2col and gemm, then bias_activation), maxpool, the dense layer's
    # product, then its bias and softmax in one launch with the loss (bias_softmax_xent),
    # its bias gradient too (bias_softmax_xent_grad) or by gemv after, as routing measured
    pool = calls.index("maxpool")
    assert {"conv", "conv_direct", "im2col"} & set(calls[:pool]), calls
    assert set(calls[:pool]) <= {"conv", "conv_direct", "im2col", "gemm", "bias_activation"}
    assert calls[pool:pool + 2] == ["maxpool", "gemm"]
    assert calls[pool + 2:pool + 4] in (["bias_softmax_xent", "gemv"],
                                        ["bias_softmax_xent_grad", "gemm"]), calls
    assert "maxpool_grad" in calls
    assert (calls.count("momentum_updates") == 1 if bk.fused_updates       # all layers
            else calls.count("momentum_update") == 3)                      # a launch each
    assert all(r["device_us"] >= 0 and r["host_us"] > 0 for r in report["calls"])
    assert report["wall_us"] > 0 and "costliest on the device" in result.output
    assert bk.trace is None


@pytest.mark.parametrize("device", GPU)
def test_recording_changes_nothing(device):
    try:
        bk = pn.device(device)
    except pn.DeviceError as e:
        pytest.skip(str(e))
    results = []
    for recorded in (False, True):
        net, step = bench.training_step("mlp-small", bk, 16, np.random.default_rng(3), eager=True)
        if recorded:
            profiler.profile(bk, step, warmup=0)
        else:
            for _ in range(2):
                step()
        results.append(bk.download(net.layers[0].w))
        net.free()
    assert np.array_equal(*results)


def test_profile_needs_a_device_backend():
    result = CliRunner().invoke(main, ["profile", "mlp-small", "--device", "cpu"])
    assert result.exit_code != 0 and "cpu cannot be profiled" in result.output
    assert "--device" in result.output          # says which devices can
