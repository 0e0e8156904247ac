"""The model file layer: atomic writes that survive SIGKILL and full disks, and reads that
refuse damaged, foreign or forged files with a ModelFileError before allocating much."""
import io
import json
import os
import signal
import stat
import subprocess
import sys
import time
import tracemalloc
import zipfile

import numpy as np
import pytest
import safetensors.numpy

from portanet import checkpoint
from portanet.errors import ModelFileError, PortanetError

ARCH = {"format": "test", "input_shape": [4], "layers": [["Dense", {"units": 3}]]}


def npy(x):
    buf = io.BytesIO()
    np.save(buf, x, allow_pickle=True)   # allow_pickle only to forge the object case
    return buf.getvalue()


def old_npz(path, architecture=ARCH | {"format": checkpoint.OLD_FORMAT}, **arrays):
    """A file as portanet 0.x's Sequential.save wrote it (np.savez)."""
    raw = architecture if isinstance(architecture, bytes) else json.dumps(architecture).encode()
    with open(path, "wb") as f:     # a file object: np.savez would append ".npz" to a name
        np.savez(f, architecture=np.frombuffer(raw, np.uint8), **arrays)
    return path


def zip_of(path, members):
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


def raw_safetensors(path, tensors, metadata=None):
    """A safetensors file written around checkpoint.write, which refuses bad tensors."""
    meta = {"format": checkpoint.FORMAT, "architecture": json.dumps(ARCH)}
    safetensors.numpy.save_file(tensors, path, metadata=meta if metadata is None else metadata)
    return path


def read_all(path, **kw):
    with checkpoint.read(path, **kw) as f:
        return f.format, f.architecture, f.metadata, {k: f.tensor(k) for k in f.entries}


def leftovers(folder, target):
    return [n for n in os.listdir(folder) if n != target.name]


# -- round trips ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_round_trip_keeps_values_dtypes_and_metadata(tmp_path, dtype):
    rng = np.random.default_rng(1)
    w = rng.standard_normal((5, 7)).astype(dtype)
    tensors = {"0.w": w, "0.b": rng.standard_normal(5).astype(dtype),
               "1.w": np.zeros((0, 5), dtype),               # empty tensors are legal
               "strided": w[:, ::2],                         # safetensors alone scrambles these
               "big_endian": w.astype(np.dtype(dtype).newbyteorder(">"))}
    path = tmp_path / "model.safetensors"
    assert checkpoint.write(path, ARCH, tensors, {"epoch": "3"}) == path

    with checkpoint.read(path) as f:
        assert f.format == checkpoint.FORMAT
        assert f.architecture == ARCH
        assert f.metadata == {"epoch": "3"}
        assert {k: (e.dtype, e.shape) for k, e in f.entries.items()} == {
            k: (np.dtype(dtype), x.shape) for k, x in tensors.items()}
        for name, x in tensors.items():
            got = f.tensor(name)
            assert got.dtype == np.dtype(dtype) and got.dtype.isnative
            np.testing.assert_array_equal(got, x)
    assert leftovers(tmp_path, path) == []


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux's VmHWM")
def test_header_is_read_without_tensor_data(tmp_path):
    """read() and .entries must not touch a tensor's bytes: the caller checks shapes and
    sizes first. Peak memory of a fresh process shows it."""
    path = tmp_path / "m.safetensors"
    checkpoint.write(path, ARCH, {"big": np.ones(32 << 20, np.float32),   # 128 MiB
                                  "small": np.arange(3.0)})
    # VmHWM, the peak RSS of this process's memory; getrusage's ru_maxrss would start
    # from the parent's peak, which a child inherits across fork and exec.
    child = ("import re, sys\n"
             "from portanet import checkpoint\n"
             "def peak():\n"
             "    text = open('/proc/self/status').read()\n"
             "    return int(re.search(r'VmHWM:\\s*(\\d+)', text)[1]) // 1024\n"
             "before = peak()\n"
             "with checkpoint.read(sys.argv[1]) as f:\n"
             "    assert f.entries['big'].shape == (32 << 20,), f.entries\n"
             "    assert f.tensor('small').tolist() == [0.0, 1.0, 2.0]\n"
             "    after_header = peak()\n"
             "    f.tensor('big')\n"
             "print(after_header - before, peak() - before)\n")
    out = subprocess.run([sys.executable, "-c", child, str(path)], capture_output=True,
                         text=True, check=True).stdout
    header, tensor = map(int, out.split())
    assert tensor >= 100, f"the probe does not see a 128 MiB read ({tensor} MiB)"
    assert header < 32, f"reading the header grew the process by {header} MiB"


