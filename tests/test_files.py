"""The one writer rule (portanet/files.py) and every writer that follows it: a destination
that is not a regular file is refused before anything is written, a symlink is written
through, a file's permissions are kept, the write is atomic; and the routes file is
rewritten only where it is portanet's own."""
import json
import os
import stat
import threading

import numpy as np
import pytest

import portanet as pn
from portanet import bench, checkpoint, curves, files
from portanet.backends.gemm.routes import RouteFile
from portanet.errors import PortanetError

OLD = b"the earlier file\n"
SCOPE = "0123456789abcdef01234567"                       # a scope digest: 24 hex digits
LEGACY_ROUTES = json.dumps({SCOPE: {repr((1, 2, ("a", "b"))): "a"}}).encode()


def _routes(path):
    RouteFile(path, SCOPE).put(("new", 1), "p")


def _routes_written(target):
    return RouteFile(target, SCOPE).get(("new", 1)) == "p"


def _checkpoint_written(target):
    with checkpoint.read(target) as f:
        return f.architecture == {"k": 1}


def _onnx(path):
    pytest.importorskip("onnx", reason="onnx is not installed (the onnx extra)")
    pn.mlp((4,), classes=3, hidden=(5,), device="cpu").to_onnx(path)


def _onnx_written(target):
    import onnx
    onnx.checker.check_model(onnx.load(str(target)))
    return True


