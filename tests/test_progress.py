"""What fit and `portanet train` say while they train (portanet/progress.py): Keras's
verbose (a bar where a person watches, a line per epoch in logs, or nothing), tqdm's bar
with the running loss, and numbers written as a user types them."""
import io
import sys

import numpy as np
import pytest

import portanet as pn
from portanet import progress


class Tty(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self):
        return True


def data(n=96):
    x = np.random.default_rng(0).standard_normal((n, 4)).astype(np.float32)
    return x, (x[:, 0] > 0).astype(np.int64)


def small():
    return pn.mlp((4,), 2, hidden=(8,), device="cpu")


def test_verbose_0_prints_nothing(capsys):
    small().fit(*data(), epochs=2, batch_size=16, verbose=0)
    assert capsys.readouterr() == ("", "")


def test_by_default_a_file_or_pipe_gets_one_line_per_epoch(capsys):
    """pytest's stdout is not a terminal: the lines, no bar, nothing on stderr."""
    history = small().fit(*data(), epochs=3, batch_size=16)
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert [line.split()[1] for line in lines] == ["1/3", "2/3", "3/3"]
    assert lines[-1].startswith("epoch 3/3  loss ") and "accuracy" in lines[-1]
    assert f"loss {history['loss'][-1]:.4f}" in lines[-1]
    assert "\r" not in out and err == ""


def test_a_terminal_gets_a_bar_with_rate_and_running_loss(monkeypatch):
    pytest.importorskip("tqdm")
    tty = Tty()
    monkeypatch.setattr(sys, "stdout", tty)
    monkeypatch.setattr(progress, "READ_EVERY", 0.0)       # the running loss every batch
    monkeypatch.setattr(progress, "DRAW_EVERY", 0.0)       # drawn every batch
    small().fit(*data(), epochs=2, batch_size=16)
    text = tty.getvalue()
    assert "\r" in text and "epoch 1/2" in text and "epoch 2/2" in text
    assert "/6 [" in text and "batch/s" in text
    assert "batch/s, loss " in text and ", accuracy " in text   # the running figures
    lines = [line.rpartition("\r")[2] for line in text.splitlines()]
    assert [line.split()[:2] for line in lines if line.startswith("epoch") and "|" not in line] \
        == [["epoch", "1/2"], ["epoch", "2/2"]]     # each bar's place taken by its line


def test_verbose_2_on_a_terminal_is_the_lines(monkeypatch):
    tty = Tty()
    monkeypatch.setattr(sys, "stdout", tty)
    small().fit(*data(), epochs=2, batch_size=16, verbose=2)
    assert "\r" not in tty.getvalue() and len(tty.getvalue().splitlines()) == 2


def test_without_tqdm_the_bar_is_the_lines(monkeypatch, capsys):
    monkeypatch.setattr(progress, "_tqdm", lambda: None)
    small().fit(*data(), epochs=2, batch_size=16, verbose=1)
    assert [line.split()[1] for line in capsys.readouterr().out.splitlines()] == ["1/2", "2/2"]


def test_a_wrong_verbose_is_refused_before_training():
    net = small()
    before = net.get_weights()
    with pytest.raises(pn.InputError, match="verbose must be 'auto', 0"):
        net.fit(*data(), verbose="yes")
    assert all(np.array_equal(before[k], v) for k, v in net.get_weights().items())


def test_progress_and_on_epoch_hooks_run_whatever_verbose_says():
    done, ends = [], []
    small().fit(*data(), epochs=2, batch_size=32, verbose=0,
                progress=lambda i, n: done.append((i, n)),
                on_epoch=lambda epoch, logs: ends.append(epoch))
    assert done == [(1, 3), (2, 3), (3, 3)] * 2 and ends == [0, 1]


def test_the_command_lines_bar_is_cleared_for_each_epochs_line():
    pytest.importorskip("tqdm")
    tty, lines = Tty(), []
    shown = progress.Progress(bar=True, stream=tty, write=lines.append)
    shown.begin(2, 4, lambda samples: (0.5, 0.75))
    shown.start(0)
    for i in range(4):
        shown.batch(16 * (i + 1))
    shown.end(0, {"loss": 0.25, "accuracy": 0.875, "lr": 0.02, "seconds": 1.5})
    assert tty.getvalue().startswith("\repoch 1/2:") and tty.getvalue().endswith("\r")
    assert lines == ["epoch 1/2  loss 0.2500  accuracy 0.8750  lr 0.02  1.50 s"]


@pytest.mark.parametrize("x, typed", [(1e29, "1e29"), (0.002, "0.002"), (2.5e-7, "2.5e-7"),
                                      (0.02, "0.02"), (10000.0, "10000")])
def test_numbers_as_a_user_types_them(x, typed):
    assert progress.number(x) == typed
