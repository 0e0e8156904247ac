"""Dynamic loss scaling (optim.LossScale, fp16's default): the loss's delta times a power of
two, the gradients divided by it, steps whose gradients overflow skipped on the device.

Scaling by a power of two is exact wherever nothing under- or overflows, so in fp32 a
scaled run must compute the unscaled run bit for bit (its gradients take the same paths),
but for SGD with momentum, whose scaled velocity is updated by its own kernel rather than
by gemm's beta, and Adam, whose scaled step numbers the device forms (rounding apart). A
skipped step must be as if it had not been. The kernels themselves are tested against the
reference in test_kernels.py (unscale_check, adam_scalars, update_loss_scale, the updates'
skip flag).
"""
import numpy as np
import pytest

import portanet as pn
from portanet.errors import InputError

from conftest import F32, precision_backend, rel_err

OPTIMIZERS = {"sgd": pn.SGD(0.05), "momentum": pn.SGD(0.05, 0.9),
              "nesterov": pn.SGD(0.05, 0.9, nesterov=True, weight_decay=1e-3),
              "adam": pn.Adam(0.01), "adamw": pn.AdamW(0.01), "rmsprop": pn.RMSprop(0.01)}


def mlp(device, loss_scale=None, precision=None, second="tanh"):
    return pn.Sequential([pn.Dense(24, "relu"), pn.Dense(16, second), pn.Dense(3, "softmax")],
                         12, device=device, precision=precision, loss_scale=loss_scale, seed=4)


def cnn(device, loss_scale=None):
    return pn.Sequential([pn.Conv2D(4, 3, padding=1), pn.BatchNorm("relu"), pn.MaxPool2D(2),
                          pn.Flatten(), pn.Dense(3, "softmax")], (1, 6, 6), device=device,
                         loss_scale=loss_scale, seed=4)


def data(rng, shape):
    x = rng.standard_normal((96, *shape)).astype(np.float32)
    return x, (x.reshape(96, -1)[:, :3] * [1, -1, 2]).argmax(1)


def state(net):
    """Host copies of the parameters and the optimizer's state."""
    out = {name: x for name, x in net.get_weights().items()}
    out.update({name: net.backend.download(x)
                for name, x in net.optimizer_state.tensors().items()
                if name != "optimizer.loss_scale"})
    return out


@pytest.mark.parametrize("model", ["mlp", "cnn"])
@pytest.mark.parametrize("opt", OPTIMIZERS)
def test_a_scaled_run_computes_the_unscaled_run(device_name, rng, model, opt):
    """Six steps (eager, recorded, replayed where the device records steps) with a scale
    that doubles every second step: the same parameters and optimizer state as unscaled,
    bit for bit but for momentum SGD's velocity update and Adam's step numbers; the scale
    moved on the device."""
    make, shape = (mlp, (12,)) if model == "mlp" else (cnn, (1, 6, 6))
    x, y = data(rng, shape)
    nets, histories = [], []
    for scale in (None, pn.LossScale(2.0 ** 13, growth_interval=2)):
        net = make(device_name, scale)
        histories.append(net.fit(x, y, epochs=2, batch_size=32, optimizer=OPTIMIZERS[opt]))
        nets.append(net)
    plain, scaled = (state(net) for net in nets)
    assert histories[1]["loss_scale"] == [2.0 ** 14, 2.0 ** 16]
    assert histories[1]["skipped_steps"] == [0, 0] and "loss_scale" not in histories[0]
    if opt in ("momentum", "adam", "adamw"):
        # all together, but the bias of the convolution before BatchNorm (and the running
        # mean that follows it): its gradient is noise, which Adam turns into steps of lr
        # in any direction at the slightest change
        names = [n for n in plain if not (model == "cnn" and n in ("0.b", "1.running_mean"))]
        every = [np.concatenate([d[n].ravel() for n in names]) for d in (scaled, plain)]
        assert rel_err(*every) < 10 * F32
        return
    for name, want in plain.items():
        assert np.array_equal(scaled[name], want), name
    assert histories[0]["loss"] == histories[1]["loss"]


def test_a_step_whose_gradients_overflow_changes_nothing(device_name, rng):
    """A batch whose scaled gradients overflow float32: the parameters and the optimizer's
    state stay as they were, bit for bit; the scale halves and the skip is counted. The
    next batch trains as usual at the halved scale."""
    net = mlp(device_name, pn.LossScale(2.0 ** 24), second="relu")     # tanh would saturate
    opt = pn.SGD(0.05, 0.9)
    x, y = data(rng, (12,))
    net.fit(x, y, epochs=1, batch_size=32, optimizer=opt)      # momentum not zero
    assert net.optimizer_state.scale_now() == (2.0 ** 24, 0)
    before = state(net)
    net.train_batch(x[:32] * 1e33, y[:32], opt)                 # 2^24 dW = inf
    assert net.optimizer_state.scale_now() == (2.0 ** 23, 1)
    for name, want in state(net).items():
        assert np.array_equal(want, before[name]), name
    net.train_batch(x[:32], y[:32], opt)
    assert net.optimizer_state.scale_now() == (2.0 ** 23, 1)
    after = state(net)
    assert not any(np.array_equal(after[name], before[name]) for name in before)


