"""Datasets: the seed's 2-D coordinates, IDX files (MNIST, Fashion-MNIST), and text
corpora for language models (text.py: Shakespeare).

IDX files are looked for, in order, in $PORTANET_DATA/<name>, ~/.cache/portanet/<name>
and /usr/share/datasets/<name> (Debian's dataset-fashion-mnist package installs there),
gzipped or raw. Nothing is downloaded unless asked (load_dataset(..., download=True)),
and a download is kept only if its sha256 is the one listed here.
"""
import gzip
import hashlib
import http.client
import math
import os
import struct
import sys
import urllib.error
import urllib.request
import zlib
from pathlib import Path

import numpy as np

from . import config, files
from .errors import DataError, InputError

_IDX_TYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}

# Deflate codes at best 258 repeated bytes in 2 bits, so a gzip file never inflates to
# more than 1032 times its size: an IDX header claiming more is lying, and is refused
# before anything is allocated or inflated.
_DEFLATE_MAX_RATIO = 1032

# sha256, size and name of each official .gz file, in sha256sum's layout. A download is
# hashed as it arrives and stored only if it matches, so nothing unverified is kept or
# inflated. Digests: tensorflow/datasets, tensorflow_datasets/url_checksums/mnist.txt and
# fashion_mnist.txt; the Fashion-MNIST files are the blobs of data/fashion/ at the commit
# named in the URL. Local files are not checked against these: Debian's Fashion-MNIST
# has the same deflate streams under a shorter gzip header, so other bytes.
_FASHION_MNIST_GZ = """
3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84 26421880 train-images-idx3-ubyte.gz
a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845    29515 train-labels-idx1-ubyte.gz
346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073  4422102 t10k-images-idx3-ubyte.gz
67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5     5148 t10k-labels-idx1-ubyte.gz
"""
_MNIST_GZ = """
440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609  9912422 train-images-idx3-ubyte.gz
3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c    28881 train-labels-idx1-ubyte.gz
8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6  1648877 t10k-images-idx3-ubyte.gz
f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6     4542 t10k-labels-idx1-ubyte.gz
"""


def _checksums(text):
    """{stem: (bytes, sha256)} from lines of 'sha256 bytes stem.gz'."""
    return {file.removesuffix(".gz"): (int(size), digest)
            for digest, size, file in map(str.split, text.strip().splitlines())}


DATASETS = {
    "fashion-mnist": {
        "url": "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/"
               "b2617bb6d3ffa2e429640350f613e3291e10b141/data/fashion/",
        "debian": "dataset-fashion-mnist",
        "files": _checksums(_FASHION_MNIST_GZ),
    },
    "mnist": {  # not packaged by Debian
        "url": "https://ossci-datasets.s3.amazonaws.com/mnist/",
        "files": _checksums(_MNIST_GZ),
    },
}


def coordinates(n_train=4000, n_test=1000, seed=0):
    """The seed's toy problem: points in [-1, 1]^2, label 1 in quadrants 1 and 3
    (x.y > 0), 0 in quadrants 2 and 4. Returns (x_train, y_train), (x_test, y_test)."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (n_train + n_test, 2)).astype(np.float32)
    y = (x[:, 0] * x[:, 1] > 0).astype(np.float32)[:, None]
    return (x[:n_train], y[:n_train]), (x[n_train:], y[n_train:])


def read_idx(path):
    """An IDX file (gzip or raw) as a NumPy array. It is streamed: the header says how
    many bytes the body has, exactly those are read and the file must end there, so a
    damaged or hostile file (a gzip bomb) costs no more than its header declares."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            gzipped = f.read(2) == b"\x1f\x8b"
            f.seek(0)
            limit = os.fstat(f.fileno()).st_size * (_DEFLATE_MAX_RATIO if gzipped else 1)
            return _read_idx(gzip.GzipFile(fileobj=f) if gzipped else f, path, limit)
    except (OSError, EOFError, zlib.error, struct.error, ValueError) as e:
        # OSError covers gzip.BadGzipFile (bad header, CRC or length)
        raise DataError(f"{path}: cannot read ({e}); the file is damaged: delete it and "
                        f"fetch it again") from e


def _read_idx(f, path, limit):
    magic = f.read(4)
    if len(magic) < 4 or magic[:2] != b"\0\0" or magic[2] not in _IDX_TYPES:
        raise DataError(f"{path}: not an IDX file (bad magic number {magic.hex()}); "
                        f"expected 0000 08 0n for an MNIST-style file")
    ndim = magic[3]
    header = f.read(4 * ndim)
    if ndim == 0 or len(header) < 4 * ndim:
        raise DataError(f"{path}: IDX header is truncated ({4 + len(header)} bytes)")
    dims = struct.unpack(f">{ndim}I", header)
    dtype = np.dtype(_IDX_TYPES[magic[2]])
    size = math.prod(dims) * dtype.itemsize  # Python ints: np.prod wraps round at 2**63
    total = 4 + len(header) + size
    damaged = (f"{path}: IDX header says shape {dims} ({total} bytes with the header) but "
               f"the file {{}}: it is truncated or corrupt, delete it and fetch it again")
    if total > limit:
        raise DataError(damaged.format(f"holds at most {limit} bytes"))
    body = f.read(size)
    if len(body) < size:
        raise DataError(damaged.format(f"has {total - size + len(body)}"))
    if f.read(1):
        raise DataError(damaged.format("has more"))
    return np.frombuffer(body, dtype).reshape(dims).astype(dtype.newbyteorder("="))