def _curves(path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (the plot extra)")
    curves.plot({"loss": [1.0, 0.5]}, path)


def _bench_plot(path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (the plot extra)")
    bench.plot({"date": "today", "results": [{"status": "ok", "workload": "gemm",
                                              "case": "64", "device": "cpu",
                                              "median_s": 1e-3}]}, path)


# name: (file name, write(path), written(target) -> True where it holds the new file,
#        the earlier file's bytes: what that writer takes as its own)
WRITERS = {
    "checkpoint": ("m.safetensors",
                   lambda p: checkpoint.write(p, {"k": 1}, {"w": np.ones(2)}),
                   _checkpoint_written, OLD),
    "onnx": ("m.onnx", _onnx, _onnx_written, OLD),
    "curves": ("c.png", _curves, lambda t: t.read_bytes()[:4] == b"\x89PNG", OLD),
    "bench json": ("b.json", lambda p: bench.write_json({"a": 1.5}, p),
                   lambda t: json.loads(t.read_text()) == {"a": 1.5}, OLD),
    "bench plot": ("b.png", _bench_plot, lambda t: t.read_bytes()[:4] == b"\x89PNG", OLD),
    "routes": ("routes.json", _routes, _routes_written, LEGACY_ROUTES),
}


def listed(folder):
    """The folder's files but the routes file's lock, which stays beside it."""
    return sorted(n for n in os.listdir(folder) if not n.endswith(".json.lock"))


def within(seconds, call, *args):
    """call(*args) in a thread, failing the test where it does not return in time (a
    writer that opens a FIFO waits for a reader forever)."""
    outcome = {}

    def run():
        try:
            outcome["value"] = call(*args)
        except BaseException as e:                      # noqa: B036 (handed back below)
            outcome["error"] = e
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"{call} did not return in {seconds} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def unblock(fifo):
    """Let a writer stuck opening `fifo` go on (and fail), so no thread is left waiting."""
    try:
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
    except OSError:
        pass


@pytest.mark.parametrize("writer", WRITERS)
def test_a_fifo_is_refused_and_left(writer, tmp_path):
    name, write, _, _ = WRITERS[writer]
    path = tmp_path / name
    os.mkfifo(path)
    try:
        with pytest.raises(PortanetError, match=f"{name}.*FIFO.*choose another path"):
            within(20, write, path)
    finally:
        unblock(path)
    assert stat.S_ISFIFO(os.lstat(path).st_mode)
    assert os.listdir(tmp_path) == [name]


@pytest.mark.parametrize("writer", WRITERS)
def test_a_folder_is_refused_and_left(writer, tmp_path):
    name, write, _, _ = WRITERS[writer]
    path = tmp_path / name
    (path / "inside").mkdir(parents=True)
    with pytest.raises(PortanetError, match=f"{name}.*is a folder"):
        within(20, write, path)
    assert os.listdir(tmp_path) == [name] and os.listdir(path) == ["inside"]


@pytest.mark.parametrize("writer", WRITERS)
def test_a_symlink_is_written_through(writer, tmp_path):
    name, write, written, old = WRITERS[writer]
    (tmp_path / "real").mkdir()
    target, link = tmp_path / "real" / name, tmp_path / name
    target.write_bytes(old)
    link.symlink_to(target)
    within(60, write, link)
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert written(target)
    assert listed(tmp_path / "real") == [name]


@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("mode", [0o664, 0o640])
def test_the_mode_is_kept(writer, mode, tmp_path):
    name, write, written, old = WRITERS[writer]
    path = tmp_path / name
    path.write_bytes(old)
    os.chmod(path, mode)
    within(60, write, path)
    assert written(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == mode
    assert listed(tmp_path) == [name]


@pytest.mark.parametrize("writer", WRITERS)
def test_a_new_file_gets_what_open_gives(writer, tmp_path):
    name, write, written, _ = WRITERS[writer]
    old = os.umask(0o002)
    try:
        within(60, write, tmp_path / name)
    finally:
        os.umask(old)
    assert written(tmp_path / name)
    assert stat.S_IMODE(os.stat(tmp_path / name).st_mode) == 0o664


@pytest.mark.skipif(os.geteuid() != 0, reason="making a device node needs root")
def test_a_device_node_is_refused_and_left(tmp_path):
    """A character device (/dev/null's numbers, made in a temp folder): the one an earlier
    curves.plot replaced with a PNG."""
    path = tmp_path / "node.png"
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    for write in (lambda p: curves.plot({"loss": [1.0]}, p),
                  lambda p: files.write_text(p, "x", "the text")):
        with pytest.raises(PortanetError, match="character device"):
            write(path)
        assert stat.S_ISCHR(os.lstat(path).st_mode)


# -- the rule itself ------------------------------------------------------------------


def test_a_failed_write_leaves_the_file_and_no_temp(tmp_path):
    path = tmp_path / "f.txt"
    path.write_bytes(OLD)

    def half(tmp):
        with open(tmp, "w") as f:
            f.write("half")
        raise OSError(28, "No space left on device")
    with pytest.raises(pn.ModelFileError, match=r"could not save the text to .*f\.txt: No "
                                                r"space left.*unchanged"):
        files.write_atomically(path, half, "the text", pn.ModelFileError)
    assert path.read_bytes() == OLD and os.listdir(tmp_path) == ["f.txt"]


@pytest.mark.parametrize("raised", [KeyboardInterrupt, pn.DataError])
def test_interrupts_and_portanet_errors_propagate_as_themselves(tmp_path, raised):
    path = tmp_path / "f.txt"
    path.write_bytes(OLD)

    def save(tmp):
        open(tmp, "w").close()
        raise raised("stop")
    with pytest.raises(raised, match="stop"):
        files.write_atomically(path, save, "the text")
    assert path.read_bytes() == OLD and os.listdir(tmp_path) == ["f.txt"]


def test_the_temp_keeps_the_name_and_the_return_is_the_target(tmp_path):
    (tmp_path / "real.svg").write_text("old")
    (tmp_path / "link.svg").symlink_to(tmp_path / "real.svg")
    names = []
    assert files.write_atomically(tmp_path / "link.svg",
                                  lambda tmp: names.append(os.path.basename(tmp))
                                  or open(tmp, "w").close(), "x") == tmp_path / "real.svg"
    assert names == ["real.svg"]


def test_check_destination_leaves_nothing(tmp_path):
    assert files.check_destination(tmp_path / "new.txt", "x") == tmp_path / "new.txt"
    assert os.listdir(tmp_path) == []
    with pytest.raises(pn.InputError, match="does not exist"):
        files.check_destination(tmp_path / "no" / "f", "x", pn.InputError)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file away needs root")
def test_root_keeps_the_owner_and_group(tmp_path):
    path = tmp_path / "shared.txt"
    path.write_text("old")
    os.chown(path, 4321, 4322)
    os.chmod(path, 0o2664)
    files.write_text(path, "new", "the text")
    info = os.stat(path)
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (4321, 4322, 0o2664)
    assert path.read_text() == "new"


def test_read_bytes_takes_regular_files_only(tmp_path):
    (tmp_path / "f").write_bytes(b"12345")
    (tmp_path / "link").symlink_to(tmp_path / "f")
    os.mkfifo(tmp_path / "fifo")
    assert files.read_bytes(tmp_path / "link", "x") == b"12345"
    for name, says in (("fifo", "FIFO"), (".", "folder")):
        with pytest.raises(pn.DataError, match=f"cannot read the data from .*{says}"):
            within(20, files.read_bytes, tmp_path / name, "the data", pn.DataError)
    with pytest.raises(PortanetError, match="larger than the 4 bytes"):
        files.read_bytes(tmp_path / "f", "x", max_bytes=4)
    with pytest.raises(FileNotFoundError):
        files.read_bytes(tmp_path / "missing", "x")


# -- the routes file is portanet's own or refused -------------------------------------


@pytest.mark.parametrize("foreign", [
    b'{"a": {"b": 1}}',                                           # an object of objects
    json.dumps({SCOPE: {"not a key": "p"}}).encode(),
    json.dumps({SCOPE: {repr((1,)): 3}}).encode(),
    b"{}",
    b'{"format": "portanet-routes-99", "scopes": {}}',            # a newer portanet's
    b"[1, 2]",
])
def test_a_json_file_that_is_not_a_routes_file_is_refused_unchanged(tmp_path, foreign):
    path = tmp_path / "settings.json"
    path.write_bytes(foreign)
    for call in (lambda: RouteFile(path, SCOPE).get(("k",)),
                 lambda: RouteFile(path, SCOPE).put(("k",), "p")):
        with pytest.raises(PortanetError, match=r"PORTANET_ROUTES=.*settings\.json.* not a "
                                                r"routes file.*give another path"):
            call()
    assert path.read_bytes() == foreign


def test_deep_nesting_in_a_routes_file_is_refused(tmp_path):
    path = tmp_path / "routes.json"
    deep = b'{"format": "portanet-routes-1", "scopes": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    path.write_bytes(deep)
    with pytest.raises(PortanetError, match="PORTANET_ROUTES.*nested 5001 levels"):
        RouteFile(path, SCOPE).put(("k",), "p")
    assert path.read_bytes() == deep


def test_a_routes_file_of_the_earlier_layout_is_read_and_carried_over(tmp_path):
    path = tmp_path / "routes.json"
    path.write_bytes(LEGACY_ROUTES)
    assert RouteFile(path, SCOPE).get((1, 2, ("a", "b"))) == "a"
    RouteFile(path, "other").put(("k",), "p")
    kept = json.loads(path.read_text())
    assert kept["format"] == "portanet-routes-1"
    assert kept["scopes"] == {SCOPE: {repr((1, 2, ("a", "b"))): "a"},
                              "other": {repr(("k",)): "p"}}


def test_a_download_does_not_replace_a_fifo(tmp_path, monkeypatch):
    """A dataset file is stored by the same rule: a FIFO where it goes is refused (before
    the rule, the verified download was renamed over it)."""
    import gzip
    import hashlib
    import io
    import urllib.request
    from portanet import data
    body = gzip.compress(b"\x00\x00\x08\x01\x00\x00\x00\x01\x07")      # IDX: 1 byte
    monkeypatch.setattr("portanet.config.data_dirs", lambda: [tmp_path])
    monkeypatch.setitem(data.DATASETS, "tiny", {
        "url": "https://example.invalid/tiny/",
        "files": {"t": (len(body), hashlib.sha256(body).hexdigest())}})
    monkeypatch.setattr(urllib.request, "urlopen", lambda url, timeout: io.BytesIO(body))
    (tmp_path / "tiny").mkdir()
    os.mkfifo(tmp_path / "tiny" / "t.gz")
    with pytest.raises(pn.DataError, match=r"t\.gz.*FIFO"):
        data.fetch("tiny", dest=tmp_path)
    assert stat.S_ISFIFO(os.lstat(tmp_path / "tiny" / "t.gz").st_mode)
    assert os.listdir(tmp_path / "tiny") == ["t.gz"]
