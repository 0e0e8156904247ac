"""IDX reading and downloads refuse damaged or hostile input with one DataError that says
what to do. No test touches the network: urlopen is replaced by a fake, or pointed at a
closed port on 127.0.0.1."""
import gzip
import hashlib
import io
import re
import socket
import struct
import tracemalloc
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

import portanet as pn
from portanet import data
from portanet.data import read_idx

STEM = "t10k-labels-idx1-ubyte"


def _idx_header(dims, code=0x08):
    return bytes([0, 0, code, len(dims)]) + struct.pack(f">{len(dims)}I", *dims)


@pytest.fixture(scope="module")
def zeros_bomb():
    """About 1 MB of gzip members that inflate to 1 GiB of zeros (gzip.open reads them
    all as one stream); made by repeating one compressed MiB, so it costs no GiB here."""
    return gzip.compress(bytes(1 << 20), compresslevel=9) * 1024


def _refused_with_little_memory(path, match):
    tracemalloc.start()
    try:
        with pytest.raises(pn.DataError, match=match):
            read_idx(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"read_idx took {peak >> 20} MiB to refuse a 1 MB file"


def test_gzip_bomb_is_refused_after_the_declared_size(tmp_path, zeros_bomb):
    bomb = tmp_path / "bomb.gz"
    bomb.write_bytes(gzip.compress(_idx_header((16,)) + bytes(16)) + zeros_bomb)
    _refused_with_little_memory(bomb, r"\(16,\).*has more.*truncated or corrupt")


def test_header_claiming_more_than_the_file_can_hold(tmp_path, zeros_bomb):
    bomb = tmp_path / "huge.gz"                    # claims 1 TiB: more than 1032 x 1 MB
    bomb.write_bytes(gzip.compress(_idx_header((1 << 20, 1 << 20))) + zeros_bomb)
    _refused_with_little_memory(bomb, r"1099511627788 bytes.*holds at most")


@pytest.mark.parametrize("gzipped", [False, True])
def test_dims_that_overflow_np_prod(tmp_path, gzipped):
    header = _idx_header((65536,) * 4)             # 2**64 bytes: np.prod wraps to 0
    path = tmp_path / "overflow"
    path.write_bytes(gzip.compress(header) if gzipped else header)
    with pytest.raises(pn.DataError, match=r"18446744073709551636 bytes.*truncated or corrupt"):
        read_idx(path)


@pytest.mark.parametrize("where", ["deflate body", "crc"])
def test_corrupt_gzip_is_a_data_error(tmp_path, where):
    good = bytearray(gzip.compress(_idx_header((1024,)) + bytes(range(256)) * 4))
    if where == "deflate body":
        good[10:20] = b"\xff" * 10                 # a reserved block type: zlib.error
    else:
        good[-8] ^= 1
    path = tmp_path / "corrupt.gz"
    path.write_bytes(good)
    with pytest.raises(pn.DataError, match=r"corrupt.gz.*damaged: delete it and fetch"):
        read_idx(path)


def test_big_endian_types_and_exact_size(tmp_path):
    values = np.arange(6, dtype=">f4").reshape(2, 3)
    path = tmp_path / "floats.gz"
    path.write_bytes(gzip.compress(_idx_header((2, 3), code=0x0D) + values.tobytes()))
    out = read_idx(path)
    assert out.dtype == np.float32 and out.dtype.isnative and np.array_equal(out, values)


# -- downloads -----------------------------------------------------------------------------

class Response(io.BytesIO):
    """What urlopen returns, with no Content-Length (servers may leave it out)."""
    headers = {}


@pytest.fixture
def tiny(monkeypatch, tmp_path):
    """A one-file dataset 'tiny' served by a fake urlopen; returns (the .gz bytes, the
    list of URLs asked for). Only tmp_path is searched for dataset files."""
    body = gzip.compress(_idx_header((3,)) + b"\x01\x02\x03")
    monkeypatch.setattr("portanet.config.data_dirs", lambda: [tmp_path])
    monkeypatch.setitem(data.DATASETS, "tiny", {
        "url": "https://example.invalid/tiny/",
        "files": {STEM: (len(body), hashlib.sha256(body).hexdigest())}})
    asked = []

    def urlopen(url, timeout):
        asked.append(url)
        return Response(body)

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    return body, asked


def test_shipped_urls_are_https_and_every_file_has_its_digest():
    for name, spec in data.DATASETS.items():
        assert spec["url"].startswith("https://"), name
        assert len(spec["files"]) == 4, name
        for stem, (size, digest) in spec["files"].items():
            assert size > 0 and len(bytes.fromhex(digest)) == 32, (name, stem)


def test_fetch_stores_only_after_verifying(tiny, monkeypatch, tmp_path, capsys):
    body, asked = tiny
    target = tmp_path / "tiny" / (STEM + ".gz")

    class Watched(Response):                       # the target appears only at the end
        def read(self, n=-1):
            assert not target.exists()
            return super().read(n)

    monkeypatch.setattr(urllib.request, "urlopen",
                        lambda url, timeout: asked.append(url) or Watched(body))
    data.fetch("tiny", dest=tmp_path)
    assert asked == [f"https://example.invalid/tiny/{STEM}.gz"]
    assert sorted(p.name for p in target.parent.iterdir()) == [target.name]
    assert target.read_bytes() == body and list(read_idx(target)) == [1, 2, 3]
    err = capsys.readouterr().err                  # a progress line, ended once
    assert STEM in err and err.startswith("\r") and err.endswith("\n") and err.count("\n") == 1
    data.fetch("tiny", dest=tmp_path)              # present now: nothing asked, printed
    assert len(asked) == 1 and capsys.readouterr().err == ""


def test_checksum_is_checked_on_the_stream_not_after_inflating(tiny, monkeypatch, tmp_path):
    monkeypatch.setattr(urllib.request, "urlopen", lambda url, timeout: Response(b"<html>"))
    with pytest.raises(pn.DataError, match=r"sha256 .* is not the expected .* try again"):
        data.fetch("tiny", dest=tmp_path)
    assert list((tmp_path / "tiny").iterdir()) == []


def test_an_endless_download_stops_at_the_known_size(tiny, monkeypatch, tmp_path):
    size = data.DATASETS["tiny"]["files"][STEM][0]
    served = []

    class Endless(Response):
        def read(self, n=-1):
            served.append(n)
            assert sum(served) < 100 * size, "kept reading past the known size"
            return bytes(n)

    monkeypatch.setattr(urllib.request, "urlopen", lambda url, timeout: Endless())
    with pytest.raises(pn.DataError, match="sha256"):
        data.fetch("tiny", dest=tmp_path)
    assert sum(served) <= size + 1
    assert list((tmp_path / "tiny").iterdir()) == []


def test_file_without_a_known_digest_is_not_downloaded(tiny, tmp_path):
    _, asked = tiny
    data.DATASETS["tiny"]["files"][STEM] = (3, None)
    with pytest.raises(pn.DataError, match="no sha256 is known.*never stored"):
        data.fetch("tiny", dest=tmp_path)
    assert asked == [] and list((tmp_path / "tiny").iterdir()) == []


def _closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cut(Response):
    def read(self, n=-1):
        if self.tell():
            raise ConnectionResetError(104, "Connection reset by peer")
        return super().read(2)


OFFLINE = {
    "no DNS": urllib.error.URLError(socket.gaierror(-3, "Temporary failure in name resolution")),
    "timeout": socket.timeout("timed out"),
    "HTTP 404": urllib.error.HTTPError("https://x", 404, "Not Found", {}, None),
    "cut mid-file": None,
    "refused": None,
}


@pytest.mark.parametrize("failure", OFFLINE)
def test_network_failure_is_one_line_saying_what_to_do(monkeypatch, tmp_path, capsys, failure):
    monkeypatch.setattr("portanet.config.data_dirs", lambda: [tmp_path])
    if failure == "refused":                       # the real urlopen, a closed local port
        monkeypatch.setenv("no_proxy", "*")
        monkeypatch.setitem(data.DATASETS["fashion-mnist"], "url",
                            f"http://127.0.0.1:{_closed_port()}/")
    else:
        def urlopen(url, timeout):
            if failure == "cut mid-file":
                return Cut(bytes(100))
            raise OFFLINE[failure]

        monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    with pytest.raises(pn.DataError) as caught:
        data.fetch("fashion-mnist", dest=tmp_path)
    message = str(caught.value)
    assert "\n" not in message and message.startswith("cannot download ")
    assert str(tmp_path / "fashion-mnist") in message
    assert "dataset-fashion-mnist" in message and "retry with network" in message
    assert list((tmp_path / "fashion-mnist").iterdir()) == []     # no .part left
    err = capsys.readouterr().err                  # the progress line, if any, is ended
    if failure == "cut mid-file":
        assert err.startswith("\r") and err.endswith("\n") and err.count("\n") == 1
    else:
        assert err == ""


def test_mnist_hints_name_no_missing_debian_package(monkeypatch, tmp_path):
    monkeypatch.setattr("portanet.config.data_dirs", lambda: [tmp_path])
    with pytest.raises(pn.DataError, match=r"(?s)not found.*Put the IDX files") as caught:
        data.find_file("mnist", STEM)
    assert "Debian" not in str(caught.value)
    monkeypatch.setattr(urllib.request, "urlopen", lambda url, timeout: Cut(bytes(9)))
    with pytest.raises(pn.DataError, match=re.escape(str(tmp_path / "mnist"))) as caught:
        data.fetch("mnist", dest=tmp_path)
    assert "Debian" not in str(caught.value)
    with pytest.raises(pn.DataError, match="install Debian's dataset-fashion-mnist package"):
        data.find_file("fashion-mnist", STEM)


def test_shipped_digest_matches_the_real_fashion_mnist_file(monkeypatch, tmp_path):
    """Debian's .gz has the upstream deflate stream with a shorter gzip header (no file
    name); rebuilding upstream's header (flag FNAME, its mtime) gives upstream's bytes."""
    debian = Path("/usr/share/datasets/fashion-mnist") / (STEM + ".gz")
    if not debian.is_file():
        pytest.skip("Debian's dataset-fashion-mnist is not installed")
    body = debian.read_bytes()[10:]
    upstream = (b"\x1f\x8b\x08\x08" + struct.pack("<I", 1504176627) + b"\x00\x03"
                + STEM.encode() + b"\x00" + body)
    monkeypatch.setattr("portanet.config.data_dirs", lambda: [tmp_path])
    monkeypatch.setitem(data.DATASETS["fashion-mnist"], "files",
                        {STEM: data.DATASETS["fashion-mnist"]["files"][STEM]})
    monkeypatch.setattr(urllib.request, "urlopen", lambda url, timeout: Response(upstream))
    data.fetch("fashion-mnist", dest=tmp_path)
    labels = read_idx(tmp_path / "fashion-mnist" / (STEM + ".gz"))
    assert labels.shape == (10000,) and np.array_equal(np.bincount(labels), [1000] * 10)