def _spec(name):
    if name not in DATASETS:
        raise DataError(f"unknown dataset {name!r}: use one of coordinates, "
                        f"{', '.join(DATASETS)}, shakespeare")
    return DATASETS[name]


def _candidates(name, stem):
    return [base / name / file for base in config.data_dirs() for file in (stem, stem + ".gz")]


def _install_hint(name):
    debian = _spec(name).get("debian")
    return f", install Debian's {debian} package" if debian else ""


def find_file(name, stem):
    """The path of <stem> or <stem>.gz for dataset `name`, or a DataError saying where
    to put it."""
    tried = _candidates(name, stem)
    for candidate in tried:
        if candidate.is_file():
            return candidate
    raise DataError(f"dataset {name!r}: {stem} not found. Looked in:\n  "
                    + "\n  ".join(map(str, tried))
                    + f"\nPut the IDX files (gzipped or not) in one of those folders"
                      f"{_install_hint(name)}, or call load_dataset({name!r}, "
                      f"download=True) / `portanet train --download`.")


def load_dataset(name, download=False, flatten=False, context=None, stride=None):
    """(x_train, y_train), (x_test, y_test) of MNIST or Fashion-MNIST: images float32 in
    [0, 1] shaped (N, 1, 28, 28) (or (N, 784) with flatten=True), labels int64. For a
    text corpus ("shakespeare"), windows of `context` character ids (N, context) and the
    next character of each, from its first nine tenths and its last tenth (text.windows;
    stride: tokens between windows, default context; text.characters gives the
    vocabulary)."""
    if name == "coordinates":
        return coordinates()
    from . import text
    if name in text.CORPORA:
        if download:
            raise DataError(f"dataset {name!r} is not downloaded by portanet: {text.FETCH}")
        if context is None:
            raise InputError(f"dataset {name!r} is windows of text: give context= (the "
                             f"tokens a window holds, e.g. 256)")
        return text.windows(name, context, stride)
    spec = _spec(name)
    if download:
        fetch(name)
    parts = {stem: read_idx(find_file(name, stem)) for stem in spec["files"]}
    out = []
    for split in ("train", "t10k"):
        images, labels = parts[f"{split}-images-idx3-ubyte"], parts[f"{split}-labels-idx1-ubyte"]
        if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
            raise DataError(f"dataset {name!r}: {split} images {images.shape} and labels "
                            f"{labels.shape} do not match")
        x = (images.astype(np.float32) / 255.0)[:, None]
        out.append((x.reshape(len(x), -1) if flatten else x, labels.astype(np.int64)))
    return tuple(out)


def fetch(name, dest=None):
    """Download a dataset's missing files into ~/.cache/portanet/<name> (or dest/<name>)
    with a progress bar. Each file is hashed as it arrives and moved into place only if
    its sha256 is the known one; a failure leaves no partial file behind."""
    spec = _spec(name)
    dest = Path(dest or Path.home() / ".cache" / "portanet") / name
    dest.mkdir(parents=True, exist_ok=True)
    for stem, (size, digest) in spec["files"].items():
        if any(candidate.is_file() for candidate in _candidates(name, stem)):
            continue
        url = spec["url"] + stem + ".gz"
        if not digest:
            raise DataError(f"{url}: no sha256 is known for it, and an unverifiable "
                            f"file is never stored; put the file in {dest} yourself")

        def save(part):
            try:
                got = _download(url, part, size, stem)
            except (OSError, http.client.HTTPException) as e:
                # URLError, HTTPError, socket.timeout and ConnectionError are all OSErrors
                reason = e.reason if type(e) is urllib.error.URLError else e  # no "<urlopen "
                folders = ", ".join(str(base / name) for base in config.data_dirs())
                raise DataError(f"cannot download {url} ({reason}). Without network: put the "
                                f"IDX files in one of {folders}{_install_hint(name)}; or "
                                f"retry with network.") from e
            if got != digest:
                raise DataError(f"{url}: sha256 {got} is not the expected {digest}: the "
                                f"download is damaged or the file changed; try again")

        # moved into place only once verified, by the rule every portanet file follows
        files.write_atomically(dest / (stem + ".gz"), save, f"the dataset file {stem}.gz",
                               DataError)


def _download(url, part, size, label):
    """Stream url into part (at most size + 1 bytes: a longer file cannot match anyway)
    and return the sha256 of what arrived."""
    digest = hashlib.sha256()
    done = 0
    try:
        with urllib.request.urlopen(url, timeout=60) as r, open(part, "wb") as f:
            while chunk := r.read(min(1 << 16, size + 1 - done)):
                digest.update(chunk)
                f.write(chunk)
                done += len(chunk)
                _progress(label, done, size)
    finally:
        if done:
            print(file=sys.stderr)  # end the progress line, also before an error message
    return digest.hexdigest()


def _progress(label, done, total):
    n = min(30, 30 * done // total)
    print(f"\r{label} [{'#' * n}{'.' * (30 - n)}] {done >> 10} / {total >> 10} KiB",
          end="", file=sys.stderr)