def test_format_is_told_by_content_not_name(tmp_path):
    new = tmp_path / "looks_old.npz"
    checkpoint.write(new, ARCH, {"w": np.ones(2)})
    assert read_all(new)[0] == checkpoint.FORMAT
    old = old_npz(tmp_path / "looks_new.safetensors", **{"0.w": np.ones(2)})
    assert read_all(old)[0] == checkpoint.OLD_FORMAT


def test_old_npz_files_still_load(tmp_path):
    rng = np.random.default_rng(2)
    w = rng.standard_normal((3, 4)).astype(np.float32)
    path = old_npz(tmp_path / "old.npz", **{"0.w": w, "0.b": np.arange(3.0),
                                           "1.w": np.asfortranarray(w.astype(">f8"))})
    format, architecture, metadata, tensors = read_all(path)
    assert format == checkpoint.OLD_FORMAT
    assert architecture == ARCH | {"format": checkpoint.OLD_FORMAT}
    assert metadata == {} and sorted(tensors) == ["0.b", "0.w", "1.w"]
    np.testing.assert_array_equal(tensors["0.w"], w)
    np.testing.assert_array_equal(tensors["0.b"], np.arange(3.0))
    np.testing.assert_array_equal(tensors["1.w"], w)
    assert tensors["1.w"].dtype == np.float64 and tensors["1.w"].dtype.isnative


def test_new_files_get_normal_permissions_and_keep_existing_ones(tmp_path):
    path = tmp_path / "m.safetensors"
    checkpoint.write(path, ARCH, {"w": np.ones(2)})
    umask = os.umask(0o022)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask   # not mkstemp's 0600
    path.chmod(0o640)
    checkpoint.write(path, ARCH, {"w": np.zeros(2)})
    assert stat.S_IMODE(path.stat().st_mode) == 0o640


def test_write_through_a_symlink_keeps_the_link(tmp_path):
    real = tmp_path / "runs" / "model.safetensors"
    real.parent.mkdir()
    link = tmp_path / "latest.safetensors"
    link.symlink_to(real)
    checkpoint.write(link, ARCH, {"w": np.ones(2)})
    assert link.is_symlink() and real.is_file()
    np.testing.assert_array_equal(read_all(link)[3]["w"], np.ones(2))


# -- atomicity -----------------------------------------------------------------------

SAVER = """
import sys
import numpy as np
from portanet import checkpoint
tensors = {f"t{i}": np.empty(8 << 20, np.float32) for i in range(3)}   # 3 x 32 MiB
print("ready", flush=True)
k = 1
while True:
    for x in tensors.values():
        x.fill(k)
    checkpoint.write(sys.argv[1], {"k": k}, tensors, {"k": str(k)})
    print(k, flush=True)
    k += 1
"""


def test_sigkill_during_saves_never_leaves_a_broken_file(tmp_path):
    path = tmp_path / "model.safetensors"
    tensors = {f"t{i}": np.zeros(8 << 20, np.float32) for i in range(3)}
    checkpoint.write(path, {"k": 0}, tensors, {"k": "0"})
    del tensors
    saves_completed = 0
    for delay in (0.05, 0.1, 0.2, 0.4, 0.8, 1.6):
        saver = subprocess.Popen([sys.executable, "-c", SAVER, str(path)],
                                 stdout=subprocess.PIPE, text=True)
        assert saver.stdout.readline() == "ready\n"
        time.sleep(delay)
        saver.send_signal(signal.SIGKILL)
        saver.wait()
        done = [int(line) for line in saver.stdout.read().split()]
        saver.stdout.close()
        saves_completed += len(done)
        last = done[-1] if done else 0

        # the target is always one complete save: the last reported, or the one whose
        # os.replace ran just before the kill landed -- never a mix, never truncated
        with checkpoint.read(path) as f:
            k = f.architecture["k"]
            assert k in (last, last + 1) and f.metadata == {"k": str(k)}
            for name in ("t0", "t1", "t2"):
                x = f.tensor(name)
                assert x.shape == (8 << 20,) and (x == k).all(), (name, k)
    assert saves_completed >= 1, "no save finished: the kills never hit a re-save"

    # A SIGKILL may leave the save's temp folder, .model.safetensors.XXXX.tmp/ (with
    # safetensors' own .tmpXXXX inside): hidden, named after the target, never opened by
    # read(path), and no stray file elsewhere in the folder. A later save still works.
    for name in leftovers(tmp_path, path):
        assert name.startswith(".model.safetensors.") and name.endswith(".tmp"), name
        assert (tmp_path / name).is_dir()
    checkpoint.write(path, {"k": -1}, {"t0": np.ones(3, np.float32)})
    assert read_all(path)[1] == {"k": -1}


