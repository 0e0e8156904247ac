"""What a network says about itself: print(net) and summary() as Keras's model.summary(),
and the memory plan of `portanet train --plan`: layers numbered, no description cut, every
column explained, the device's room said the same way everywhere."""
import re

import numpy as np
import pytest

import portanet as pn
from portanet.memory import WIDTH


def joined(text):
    """text with its wrapped lines joined: whitespace runs as one space."""
    return " ".join(text.split())


def test_print_gives_the_summary():
    net = pn.models.lenet(device="cpu")
    assert repr(net) == str(net) == net.summary()
    assert "object at 0x" not in repr(net)
    assert repr(net).startswith("Sequential on cpu (float32, fp32): input (1, 28, 28)")


def test_a_freed_networks_repr_is_one_line():
    net = pn.mlp((4,), 2, hidden=(3,), device="cpu")
    net.free()
    assert repr(net) == "<Sequential of 2 layers on cpu, freed>"


def test_the_summary_numbers_every_layer_and_cuts_no_name():
    net = pn.models.resnet(device="cpu")
    text = net.summary()
    rows = [line.split()[0] for line in text.splitlines()
            if re.match(r"  \d+(\.\w+)*\s", line)]
    assert rows == [path for path, _ in net.walk()]
    assert all(len(line) <= WIDTH for line in text.splitlines())
    for path, layer in net.walk():
        if not layer.sublayers():           # the description's every argument is there
            assert all(part in text for part in repr(layer).split(", ")), repr(layer)
    assert "  4      Residual(layers 4.0 to 4.3, added to its input through " in text
    assert "696,778 parameters" in text


def test_the_plan_numbers_layers_and_cuts_no_name():
    net = pn.models.resnet(device="cpu")
    text = str(net.memory_plan(8))
    flat = joined(text)
    for path, layer in net.walk():
        if not layer.sublayers():
            assert f"{path} {repr(layer)} {path} " in flat, (path, repr(layer))
    # alike layers (2.0 and 2.2) each with their own buffers
    assert re.search(r"^  2\.2 +flat +parameters +9248 ", text, re.M)
    assert re.search(r"^  4\.proj +_z +batch ", text, re.M)
    assert all(len(line) <= WIDTH for line in text.splitlines())


def test_the_plan_explains_every_column():
    text = joined(str(pn.models.lenet(device="cpu").memory_plan(8)))
    header = "layer buffer kind elements type bytes"
    assert header in text
    for column in ("layer:", "buffer: flat =", "kind:", "elements, type", "available:"):
        assert column in text, column


def test_the_room_is_the_same_figure_and_words_everywhere(monkeypatch):
    net = pn.mlp((4,), 2, hidden=(3,), device="cpu")
    monkeypatch.setattr(net.backend, "memory_info", lambda: (10 * 2**30, 16 * 2**30))
    said = "10.0 GiB available on cpu"
    meaning = "the host memory that can be allocated without swapping"
    assert said in net.summary() and said in str(net.memory_plan(4))
    assert meaning in joined(net.summary()) and meaning in joined(str(net.memory_plan(4)))
    monkeypatch.setattr(net.backend, "memory_info", lambda: (0, 16 * 2**30))
    with pytest.raises(pn.OutOfMemoryError) as refused:
        net.fit(np.zeros((4, 4), np.float32), np.zeros(4, np.int64), verbose=0)
    assert "available on cpu (" + meaning in str(refused.value)
