"""What a training says while it runs, as Keras's `verbose`: a progress bar where a person
watches (a terminal, a notebook), one line per epoch where the output goes to a file or a
log, or nothing.

    verbose="auto"  a bar if the output is a terminal or a notebook, else a line per epoch
    verbose=0       nothing
    verbose=1       a bar while an epoch runs: batches done, rate, time left, the running
                    loss and accuracy; when the epoch ends, its line in the bar's place
    verbose=2       one line per epoch: loss, accuracy, validation, learning rate, seconds

The bar is tqdm's (the extra `progress`: pip install 'portanet[progress]'); where tqdm is
not installed, a line per epoch instead. In a distributed job only rank 0 reports
(training.py asks distributed.leader()).
"""
import logging
import sys
import time

from .errors import InputError

log = logging.getLogger("portanet")

# seconds between two reads of the running loss: a read waits for the device's queue, so
# it is not made after every batch
READ_EVERY = 1.0
DRAW_EVERY = 0.2        # seconds between two draws of the bar (tqdm's mininterval)


def watched(stream):
    """Whether a person reads `stream` as it is written: a terminal, or the output of a
    Jupyter (IPython kernel) cell."""
    try:
        if stream.isatty():
            return True
    except (AttributeError, ValueError):        # no isatty, or closed
        return False
    return _in_notebook()


def _in_notebook():
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython and hasattr(ipython, "get_ipython") else None
    return shell is not None and hasattr(shell, "kernel")


def _tqdm():
    """tqdm's bar class (its notebook widget in Jupyter), or None where tqdm is missing."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm


def mode(verbose, stream):
    """0, 1 or 2 for fit's verbose (0, 1, 2, or "auto": 1 where `stream` is watched, else
    2); an InputError for anything else."""
    if verbose == "auto":
        return 1 if watched(stream) else 2
    if isinstance(verbose, bool) or verbose not in (0, 1, 2):
        raise InputError(f"verbose must be 'auto', 0 (silent), 1 (a progress bar) or 2 "
                         f"(one line per epoch), got {verbose!r}")
    return verbose


def checked(verbose):
    """verbose as fit takes it (0, 1, 2, "auto" or a Progress), checked: an InputError
    names what is wrong before any training."""
    if not isinstance(verbose, Progress):
        mode(verbose, sys.stdout)
    return verbose


def for_fit(verbose, stream=None):
    """The Progress that reports fit's epochs for `verbose` (see the module's docstring) on
    stream (default: sys.stdout when the fit starts), or None for 0. A Progress given as
    verbose is used as it is (the command line's: the bar on stderr, lines through click)."""
    if isinstance(verbose, Progress):
        return verbose
    stream = stream or sys.stdout
    chosen = mode(verbose, stream)
    if chosen == 0:
        return None
    bar = chosen == 1
    if bar and _tqdm() is None:
        if verbose == 1:
            log.warning("verbose=1 draws a progress bar with tqdm, which is not installed "
                        "(pip install 'portanet[progress]'): one line per epoch instead")
        bar = False
    return Progress(bar=bar, stream=stream)


def metrics_text(logs):
    """An epoch's figures as a person reads them: 'loss 0.4123  accuracy 0.8512  val_loss
    ...  lr 0.02  3.21 s' (with what loss scaling did, where it scales)."""
    parts = [f"loss {logs['loss']:.4f}", f"accuracy {logs['accuracy']:.4f}"]
    parts += [f"{k} {logs[k]:.4f}" for k in ("val_loss", "val_accuracy") if k in logs]
    if "lr" in logs:
        parts.append(f"lr {logs['lr']:.3g}")
    if "seconds" in logs:
        parts.append(f"{logs['seconds']:.2f} s")
    if "loss_scale" in logs:
        parts.append(f"loss scale {logs['loss_scale']:g} ({logs['skipped_steps']} steps "
                     f"skipped)")
    return "  ".join(parts)


def epoch_line(epoch, epochs, logs):
    """'epoch 3/5  loss 0.4123  accuracy 0.8512  lr 0.02  3.21 s' (epoch counts from 0)."""
    return f"epoch {epoch + 1}/{epochs}  {metrics_text(logs)}"


class Progress:
    """fit's report of its epochs: `begin` once, then for each epoch `start`, `batch` after
    each batch (a bar only: the one-line form ignores batches), `end` with the epoch's
    logs; `close` when fit ends, however it ends.

    bar: a tqdm bar on `stream` while an epoch runs, whose postfix shows the running loss
    and accuracy (read at most every READ_EVERY seconds); when the epoch ends the bar is
    cleared and the epoch's line written in its place, so that what stays is a line per
    epoch, never cut to the terminal's width. Lines go through `write` (default: print to
    stream; the command line's go to stdout while its bar is on stderr)."""

    def __init__(self, bar=True, stream=None, write=None):
        self.stream = stream or sys.stdout
        self.write = write or self._print      # no closure over self: no reference cycle
        self.tqdm = _tqdm() if bar else None
        self.bar = None
        self.epochs = self.batches = 0
        self._read = None
        self._next_read = 0.0

    @property
    def draws_bar(self):
        return self.tqdm is not None

    def begin(self, epochs, batches, read):
        """epochs, batches an epoch, and read(samples) -> (mean loss, accuracy) of the
        epoch's first `samples` (one wait for the device)."""
        self.epochs, self.batches, self._read = epochs, batches, read

    def start(self, epoch):
        if self.tqdm is None:
            return
        self.bar = self.tqdm(total=self.batches, desc=f"epoch {epoch + 1}/{self.epochs}",
                             unit="batch", file=self.stream, leave=False,
                             dynamic_ncols=True, mininterval=DRAW_EVERY)
        self._next_read = time.monotonic() + READ_EVERY

    def batch(self, samples):
        """One more batch done; samples: how many of the epoch's this process has trained
        on so far (what the running loss is the mean over)."""
        bar = self.bar
        bar.update(1)
        now = time.monotonic()
        if now >= self._next_read:
            loss, accuracy = self._read(samples)
            bar.set_postfix_str(f"loss {loss:.4f}, accuracy {accuracy:.4f}", refresh=False)
            self._next_read = now + READ_EVERY

    def end(self, epoch, logs):
        bar, self.bar = self.bar, None
        if bar is not None:
            bar.close()                 # cleared: the epoch's line takes its place
        self.write(epoch_line(epoch, self.epochs, logs))

    def _print(self, line):
        print(line, file=self.stream, flush=True)

    def close(self):
        """End a bar left open by an epoch that did not finish (an error, a stop), and let
        go of the network (read holds its plan)."""
        bar, self.bar, self._read = self.bar, None, None
        if bar is not None:
            bar.close()


def number(x):
    """x as a person would type it: 0.002, 1e29, 2.5e-7 (not 1e+29 or 2.5e-07)."""
    text = f"{x:g}"
    mantissa, e, exponent = text.partition("e")
    if not e:
        return text
    sign = "-" if exponent.startswith("-") else ""
    return f"{mantissa}e{sign}{exponent.lstrip('+-').lstrip('0') or '0'}"
