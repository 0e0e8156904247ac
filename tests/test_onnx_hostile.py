"""ONNX files as an attacker or a damaged disk makes them: external data outside the
model's folder, non-finite and impossible weights, tiny files that ask for huge arrays,
files that are not files, and graphs nested deeper than any network. Each is refused with
an error naming the file, the node or tensor, and what to do; none reads what it must not,
allocates more than the file could justify, hangs or overflows the stack."""
import contextlib
import os
import resource
import sys
import threading
import tracemalloc

import numpy as np
import pytest

import portanet as pn
from portanet import layers, onnx_export, onnx_file, onnx_graph, onnx_import
from portanet.errors import InputError, ModelFileError

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

n = helper.make_node


def _model(nodes, inits, in_shape, out, opset=17, tensors=()):
    """A ModelProto of one input "x" (N, *in_shape) and the output `out`; inits are
    {name: array}, tensors ready-made TensorProtos (external data)."""
    graph = helper.make_graph(
        nodes, "hostile",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", *in_shape])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, ["N", None])],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()] + list(tensors))
    return onnx_export.make_model(graph, opset)


def _gemm(w, b, **attrs):
    return _model([n("Gemm", ["x", "w", "b"], ["out"], name="fc", transB=1, **attrs)],
                  {"w": w, "b": b}, (w.shape[1],), "out")


def _finishes(call, seconds=10):
    """The exception call() raised (None if none) when it returns within `seconds`;
    fails the test if it is still running then (a read that blocks)."""
    done = {}

    def run():
        try:
            call()
        except BaseException as e:          # noqa: BLE001 - handed to the test
            done["error"] = e
        done["over"] = True
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    return thread, done


@contextlib.contextmanager
def _memory_cap(extra=1 << 30):
    """Address space limited to what the process maps now plus `extra` bytes while in the
    block: a reader that makes an array as large as a file declares fails at once with
    MemoryError instead of taking the machine's memory. (Linux; elsewhere no limit.)"""
    if not os.path.exists("/proc/self/statm"):
        yield
        return
    with open("/proc/self/statm") as f:
        mapped = int(f.read().split()[0]) * resource.getpagesize()
    old = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (mapped + extra, old[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, old)


@contextlib.contextmanager
def _peak_allocation():
    """{"peak": bytes} the block allocated at most (NumPy's arrays included)."""
    out = {}
    tracemalloc.start()
    try:
        yield out
    finally:
        out["peak"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()


# -- external data -----------------------------------------------------------------------


W = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
B = np.array([0.5, -0.5, 1.0], np.float32)


def _external(name, array, location, offset=None, length=None):
    """A TensorProto of `array` whose bytes are said to be in the file `location`."""
    t = numpy_helper.from_array(array, name)
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", offset), ("length", length)):
        if value is not None:
            entry = t.external_data.add()
            entry.key, entry.value = key, str(value)
    return t


def _external_model(folder, location, offset=None, length=None, more=()):
    """folder/model.onnx: a Gemm whose weight w (3 x 4 float32) is external data at
    `location`; `more`: other external tensors (not used by a node)."""
    folder.mkdir(exist_ok=True)
    model = _model([n("Gemm", ["x", "w", "b"], ["out"], name="fc", transB=1)], {"b": B},
                   (4,), "out", tensors=[_external("w", W, location, offset, length), *more])
    path = folder / "model.onnx"
    path.write_bytes(model.SerializeToString())
    return path


@pytest.fixture
def permissive_onnx(monkeypatch):
    """onnx's loader of external data as onnx 1.14 and 1.15 had it (the versions portanet
    accepts): the location joined to the model's folder and read, wherever it leads.
    portanet must refuse what lies outside the folder itself."""
    def load(model, base_dir):
        for t in model.graph.initializer:
            if t.data_location != TensorProto.EXTERNAL:
                continue
            info = {e.key: e.value for e in t.external_data}
            with open(os.path.join(base_dir, info["location"]), "rb") as f:
                f.seek(int(info.get("offset", 0)))
                t.raw_data = f.read(int(info["length"])) if "length" in info else f.read()
            t.data_location = TensorProto.DEFAULT
            del t.external_data[:]
    monkeypatch.setattr(onnx, "load_external_data_for_model", load)
    monkeypatch.setattr(onnx.external_data_helper, "load_external_data_for_model", load)


@pytest.fixture
def secret(tmp_path):
    """A file outside the model's folder (tmp_path/model): 12 float32 a reader must not
    take as weights."""
    path = tmp_path / "secret.bin"
    path.write_bytes(np.full(12, 1234.5, np.float32).tobytes())
    return path


def test_external_data_inside_the_folder_is_read(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "weights.bin").write_bytes(b"\0" * 16 + W.tobytes() + b"\0" * 8)
    (folder / "sub").mkdir()
    (folder / "sub" / "w.bin").write_bytes(W.tobytes())
    os.symlink("weights.bin", folder / "link.bin")         # a link that stays inside
    x = np.eye(4, dtype=np.float32)
    for location, offset, length in (("weights.bin", 16, 48), ("sub/w.bin", None, None),
                                     ("link.bin", 16, 48), ("./sub/../weights.bin", 16, 48)):
        net = pn.from_onnx(_external_model(folder, location, offset, length), device="cpu")
        assert np.allclose(net.predict(x), x @ W.T + B), location


@pytest.mark.parametrize("where", ["symlink", "dotdot", "absolute", "folder link"])
def test_external_data_outside_the_folder_is_refused(tmp_path, secret, permissive_onnx,
                                                     where):
    folder = tmp_path / "model"
    folder.mkdir()
    if where == "symlink":
        os.symlink(secret, folder / "w.bin")
        location = "w.bin"
    elif where == "dotdot":
        location = "../secret.bin"
    elif where == "absolute":
        location = str(secret)
    else:                                        # a folder inside that is a link outside
        os.symlink(tmp_path, folder / "data")
        location = "data/secret.bin"
    path = _external_model(folder, location)
    with pytest.raises(ModelFileError, match=r"model\.onnx.*'w'.*outside the model's "
                                             r"folder"):
        pn.from_onnx(path, device="cpu")


def test_external_data_that_is_not_a_regular_file_is_refused(tmp_path, permissive_onnx):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "dir.bin").mkdir()
    with pytest.raises(ModelFileError, match="'w'.*dir.bin.*not a regular file"):
        pn.from_onnx(_external_model(folder, "dir.bin"), device="cpu")
    os.mkfifo(folder / "pipe.bin")
    path = _external_model(folder, "pipe.bin")
    thread, done = _finishes(lambda: pn.from_onnx(path, device="cpu"))
    if not done:                    # a reader blocked on the pipe: let it go, then fail
        fd = os.open(folder / "pipe.bin", os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        thread.join(10)
        pytest.fail("from_onnx blocked on external data that is a FIFO")
    assert isinstance(done.get("error"), ModelFileError)
    assert "not a regular file" in str(done["error"])


@pytest.mark.parametrize("offset, length, why", [
    (0, 100, "past the end"),                # the file holds 48 bytes
    (40, 48, "past the end"),
    (0, 44, "3 x 4 float32 take 48 bytes"),  # within the file, but not the tensor's size
    (-4, 48, "offset"),
    (None, None, "3 x 4 float32 take 48 bytes"),     # the whole file: 52 bytes
])
def test_external_data_of_the_wrong_extent_is_refused(tmp_path, offset, length, why,
                                                       permissive_onnx):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "w.bin").write_bytes(W.tobytes() + b"\0" * 4)
    with pytest.raises(ModelFileError, match=f"'w'.*{why}"):
        pn.from_onnx(_external_model(folder, "w.bin", offset, length), device="cpu")


def test_external_tensors_may_not_share_bytes(tmp_path, permissive_onnx):
    # otherwise one file of a few bytes on disk could be read again and again, as large
    # a model as the graph likes
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "w.bin").write_bytes(W.tobytes())
    again = _external("w_again", W, "w.bin", 0, 48)
    with pytest.raises(ModelFileError, match="'w_again'.*w.bin.*same bytes as 'w'"):
        pn.from_onnx(_external_model(folder, "w.bin", 0, 48, more=[again]), device="cpu")


def test_a_model_in_memory_with_external_data_is_refused(tmp_path, secret, monkeypatch):
    # without the model's path there is no folder to read from: nothing is read from the
    # working directory
    monkeypatch.chdir(tmp_path)
    model = _model([n("Gemm", ["x", "w", "b"], ["out"], name="fc", transB=1)], {"b": B},
                   (4,), "out", tensors=[_external("w", W, "secret.bin", 0, 48)])
    with pytest.raises(ModelFileError, match="'w'.*external.*give the model's path"):
        pn.from_onnx(model, device="cpu")


# -- non-finite and impossible values ----------------------------------------------------


def _bn(**attrs):
    var = attrs.pop("var", np.ones(3, np.float32))
    return _model([n("BatchNormalization", ["x", "g", "b", "m", "v"], ["out"], name="bn",
                     **attrs)],
                  {"g": np.ones(3, np.float32), "b": np.zeros(3, np.float32),
                   "m": np.zeros(3, np.float32), "v": var}, (3,), "out")


def _nan_at(shape, index, value=np.nan):
    w = np.ones(shape, np.float32)
    w[index] = value
    return w


@pytest.mark.parametrize("make, match", [
    (lambda: _gemm(_nan_at((3, 4), (1, 2)), B), r"'fc' \(Gemm\).*'w'.*NaN or inf"),
    (lambda: _gemm(W, _nan_at(3, 0, np.inf)), r"'fc' \(Gemm\).*'b'.*NaN or inf"),
    (lambda: _gemm(W, B, alpha=np.inf), r"'fc' \(Gemm\).*alpha inf"),
    (lambda: _gemm(W, B, beta=np.nan), r"'fc' \(Gemm\).*beta nan"),
    (lambda: _gemm(W * 1e30, B, alpha=1e30), r"'fc' \(Gemm\).*NaN or inf"),   # overflows
    (lambda: _bn(var=np.array([1, -1, 1], np.float32)),
     r"'bn' \(BatchNormalization\).*'v'.*negative"),
    (lambda: _bn(var=_nan_at(3, 2)), r"'bn' \(BatchNormalization\).*'v'.*NaN or inf"),
    (lambda: _bn(epsilon=np.inf), r"'bn' \(BatchNormalization\).*epsilon inf"),
    (lambda: _bn(epsilon=-1e-5), r"'bn' \(BatchNormalization\).*epsilon -1e-05"),
    (lambda: _bn(momentum=np.nan), r"'bn' \(BatchNormalization\).*momentum nan"),
    (lambda: _model([n("Dropout", ["x", "r"], ["out"], name="drop")],
                    {"r": np.array(np.nan, np.float32)}, (3,), "out"),
     r"'drop' \(Dropout\).*ratio nan"),
    (lambda: _model([n("Div", ["w", "zero"], ["w0"], name="scale"),
                     n("Gemm", ["x", "w0", "b"], ["out"], name="fc", transB=1)],
                    {"w": W, "zero": np.float32(0), "b": B}, (4,), "out"),
     r"'fc' \(Gemm\).*'w0'.*NaN or inf"),
])
def test_non_finite_and_impossible_values_are_refused_naming_the_node(make, match):
    with pytest.raises(ModelFileError, match=match):
        pn.from_onnx(make(), device="cpu")


def test_values_onnx_allows_but_portanet_does_not_are_unsupported():
    # a legal ONNX epsilon that portanet's BatchNorm does not take: unsupported, not damaged
    with pytest.raises(InputError, match=r"'bn' \(BatchNormalization\).*epsilon 2.*"
                                         r"BatchNorm: eps"):
        pn.from_onnx(_bn(epsilon=2.0), device="cpu")


# -- sizes: every one bounded before an array is made ------------------------------------


def test_files_that_are_not_regular_files_are_refused(tmp_path):
    with _memory_cap():             # a reader that takes /dev/zero whole fails at once
        with pytest.raises(ModelFileError, match="/dev/zero is not a regular file"):
            pn.from_onnx("/dev/zero")
    with pytest.raises(ModelFileError, match="is a folder"):
        pn.from_onnx(tmp_path)
    fifo = tmp_path / "model.onnx"
    os.mkfifo(fifo)
    thread, done = _finishes(lambda: pn.from_onnx(fifo))
    if not done:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(10)
        pytest.fail("from_onnx blocked on a FIFO")
    assert isinstance(done.get("error"), ModelFileError)
    assert "model.onnx is not a regular file" in str(done["error"])


def test_a_file_larger_than_protobuf_allows_is_refused_unread(tmp_path):
    big = tmp_path / "big.onnx"
    with open(big, "wb") as f:
        f.truncate(3 << 30)             # sparse: 3 GiB that take no disk
    with _memory_cap(), _peak_allocation() as used:
        with pytest.raises(ModelFileError, match=r"big\.onnx.*3\.0 GiB.*2 GiB"):
            pn.from_onnx(big)
    assert used["peak"] < 1 << 20


def _dead_fold(nodes, consts):
    """A Gemm on the input and, beside it, constants folded to nothing that is used."""
    inits = {"w": W, "b": B, **consts}
    return _model([*nodes, n("Gemm", ["x", "w", "b"], ["out"], name="fc", transB=1)],
                  inits, (4,), "out")


def _broadcasts(size):
    """Mul of a (size, 1) and a (1, size) constant, each made by reshaping a (size,)
    initializer of the file: size^2 elements from 2 size stored."""
    row = np.ones(size, np.float32)
    return _dead_fold(
        [n("Reshape", ["row", "col_shape"], ["col"], name="as column"),
         n("Reshape", ["row", "row_shape"], ["wide"], name="as row"),
         n("Mul", ["col", "wide"], ["big"], name="outer")],
        {"row": row, "col_shape": np.array([size, 1], np.int64),
         "row_shape": np.array([1, size], np.int64)})


@pytest.mark.parametrize("make, node", [
    (lambda: _broadcasts(1 << 20), "outer"),     # 2^40 elements: 4 TiB from 4 MB
    (lambda: _broadcasts(4096), "outer"),        # 16 M elements (64 MB) from 32 KB
    (lambda: _dead_fold([n("Gather", ["row", "index"], ["big"], name="gather")],
                        {"row": np.ones((1, 1 << 16), np.float32),
                         "index": np.zeros((1 << 10,), np.int64)}), "gather"),
    (lambda: _dead_fold([n("Concat", ["row"] * 64, ["big"], name="concat", axis=0)],
                        {"row": np.ones(1 << 18, np.float32)}), "concat"),
])
def test_constant_folding_is_capped_before_it_allocates(make, node):
    model = make()
    with _memory_cap(), _peak_allocation() as used:
        with pytest.raises(ModelFileError, match=f"'{node}'.*elements.*more than"):
            pn.from_onnx(model, device="cpu")
    assert used["peak"] < 16 << 20


def test_layer_sizes_come_from_the_files_tensors():
    # BatchNorm over a declared 10^12 features with 3 values stored: refused before the
    # network's 4 x 10^12 parameters are allocated, and so is 4 M features: not 64 MB
    # allocated first
    for features in (10**12, 4 << 20):
        model = _model([n("BatchNormalization", ["x", "g", "g", "g", "g"], ["out"], name="bn")],
                       {"g": np.ones(3, np.float32)}, (features,), "out")
        with _memory_cap(), _peak_allocation() as used:
            with pytest.raises(InputError, match=f"gamma for layer 0 .* 3 values, the "
                                                 f"layer {features}$"):
                pn.from_onnx(model, device="cpu")
        assert used["peak"] < 16 << 20, features


def test_a_shared_weight_is_counted_each_time_a_layer_takes_it():
    # one 256 x 256 weight taken by 400 Gemms: 26 M parameters from 256 KB
    nodes, x = [], "x"
    for i in range(400):
        nodes.append(n("Gemm", [x, "w", "b"], [f"h{i}"], name=f"fc{i}", transB=1))
        x = f"h{i}"
    model = _model(nodes, {"w": np.eye(256, dtype=np.float32), "b": np.zeros(256, np.float32)},
                   (256,), x)
    with _peak_allocation() as used:
        with pytest.raises(ModelFileError, match="parameters.*more than"):
            pn.from_onnx(model, device="cpu")
    assert used["peak"] < 64 << 20


# -- deep graphs -------------------------------------------------------------------------


def _nested(depth, width=2):
    """depth residual blocks, each inside the one before: x -> Gemm -> (the next block)
    -> Add(x). Built without recursion."""
    eye, zero = np.eye(width, dtype=np.float32), np.zeros(width, np.float32)
    nodes = [n("Gemm", [f"in{i}", "w", "b"], [f"in{i + 1}" if i < depth else f"sum{depth}"],
               transB=1) for i in range(depth + 1)]
    nodes += [n("Add", [f"sum{i + 1}", f"in{i}"], [f"sum{i}"], name=f"add{i}")
              for i in reversed(range(depth))]
    nodes = [n("Identity", ["x"], ["in0"])] + nodes
    return _model(nodes, {"w": eye, "b": zero}, (width,), "sum0")


def test_blocks_nested_past_the_limit_are_refused():
    model = _nested(400)
    limit = sys.getrecursionlimit()
    with pytest.raises(InputError, match=r"more than \d+ deep inside one another") as e:
        pn.from_onnx(model, device="cpu")
    assert f"more than {layers.MAX_NESTING} deep" in str(e.value)
    assert "'add16' (Add)" in str(e.value)            # the Add that closes the 17th
    assert sys.getrecursionlimit() == limit


def test_blocks_nested_to_the_limit_are_read():
    net = pn.from_onnx(_nested(layers.MAX_NESTING), device="cpu")
    x = np.array([[1.0, -2.0]], np.float32)
    # the Gemms are identities and each block adds its input: (depth + 1) x
    depth, block = 1, net.layers[0]
    while isinstance(block.layers[-1], pn.Residual):
        depth, block = depth + 1, block.layers[-1]
    assert depth == layers.MAX_NESTING
    assert np.allclose(net.predict(x), (depth + 1) * x)


def _blocks(count, width=2):
    """count residual blocks one after another, each with a block inside it."""
    nodes, x = [], "x"
    for i in range(count):
        nodes += [n("Gemm", [x, "w", "b"], [f"a{i}"], transB=1), n("Relu", [f"a{i}"], [f"r{i}"]),
                  n("Gemm", [f"r{i}", "w", "b"], [f"c{i}"], transB=1),
                  n("Add", [f"c{i}", f"r{i}"], [f"inner{i}"]),
                  n("Add", [f"inner{i}", x], [f"out{i}"])]
        x = f"out{i}"
    return _model(nodes, {"w": np.eye(width, dtype=np.float32),
                          "b": np.zeros(width, np.float32)}, (width,), x)


def _lines_run(model):
    """Lines of portanet's ONNX modules executed while from_onnx reads model: the work
    the import does, counted alike on any machine."""
    files = {m.__file__ for m in (onnx_export, onnx_file, onnx_graph, onnx_import)}
    count = [0]

    def local(frame, event, arg):
        count[0] += event == "line"
        return local

    def tracer(frame, event, arg):
        return local if frame.f_code.co_filename in files else None
    before = sys.gettrace()                 # a coverage tool's, if one runs
    sys.settrace(tracer)
    try:
        onnx_import.from_onnx(model, device="cpu")
    finally:
        sys.settrace(before)
    return count[0]


def test_reading_grows_linearly_with_the_graph():
    # 4x the blocks: 4x the work, not 4^2 (as when each block's fork is joined by trying
    # every Add after it, each with a search through the rest of the graph)
    small, large = _lines_run(_blocks(40)), _lines_run(_blocks(160))
    assert large < 5 * small, (small, large)