@pytest.mark.parametrize("opt", OPTIMIZERS)
def test_a_skipped_step_is_as_if_it_had_not_been(device_name, rng, opt):
    """Two epochs of four batches, the third of which overflows (recorded and replayed where
    the device records steps): the same parameters and optimizer state, bit for bit, as two
    epochs of the other three batches (Adam's step count included); two steps skipped."""
    x, y = data(rng, (12,))
    x, y = x[:64], y[:64]
    bad = (np.concatenate([x[:32], x[:16] * 1e33, x[32:48]]),
           np.concatenate([y[:32], y[:16], y[32:48]]))
    nets = []
    for xs, ys in (bad, (np.concatenate([x[:32], x[32:48]]), y[:48])):
        net = mlp(device_name, pn.LossScale(2.0 ** 24), second="relu")
        history = net.fit(np.concatenate([xs, x[48:]]), np.concatenate([ys, y[48:]]),
                          epochs=2, batch_size=16, shuffle=False, optimizer=OPTIMIZERS[opt])
        nets.append(net)
    assert history["skipped_steps"] == [0, 0]
    assert nets[0].history["skipped_steps"] == [1, 1]
    skipped, clean = (state(net) for net in nets)
    for name, want in clean.items():
        assert np.array_equal(skipped[name], want), name


def test_fp16_keeps_small_gradients_only_when_scaled(device_name, rng):
    """A confident softmax layer: the deltas of its wrong classes are about 2e-9, below
    half's smallest subnormal (2^-24), so unscaled fp16 products lose them whole and the
    weights do not move; scaled by 2^16 they are normal halves, and the step is fp32's to
    half's rounding."""
    bk = precision_backend(device_name, "fp16")
    x = rng.standard_normal((64, 12)).astype(np.float32)
    y = np.zeros(64, np.int64)
    w = (0.01 * rng.standard_normal((3, 12))).astype(np.float32)
    b = np.array([20.0, 0.0, 0.0], np.float32)
    moved = {}
    for name, where, scale in (("fp32", device_name, None), ("fp16", bk, None),
                               ("fp16 scaled", bk, "auto")):
        net = pn.Sequential([pn.Dense(3, "softmax")], 12, device=where, loss_scale=scale)
        net.set_weights({"0.w": w.reshape(net.get_weights()["0.w"].shape), "0.b": b})
        net.train_batch(x, y, pn.SGD(1.0))
        moved[name] = net.get_weights()["0.w"].astype(np.float64) - w.reshape(
            net.get_weights()["0.w"].shape)
    assert np.abs(moved["fp32"]).max() > 0
    assert np.all(moved["fp16"] == 0)
    assert rel_err(moved["fp16 scaled"], moved["fp32"]) < 4 * 2.0 ** -11


def test_fp16_scales_by_default_and_says_so(rng):
    """fp16 networks scale unless told not to; others do not unless given a LossScale.
    The history and the summary say what scaling did and costs."""
    assert mlp("cpu", "auto", "fp16").loss_scaling == pn.LossScale()
    for precision in ("fp32", "tf32", "bf16"):
        assert mlp("cpu", "auto", precision).loss_scaling is None
    assert mlp("cpu", None, "fp16").loss_scaling is None
    net = mlp("cpu", "auto", "fp16")
    x, y = data(rng, (12,))
    history = net.fit(x, y, epochs=2, batch_size=32)
    assert len(history["loss_scale"]) == len(history["skipped_steps"]) == 2
    assert "loss scaling" in net.summary()
    params = sum(w.size for w in net.get_weights().values())
    plan = {(b.owner, b.name): b for b in net.memory_plan(32).buffers}
    assert plan["network", "workspace"].shape == (params,)     # every layer's gradient


@pytest.mark.parametrize("setting,said", [
    (pn.LossScale, "power of two"), ("dynamic", "loss_scale must be"), (2.0 ** 10, "must be")])
def test_settings_that_are_not_a_loss_scale_are_refused(setting, said):
    with pytest.raises(InputError, match=said):
        mlp("cpu", setting(3.0) if setting is pn.LossScale else setting)
    with pytest.raises(InputError, match="growth_interval"):
        pn.LossScale(growth_interval=0)


def test_a_scaled_run_resumes_where_it_stopped(tmp_path, rng):
    """The scale, its count of clean steps and the skips are in the checkpoint: the run
    resumed ends bit for bit as the whole one; a checkpoint of a scaled run does not
    resume an unscaled one."""
    x, y = data(rng, (12,))
    settings = dict(batch_size=16, optimizer=pn.SGD(0.05, 0.9))
    scale = pn.LossScale(2.0 ** 20, growth_interval=4)
    whole = mlp("cpu", scale, "fp16")
    history = whole.fit(x * 300, y, epochs=3, **settings)
    assert sum(history["skipped_steps"]) > 0 and history["loss_scale"][-1] < 2.0 ** 20
    path = tmp_path / "run.safetensors"
    mlp("cpu", scale, "fp16").fit(x * 300, y, epochs=2, checkpoint=path, **settings)
    resumed_net = mlp("cpu", scale, "fp16")
    resumed = resumed_net.fit(x * 300, y, epochs=3, resume=path, **settings)
    assert resumed == history | {"seconds": resumed["seconds"]}
    for name, want in whole.get_weights().items():
        assert np.array_equal(resumed_net.get_weights()[name], want), name
    with pytest.raises(InputError, match="loss_scale"):
        mlp("cpu", None, "fp16").fit(x * 300, y, epochs=3, resume=path, **settings)