def test_stale_temp_folders_of_killed_saves_are_removed(tmp_path):
    path = tmp_path / "model.safetensors"
    stale, fresh, other = (tmp_path / n for n in (".model.safetensors.old1.tmp",
                                                  ".model.safetensors.new1.tmp",
                                                  ".other.safetensors.old2.tmp"))
    for folder in (stale, fresh, other):
        folder.mkdir()
        (folder / "tmpXYZ").write_bytes(b"half a model")
    hours_ago = time.time() - 7200
    for p in (stale, stale / "tmpXYZ", other, other / "tmpXYZ"):
        os.utime(p, (hours_ago, hours_ago))
    checkpoint.write(path, ARCH, {"w": np.ones(2)})
    # another save may still be writing the fresh one; the other belongs to another file
    assert sorted(leftovers(tmp_path, path)) == sorted([fresh.name, other.name])


FULL_DISK = """
import resource, signal, sys
import numpy as np
from portanet import checkpoint
from portanet.errors import ModelFileError
# Without this the kernel kills a process that passes RLIMIT_FSIZE; CPython already
# ignores SIGXFSZ at startup, so write() sees EFBIG as an error. Say it explicitly.
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
_, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, hard))      # files up to 1 MiB
try:
    checkpoint.write(sys.argv[1], {"k": 1}, {"w": np.ones(1 << 20, np.float32)})  # 4 MiB
except ModelFileError as e:
    print("ModelFileError:", e)
"""


