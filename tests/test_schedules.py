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
