"""Checkpoints and resume: a run interrupted (between epochs, or in the middle of one)
and resumed from its last checkpoint ends bit for bit as the uninterrupted run, with the
optimizer's state, the schedule's position, the shuffling generator and Dropout's masks
carried over; a checkpoint of another run is refused with what differs."""
import numpy as np
import pytest

import portanet as pn

DEVICES = ["cpu", "opencl:pocl"]


def network(device, precision=None, loss_scale="auto"):
    return pn.Sequential([pn.Conv2D(4, 3, padding=1), pn.BatchNorm("relu"),
                          pn.Residual([pn.Conv2D(4, 3, padding=1), pn.BatchNorm()], "relu"),
                          pn.MaxPool2D(2), pn.Flatten(), pn.Dropout(0.3, seed=5),
                          pn.Dense(3, "softmax")], (1, 8, 8), device=device, seed=3,
                         precision=precision, loss_scale=loss_scale)


def data():
    rng = np.random.default_rng(11)
    return rng.standard_normal((50, 1, 8, 8)).astype(np.float32), rng.integers(0, 3, 50)


SETTINGS = dict(batch_size=8, optimizer=pn.Adam(0.01), schedule="warmup(1, cosine(4))",
                validation_split=0.2)


class Interrupt(Exception):
    pass


@pytest.fixture(params=DEVICES)
def device(request):
    try:
        pn.device(request.param)
    except pn.DeviceError as e:
        pytest.skip(str(e))
    return request.param


def test_resumed_run_is_bit_identical(device, tmp_path):
    x, y = data()
    whole = network(device)
    history = whole.fit(x, y, epochs=5, **SETTINGS)
    path = tmp_path / "run.safetensors"

    first = network(device)
    first.fit(x, y, epochs=2, checkpoint=path, **SETTINGS)      # stopped after epoch 2
    second = network(device)

    def stop(done, total):                                     # killed in epoch 4's middle
        if len(second.history["loss"]) == 3 and done == 3:
            raise Interrupt
    with pytest.raises(Interrupt):
        second.fit(x, y, epochs=5, checkpoint=path, resume=path, progress=stop, **SETTINGS)
    third = network(device)
    resumed = third.fit(x, y, epochs=5, checkpoint=path, resume=path, **SETTINGS)

    for name, want in whole.get_weights().items():
        assert np.array_equal(third.get_weights()[name], want), name
    for k in ("loss", "accuracy", "lr", "val_loss", "val_accuracy"):
        assert resumed[k] == history[k], k
    assert third.optimizer_state.t == whole.optimizer_state.t == 5 * 5
    for (_, a), (_, b) in zip(whole.optimizer_state.tensors().items(),
                              third.optimizer_state.tensors().items()):
        assert np.array_equal(whole.backend.download(a), third.backend.download(b))
    loaded = pn.load(path, device=device)                        # a checkpoint is a model file
    assert np.array_equal(loaded.predict(x), whole.predict(x))


def test_resume_refuses_other_settings_and_files(tmp_path):
    x, y = data()
    path = tmp_path / "run.safetensors"
    network("cpu").fit(x, y, epochs=1, checkpoint=path, **SETTINGS)
    with pytest.raises(pn.InputError, match=r"batch_size: 8 in the file, 16 now"):
        network("cpu").fit(x, y, epochs=3, resume=path, **dict(SETTINGS, batch_size=16))
    with pytest.raises(pn.InputError, match="optimizer"):
        network("cpu").fit(x, y, epochs=3, resume=path, **dict(SETTINGS, optimizer=pn.Adam()))
    fresh = network("cpu")
    before = fresh.get_weights()
    with pytest.raises(pn.InputError, match="holds 1 epochs already"):
        fresh.fit(x, y, epochs=1, resume=path, **SETTINGS)
    after = fresh.get_weights()                 # a refused resume left the network alone
    assert all(np.array_equal(before[k], after[k]) for k in before)
    with pytest.raises(pn.InputError, match=r"precision: 'fp32' in the file, 'bf16' now.*"
                                            r"make it in fp32"):
        network("cpu", "bf16").fit(x, y, epochs=3, resume=path, **SETTINGS)
    plain = tmp_path / "model.safetensors"
    network("cpu").save(plain)
    with pytest.raises(pn.ModelFileError, match="no training state"):
        network("cpu").fit(x, y, epochs=2, resume=plain, **SETTINGS)
    other = pn.Sequential([pn.Flatten(), pn.Dense(3, "softmax")], (1, 8, 8), device="cpu")
    with pytest.raises(pn.ModelFileError, match="different architecture"):
        other.fit(x, y, epochs=2, resume=path, **SETTINGS)


@pytest.mark.parametrize("trained,now,scale", [("bf16", "fp32", "auto"), ("fp32", "tf32", "auto"),
                                               ("fp16", "bf16", "auto"),
                                               ("fp16", "bf16", "the same")])
def test_resume_refuses_another_precision(tmp_path, trained, now, scale):
    """A checkpoint's precision is one of its settings: resumed in another, the run could
    not end where the uninterrupted one would. The error names the precision first, even
    where the loss scale differs too (fp16's), and says how to make the network."""
    x, y = data()
    path = tmp_path / "run.safetensors"
    network("cpu", trained).fit(x, y, epochs=1, checkpoint=path, **SETTINGS)
    fresh = network("cpu", now, pn.LossScale() if scale == "the same" else "auto")
    before = fresh.get_weights()
    with pytest.raises(pn.InputError, match=rf"precision: '{trained}' in the file, '{now}' "
                                            rf"now.*make it in {trained} \(precision="):
        fresh.fit(x, y, epochs=3, resume=path, **SETTINGS)
    after = fresh.get_weights()
    assert all(np.array_equal(before[k], after[k]) for k in before)
    network("cpu", trained).fit(x, y, epochs=2, resume=path, **SETTINGS)   # its own: resumes
