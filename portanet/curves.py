"""Training curves: the loss and accuracy of each epoch, from the history fit returns.

    history = net.fit(x, y, epochs=20, validation_split=0.1)
    portanet.curves.plot(history, "curves.png", title="lenet on fashion-mnist")

Drawn with matplotlib's Agg canvas on a Figure of our own, never through pyplot, so a
plot neither changes the backend of a program that uses matplotlib itself nor keeps
figures alive in pyplot's list. The file is written as every portanet file is
(files.write_atomically): only over a regular file, through a symlink, with an earlier
plot's permissions, atomically, so a failure leaves an earlier plot at `path` whole.
"""
import numbers
import os

from . import files
from .errors import InputError

PANELS = (("loss", "loss"), ("accuracy", "accuracy"))     # (history key, axis label)
SIZE = (10, 4)                                              # inches: two panels side by side
DPI = 100
_WHAT = "the training curves"


def plot(history, path, title=None):
    """Write the training curves of `history` (a dict of per-epoch lists: loss, accuracy,
    and val_loss, val_accuracy when validated, as fit returns) to `path`, whose suffix
    picks the format (.png, .svg, .pdf; .png when it has none). Returns the path."""
    series = _series(history)
    if title is not None and not isinstance(title, str):
        raise InputError(f"plot: title must be text, got {title!r}")
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise InputError(f"plotting training curves needs matplotlib: "
                         f"pip install 'portanet[plot]' ({e})") from e
    path = os.fspath(path)
    fmt = os.path.splitext(path)[1][1:].lower() or "png"
    files.check_destination(path, _WHAT, InputError)           # before any drawing

    fig = Figure(figsize=SIZE, dpi=DPI)
    canvas = FigureCanvasAgg(fig)
    supported = canvas.get_supported_filetypes()
    if fmt not in supported:
        raise InputError(f"plot: cannot write {path}: matplotlib writes "
                         f"{', '.join(sorted(supported))}, not {fmt!r}; end the name with "
                         f".png, .svg or .pdf")
    panels = [(key, label) for key, label in PANELS
              if key in series or "val_" + key in series]
    for i, (key, label) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), i + 1)
        for prefix, what, style in (("", "train", "-o"), ("val_", "validation", "--s")):
            values = series.get(prefix + key)
            if values is not None:
                ax.plot(range(1, len(values) + 1), values, style, markersize=3, label=what)
        ax.set_xlabel("epoch")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend()
        epochs = len(series.get(key) or series["val_" + key])
        if epochs < 12:                         # whole epochs only
            ax.set_xticks(range(1, epochs + 1))
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    files.write_atomically(path, lambda tmp: fig.savefig(tmp, format=fmt), _WHAT)
    return path


def _series(history):
    """{key: [floats]} of the plotted keys in history, checked."""
    if not hasattr(history, "get") or not hasattr(history, "keys"):
        raise InputError(f"plot takes the history fit returns (a dict of per-epoch lists), "
                         f"got {type(history).__name__}")
    found = {}
    for key, _ in PANELS:
        for name in (key, "val_" + key):
            values = history.get(name)
            if values is None:
                continue
            if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
                raise InputError(f"plot: history[{name!r}] must be a list of per-epoch "
                                 f"numbers, got {values!r}")
            values = list(values)
            bad = [v for v in values if not isinstance(v, numbers.Real) or isinstance(v, bool)]
            if bad:
                raise InputError(f"plot: history[{name!r}] holds {bad[0]!r}, not a number")
            if values:
                found[name] = [float(v) for v in values]
    if not found:
        raise InputError(f"plot: the history has no epochs to draw (no numbers under "
                         f"'loss' or 'accuracy'; it has {sorted(history.keys()) or 'nothing'}); "
                         f"plot what fit returned after at least one epoch")
    for key, _ in PANELS:
        train, val = found.get(key), found.get("val_" + key)
        if train and val and len(train) != len(val):
            raise InputError(f"plot: history['val_{key}'] has {len(val)} epochs but "
                             f"history[{key!r}] has {len(train)}")
    return found
