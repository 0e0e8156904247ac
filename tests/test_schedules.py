"""Learning-rate schedules: the same objects for fit and the CLI's --schedule text."""
import math

import pytest

import portanet as pn
from portanet import schedules


def rates(schedule, epochs=6, lr=0.1):
    return [schedule(e, lr) for e in range(epochs)]


def test_each_schedule_gives_its_rates():
    assert rates(schedules.Constant()) == [0.1] * 6
    assert rates(schedules.Exponential(0.5)) == pytest.approx([0.1 * 0.5 ** e for e in range(6)])
    assert rates(schedules.Step(2, 0.1)) == pytest.approx([0.1, 0.1, 0.01, 0.01, 0.001, 0.001])
    cosine = rates(schedules.Cosine(4, min_lr=0.02))
    assert cosine[0] == pytest.approx(0.1) and cosine[4] == cosine[5] == pytest.approx(0.02)
    assert cosine[2] == pytest.approx(0.02 + 0.08 * (1 + math.cos(math.pi / 2)) / 2)
    warm = rates(schedules.Warmup(2, schedules.Exponential(0.5)))
    assert warm == pytest.approx([0.05, 0.1, 0.1, 0.05, 0.025, 0.0125])


def test_text_builds_the_same_objects():
    assert schedules.parse("warmup(2, cosine(30))") == schedules.Warmup(2, schedules.Cosine(30))
    assert schedules.parse("step(10, gamma=0.5)") == schedules.Step(10, 0.5)
    assert schedules.parse("constant") == schedules.get(None) == schedules.Constant()


@pytest.mark.parametrize("text, message", [
    ("exponential(2)", r"gamma must be a number in \(0, 1\]"),
    ("step(0)", "every must be a whole number >= 1"),
    ("cosine(True)", "cannot read the schedule"),
    ("exponential(0.6", "cannot read the schedule"),
    ("__import__('os').system('true')", "cannot read the schedule"),
    ("cosine(10, maximum=3)", "unexpected keyword"),
])
def test_bad_schedules_are_input_errors(text, message):
    with pytest.raises(pn.InputError, match=message):
        schedules.parse(text)


# -- schedules by steps (fit's schedule_unit="step") -------------------------------------


def _mlp(device="cpu", loss_scale=None):
    return pn.Sequential([pn.Dense(16, "relu"), pn.Dense(3, "softmax")], 6, device=device,
                         seed=3, loss_scale=loss_scale)


def _data(n=40):
    import numpy as np
    x = np.random.default_rng(5).standard_normal((n, 6)).astype(np.float32)
    return x, (x[:, :3] * [1, -1, 2]).argmax(1)


@pytest.mark.parametrize("scaled", [False, True])
@pytest.mark.parametrize("optimizer", [pn.AdamW(0.02, weight_decay=0.1), pn.Adam(0.02)])
def test_a_schedule_by_steps_sets_each_step_s_rate(device_name, optimizer, scaled):
    """fit with schedule_unit="step" (its steps recorded once, each rate sent with its
    step) trains as a step at a time at each step's rate does, bit for bit: nanoGPT's
    warmup then cosine, over three epochs of four batches; loss-scaled too, where the
    device forms the step numbers from the rate it is sent."""
    import numpy as np
    x, y = _data()
    schedule = schedules.Warmup(3, schedules.Cosine(9, min_lr=1e-3))
    scale = pn.LossScale(2.0 ** 10) if scaled else None
    net = _mlp(device_name, scale)
    history = net.fit(x, y, epochs=3, batch_size=10, optimizer=optimizer, schedule=schedule,
                      schedule_unit="step", shuffle=False, verbose=0)
    step = _mlp(device_name, scale)
    for s in range(12):
        i = s % 4 * 10
        step.train_batch(x[i:i + 10], y[i:i + 10],
                         optimizer=type(optimizer)(**{**vars(optimizer),
                                                      "lr": schedule(s, optimizer.lr)}))
    ours, theirs = net.get_weights(), step.get_weights()
    assert all(np.array_equal(ours[k], theirs[k]) for k in ours)
    assert history["lr"] == [schedule(s, optimizer.lr) for s in (3, 7, 11)]
    assert schedule(0, optimizer.lr) == pytest.approx(optimizer.lr / 3)


def test_a_schedule_by_steps_resumes_and_keeps_its_unit(tmp_path):
    import numpy as np
    x, y = _data()
    kw = dict(batch_size=10, optimizer=pn.AdamW(0.02), schedule="warmup(3, cosine(9))",
              shuffle=False, verbose=0)
    whole = _mlp()
    whole.fit(x, y, epochs=3, schedule_unit="step", **kw)
    half = _mlp()
    half.fit(x, y, epochs=1, schedule_unit="step", checkpoint=tmp_path / "run.ckpt", **kw)
    again = _mlp()
    again.fit(x, y, epochs=3, schedule_unit="step", resume=tmp_path / "run.ckpt", **kw)
    assert all(np.array_equal(a, b) for a, b in zip(again.get_weights().values(),
                                                     whole.get_weights().values()))
    with pytest.raises(pn.InputError, match="schedule_unit"):
        _mlp().fit(x, y, epochs=3, resume=tmp_path / "run.ckpt", **kw)


def test_a_schedule_by_steps_needs_the_rate_on_the_device():
    x, y = _data()
    with pytest.raises(pn.InputError, match="Adam, AdamW"):
        _mlp().fit(x, y, optimizer=pn.SGD(0.1, 0.9), schedule_unit="step", verbose=0)
    with pytest.raises(pn.InputError, match="schedule_unit must be 'epoch' or 'step'"):
        _mlp().fit(x, y, schedule_unit="batch", verbose=0)
