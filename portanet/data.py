"""Datasets: the seed's 2-D coordinates and IDX files (MNIST, Fashion-MNIST).

IDX files are looked for, in order, in $PORTANET_DATA/<name>, ~/.cache/portanet/<name>
and /usr/share/datasets/<name> (Debian's dataset-fashion-mnist package installs there),
gzipped or raw. Nothing is downloaded unless asked (load_dataset(..., download=True)).
"""
import gzip
import hashlib
import shutil
import struct
import sys
import urllib.request
from pathlib import Path

import numpy as np

from . import config
from .errors import DataError

_IDX_TYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}

# file stem -> sha256 of the *decompressed* file, so any gzip of the same data verifies
DATASETS = {
    "fashion-mnist": {
        "url": "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
        "files": {
            "train-images-idx3-ubyte": "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
            "train-labels-idx1-ubyte": "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
            "t10k-images-idx3-ubyte": "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
            "t10k-labels-idx1-ubyte": "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
        },
    },
    "mnist": {
        "url": "https://ossci-datasets.s3.amazonaws.com/mnist/",
        "files": {"train-images-idx3-ubyte": None, "train-labels-idx1-ubyte": None,
                  "t10k-images-idx3-ubyte": None, "t10k-labels-idx1-ubyte": None},
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
    """An IDX file (gzip or raw) as a NumPy array, checking magic number and size."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            raw = f.read()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise DataError(f"{path}: cannot read ({e}); the file is damaged: delete it and "
                        f"fetch it again") from e
    return _parse_idx(raw, path)


def _parse_idx(raw, path):
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_TYPES:
        raise DataError(f"{path}: not an IDX file (bad magic number {raw[:4].hex()}); "
                        f"expected 0000 08 0n for an MNIST-style file")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if ndim == 0 or len(raw) < header:
        raise DataError(f"{path}: IDX header is truncated ({len(raw)} bytes)")
    dims = struct.unpack(">" + "I" * ndim, raw[4:header])
    dtype = np.dtype(_IDX_TYPES[raw[2]])
    expected = header + int(np.prod(dims)) * dtype.itemsize
    if len(raw) != expected:
        raise DataError(f"{path}: IDX header says shape {dims} ({expected} bytes) but the "
                        f"file has {len(raw)} bytes: it is truncated or corrupt, fetch it again")
    return np.frombuffer(raw, dtype, offset=header).reshape(dims).astype(dtype.newbyteorder("="))


def find_file(name, stem):
    """The path of <stem> or <stem>.gz for dataset `name`, or a DataError saying where
    to put it."""
    tried = []
    for base in config.data_dirs():
        for candidate in (base / name / stem, base / name / (stem + ".gz")):
            tried.append(str(candidate))
            if candidate.is_file():
                return candidate
    raise DataError(f"dataset {name!r}: {stem} not found. Looked in:\n  " + "\n  ".join(tried)
                    + f"\nPut the IDX files (gzipped or not) in one of those folders, install "
                      f"Debian's dataset-{name} package, or call load_dataset({name!r}, "
                      f"download=True) / `portanet train --download`.")


def load_dataset(name, download=False, flatten=False):
    """(x_train, y_train), (x_test, y_test) of MNIST or Fashion-MNIST: images float32 in
    [0, 1] shaped (N, 1, 28, 28) (or (N, 784) with flatten=True), labels int64."""
    if name == "coordinates":
        return coordinates()
    if name not in DATASETS:
        raise DataError(f"unknown dataset {name!r}: use one of coordinates, "
                        f"{', '.join(DATASETS)}")
    if download:
        fetch(name)
    parts = {}
    for stem in DATASETS[name]["files"]:
        parts[stem] = read_idx(find_file(name, stem))
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
    """Download a dataset's missing files into ~/.cache/portanet/<name>, with a progress
    bar, checking each file's checksum."""
    dest = Path(dest or Path.home() / ".cache" / "portanet") / name
    dest.mkdir(parents=True, exist_ok=True)
    spec = DATASETS[name]
    for stem, digest in spec["files"].items():
        try:
            find_file(name, stem)
            continue
        except DataError:
            pass
        target = dest / (stem + ".gz")
        part = target.with_suffix(".part")
        url = spec["url"] + stem + ".gz"
        with urllib.request.urlopen(url, timeout=60) as r, open(part, "wb") as f:
            total = int(r.headers.get("Content-Length") or 0)
            done = 0
            while chunk := r.read(1 << 16):
                f.write(chunk)
                done += len(chunk)
                _progress(stem, done, total)
        print(file=sys.stderr)
        if digest and hashlib.sha256(gzip.decompress(part.read_bytes())).hexdigest() != digest:
            part.unlink()
            raise DataError(f"{url}: checksum mismatch; the download was damaged, try again")
        shutil.move(part, target)


def _progress(label, done, total):
    if total:
        n = int(30 * done / total)
        print(f"\r{label} [{'#' * n}{'.' * (30 - n)}] {done >> 10} / {total >> 10} KiB",
              end="", file=sys.stderr)