def test_full_disk_raises_and_keeps_the_previous_file(tmp_path):
    path = tmp_path / "model.safetensors"
    checkpoint.write(path, {"k": 0}, {"w": np.zeros(1000, np.float32)})
    before = path.read_bytes()
    out = subprocess.run([sys.executable, "-c", FULL_DISK, str(path)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ModelFileError:") and str(path) in out.stdout
    assert "File too large" in out.stdout                # the OS's reason is passed on
    assert path.read_bytes() == before
    assert leftovers(tmp_path, path) == []        # the failed temp files are removed


def test_interrupt_during_save_keeps_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "model.safetensors"
    checkpoint.write(path, {"k": 0}, {"w": np.zeros(10)})
    before = path.read_bytes()

    def interrupted(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"half a file")
        raise KeyboardInterrupt

    monkeypatch.setattr(safetensors.numpy, "save_file", interrupted)
    with pytest.raises(KeyboardInterrupt):     # the user's Ctrl-C stays a Ctrl-C
        checkpoint.write(path, {"k": 1}, {"w": np.ones(10)})
    assert path.read_bytes() == before
    assert leftovers(tmp_path, path) == []


@pytest.mark.parametrize("bad", [np.array([1.0, np.nan]), np.array([np.inf]),
                                 np.arange(3), np.ones(2, np.complex64)],
                         ids=["nan", "inf", "int", "complex"])
def test_write_refuses_tensors_that_could_not_be_loaded(tmp_path, bad):
    path = tmp_path / "model.safetensors"
    checkpoint.write(path, {"k": 0}, {"w": np.zeros(2)})
    before = path.read_bytes()
    with pytest.raises(ModelFileError, match="'0.w'"):
        checkpoint.write(path, {"k": 1}, {"0.w": bad})
    assert path.read_bytes() == before


# -- destinations --------------------------------------------------------------------


@pytest.mark.parametrize("where", ["missing folder", "a folder", "trailing slash",
                                   "file as folder", "a fifo", "/proc", "read-only folder"])
def test_bad_destinations_are_refused_before_and_at_save(tmp_path, where):
    if where == "/proc" and not os.path.isdir("/proc/self"):
        pytest.skip("no /proc here")
    if where == "read-only folder" and os.geteuid() == 0:
        pytest.skip("root ignores folder permissions (the /proc case covers root)")
    (tmp_path / "file").write_text("x")
    (tmp_path / "ro").mkdir(mode=0o500)
    os.mkfifo(tmp_path / "fifo")
    path = {"missing folder": tmp_path / "nope" / "m.safetensors",
            "a folder": tmp_path,
            "trailing slash": f"{tmp_path / 'new'}{os.sep}",
            "file as folder": tmp_path / "file" / "m.safetensors",
            "a fifo": tmp_path / "fifo",
            "/proc": "/proc/portanet-test.safetensors",
            "read-only folder": tmp_path / "ro" / "m.safetensors"}[where]
    for attempt in (checkpoint.check_destination,
                    lambda p: checkpoint.write(p, ARCH, {"w": np.ones(2)})):
        with pytest.raises(ModelFileError) as e:
            attempt(path)
        assert str(path) in str(e.value)
    assert sorted(os.listdir(tmp_path)) == ["fifo", "file", "ro"]


def test_check_destination_accepts_a_new_and_an_existing_file(tmp_path):
    path = tmp_path / "m.safetensors"
    assert checkpoint.check_destination(path) == path
    checkpoint.write(path, ARCH, {"w": np.ones(2)})
    assert checkpoint.check_destination(str(path)) == path
    assert leftovers(tmp_path, path) == []        # the probe file is gone


# -- damaged, foreign and forged files -----------------------------------------------


class RunsCode:
    """Unpickling this creates a file: proof that a loader executed the file's code."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return open, (self.marker, "w")


def _corrupt(kind, tmp_path):
    p = tmp_path / "bad"
    good = tmp_path / "good.safetensors"
    if kind == "missing":
        return p
    if kind == "folder":
        p.mkdir()
    elif kind == "fifo":                 # opening it to read would block forever
        os.mkfifo(p)
    elif kind == "empty":
        p.write_bytes(b"")
    elif kind == "random bytes":
        p.write_bytes(np.random.default_rng(0).bytes(4096))
    elif kind == "truncated safetensors":
        checkpoint.write(good, ARCH, {"w": np.ones(1000)})
        p.write_bytes(good.read_bytes()[:5000])
    elif kind == "header length over 100 MB":
        p.write_bytes((100_000_001).to_bytes(8, "little") + b"{" + b" " * 100)
    elif kind == "safetensors without portanet metadata":
        raw_safetensors(p, {"w": np.ones(2)}, metadata={})
    elif kind == "unknown newer format":
        raw_safetensors(p, {"w": np.ones(2)}, {"format": "portanet-model-9",
                                                 "architecture": "{}"})
    elif kind == "deep JSON in safetensors metadata":
        raw_safetensors(p, {"w": np.ones(2)}, {"format": checkpoint.FORMAT,
                                                 "architecture": "[" * 100_000})
    elif kind == "a .npy file":
        p.write_bytes(npy(np.ones((3, 4))))
    elif kind == "npz without architecture":
        with open(p, "wb") as f:
            np.savez(f, **{"0.w": np.ones(3)})
    elif kind == "deep JSON in npz":
        old_npz(p, b"[" * 100_000)
    elif kind == "non-UTF-8 architecture":
        old_npz(p, b'{"format": "\xff\xfe"}')
    elif kind == "architecture not a dict":
        old_npz(p, [1, 2])
    elif kind == "architecture over 1 MiB":
        old_npz(p, b" " * (2 << 20) + b"{}")
    elif kind == "truncated npz":
        p.write_bytes(old_npz(good, **{"0.w": np.ones(1000)}).read_bytes()[:3000])
    elif kind == "pickled member":
        arch = npy(np.frombuffer(json.dumps(ARCH | {"format": "portanet-model-1"}).encode(),
                                 np.uint8))
        zip_of(p, {"architecture.npy": arch,
                   "0.w.npy": npy(np.array([RunsCode(str(tmp_path / "pwned"))], object))})
    return p


@pytest.mark.parametrize("kind", [
    "missing", "folder", "fifo", "empty", "random bytes", "truncated safetensors",
    "header length over 100 MB", "safetensors without portanet metadata",
    "unknown newer format", "deep JSON in safetensors metadata", "a .npy file",
    "npz without architecture", "deep JSON in npz", "non-UTF-8 architecture",
    "architecture not a dict", "architecture over 1 MiB", "truncated npz", "pickled member"])
def test_damaged_or_foreign_files_raise_model_file_error(tmp_path, kind):
    path = _corrupt(kind, tmp_path)
    with pytest.raises(ModelFileError) as e:
        read_all(path)
    assert isinstance(e.value, PortanetError) and str(path) in str(e.value)
    assert not (tmp_path / "pwned").exists()
    if kind == "missing":
        assert "does not exist" in str(e.value)
    elif kind in ("empty", "random bytes", "a .npy file", "npz without architecture"):
        assert "not a portanet model file" in str(e.value) and "net.save(path)" in str(e.value)


def test_member_declaring_a_terabyte_is_refused_without_allocating(tmp_path):
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False,
                                                  "shape": (10**12,)})
    path = zip_of(tmp_path / "forged.npz", {
        "architecture.npy": npy(np.frombuffer(json.dumps(ARCH | {
            "format": checkpoint.OLD_FORMAT}).encode(), np.uint8)),
        "0.w.npy": header.getvalue() + b"\0" * 16})
    tracemalloc.start()
    try:
        with pytest.raises(ModelFileError, match="4000000000000 bytes"):
            checkpoint.read(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 10 << 20


@pytest.fixture(scope="module")
def zip_bomb(tmp_path_factory):
    """An old-format file whose extra member inflates to 1 GiB of zeros, stored in a few
    MB; made in 16 MiB pieces so the test itself never holds 1 GiB."""
    path = tmp_path_factory.mktemp("bomb") / "bomb.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        z.writestr("architecture.npy", npy(np.frombuffer(json.dumps(ARCH | {
            "format": checkpoint.OLD_FORMAT}).encode(), np.uint8)))
        z.writestr("0.w.npy", npy(np.ones((3, 4), np.float32)))
        with z.open("extra.npy", "w", force_zip64=True) as f:
            np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False,
                                                     "shape": (1 << 28,)})
            zeros = bytes(1 << 24)
            for _ in range(64):
                f.write(zeros)
    assert path.stat().st_size < 16 << 20
    return path


def test_zip_bomb_member_is_listed_but_never_inflated(zip_bomb):
    tracemalloc.start()
    try:
        with checkpoint.read(zip_bomb) as f:
            assert f.entries["extra"].shape == (1 << 28,)      # the caller sees the extra
            assert f.entries["extra"].nbytes == 1 << 30        # entry and refuses it
            np.testing.assert_array_equal(f.tensor("0.w"), np.ones((3, 4)))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, f"{peak} bytes allocated to read the header"


def test_tensors_over_the_memory_cap_are_refused_at_open(zip_bomb, tmp_path):
    with pytest.raises(ModelFileError, match="'extra'.*1073741824 bytes"):
        checkpoint.read(zip_bomb, max_bytes=1 << 29)
    path = tmp_path / "m.safetensors"
    checkpoint.write(path, ARCH, {"a": np.ones(100), "b": np.ones(100)})   # 800 B each
    assert read_all(path, max_bytes=1600)[3]["a"].shape == (100,)
    with pytest.raises(ModelFileError, match="1600 bytes"):               # the total
        checkpoint.read(path, max_bytes=1000)


# -- tensors that are not float weights ------------------------------------------------


def _with_tensor(kind, tmp_path):
    x = np.zeros((2, 3), np.float32)
    if kind in ("nan", "inf", "nan in npz"):
        x[1, 2] = np.nan if "nan" in kind else -np.inf
    else:
        x = {"complex": np.ones(3, np.complex64), "bool": np.ones(3, bool),
             "int": np.arange(3, dtype=np.int32), "string": np.array(["a", "b"])}[kind]
    if kind in ("string", "nan in npz"):
        return old_npz(tmp_path / "m.npz", **{"0.w": x})
    return raw_safetensors(tmp_path / "m.safetensors", {"0.w": x})


@pytest.mark.parametrize("kind, says", [
    ("nan", r"NaN or inf \(first at index \(1, 2\)\)"),
    ("inf", r"NaN or inf \(first at index \(1, 2\)\)"),
    ("nan in npz", r"NaN or inf \(first at index \(1, 2\)\)"),
    ("complex", "complex64"), ("bool", "bool"), ("int", "int32"), ("string", "<U1")])
def test_tensor_refuses_non_float_or_non_finite_values(tmp_path, kind, says):
    path = _with_tensor(kind, tmp_path)
    with checkpoint.read(path) as f:
        assert "0.w" in f.entries                  # the header itself is fine
        with pytest.raises(ModelFileError, match="'0.w'.*" + says):
            f.tensor("0.w")
        with pytest.raises(ModelFileError, match="no tensor 'nope'"):
            f.tensor("nope")
