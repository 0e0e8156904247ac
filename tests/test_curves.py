"""Training curves (portanet/curves.py): a PNG is written whole, atomically, and bad
histories and destinations are refused with the fix."""
import os
import struct
import sys

import pytest

from portanet import curves
from portanet.errors import InputError, PortanetError

HISTORY = {"loss": [1.2, 0.8, 0.6, 0.5], "accuracy": [0.55, 0.7, 0.78, 0.81],
           "val_loss": [1.3, 0.9, 0.75, 0.74], "val_accuracy": [0.5, 0.66, 0.72, 0.73],
           "lr": [0.01] * 4, "seconds": [1.5] * 4}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(data):
    """(width, height) from a PNG's IHDR chunk, which must come first."""
    assert data[:8] == PNG_SIGNATURE
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13
    return struct.unpack(">II", data[16:24])


@pytest.fixture
def matplotlib():
    return pytest.importorskip("matplotlib", reason="matplotlib is not installed (the plot "
                                                    "extra)")


def leftovers(folder, keep):
    return sorted(set(os.listdir(folder)) - set(keep))


@pytest.mark.parametrize("history", [
    HISTORY,
    {k: v for k, v in HISTORY.items() if not k.startswith("val_")},     # no validation
    {"loss": [0.7], "accuracy": [0.6]},                                  # one epoch
    {"loss": [0.7, 0.5]},                                                # loss alone
])
def test_writes_a_png(matplotlib, tmp_path, history):
    path = tmp_path / "curves.png"
    assert curves.plot(history, path, title="mlp on coordinates") == str(path)
    data = path.read_bytes()
    assert png_size(data) == (curves.SIZE[0] * curves.DPI, curves.SIZE[1] * curves.DPI)
    assert len(data) > 5000                     # axes, lines and text, not a blank image
    assert leftovers(tmp_path, ["curves.png"]) == []      # no temporary file left


def test_validation_changes_the_picture(matplotlib, tmp_path):
    curves.plot(HISTORY, tmp_path / "a.png")
    curves.plot({k: v for k, v in HISTORY.items() if not k.startswith("val_")},
                tmp_path / "b.png")
    assert (tmp_path / "a.png").read_bytes() != (tmp_path / "b.png").read_bytes()


def test_replaces_an_earlier_plot_and_keeps_its_mode(matplotlib, tmp_path):
    path = tmp_path / "curves.png"
    path.write_bytes(b"old")
    os.chmod(path, 0o640)
    curves.plot(HISTORY, str(path))
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    assert os.stat(path).st_mode & 0o777 == 0o640


def test_format_from_the_suffix(matplotlib, tmp_path):
    curves.plot(HISTORY, tmp_path / "curves.svg")
    assert b"<svg" in (tmp_path / "curves.svg").read_bytes()[:1000]
    curves.plot(HISTORY, tmp_path / "curves")   # no suffix: PNG
    assert (tmp_path / "curves").read_bytes()[:8] == PNG_SIGNATURE


@pytest.mark.parametrize("history, match", [
    ({}, "no epochs"),
    ({"loss": [], "accuracy": []}, "no epochs"),
    ({"lr": [0.1], "seconds": [1.0]}, "no epochs"),
    ([0.5, 0.4], "history fit returns"),
    (None, "history fit returns"),
    ({"loss": "0.5"}, "list of per-epoch"),
    ({"loss": [0.5, "x"]}, "not a number"),
    ({"loss": [0.5, 0.4], "val_loss": [0.6]}, "has 1 epochs"),
])
def test_bad_histories(tmp_path, history, match):
    """Refused before matplotlib is needed, so these run without it too."""
    with pytest.raises(InputError, match=match):
        curves.plot(history, tmp_path / "c.png")
    assert leftovers(tmp_path, []) == []


def test_bad_destinations(matplotlib, tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        curves.plot(HISTORY, tmp_path / "missing" / "c.png")
    with pytest.raises(InputError, match="is a folder"):
        curves.plot(HISTORY, tmp_path)
    with pytest.raises(InputError, match=r"\.png, \.svg or \.pdf"):
        curves.plot(HISTORY, tmp_path / "c.docx")
    with pytest.raises(InputError, match="title"):
        curves.plot(HISTORY, tmp_path / "c.png", title=3)
    assert leftovers(tmp_path, []) == []


def test_a_failed_write_leaves_the_earlier_file(matplotlib, tmp_path, monkeypatch):
    path = tmp_path / "curves.png"
    path.write_bytes(b"earlier")
    from matplotlib.figure import Figure

    def fail(self, *args, **kwargs):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(Figure, "savefig", fail)
    with pytest.raises(PortanetError, match="No space left.*unchanged"):
        curves.plot(HISTORY, path)
    assert path.read_bytes() == b"earlier"
    assert leftovers(tmp_path, ["curves.png"]) == []


def test_without_matplotlib_names_the_extra(tmp_path, monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(InputError, match=r"pip install 'portanet\[plot\]'"):
        curves.plot(HISTORY, tmp_path / "c.png")
    assert leftovers(tmp_path, []) == []
