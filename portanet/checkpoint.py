"""The file layer of portanet's model files: write one atomically, read one safely.

A model file is a safetensors file: an 8-byte little-endian header length, a JSON header
(tensor names, dtypes, shapes, offsets, and str -> str metadata), then the raw tensors.
We use it rather than .npz/pickle because reading one executes no code, nothing in it is
compressed (so nothing can inflate), and its header is parsed and checked (offsets cover
the file exactly, no overlaps, no size overflow) by the library's Rust reader before a
single tensor byte is read -- so the caller can compare names, shapes and sizes with what
it expects, and refuse, before allocating anything.

Files written by portanet 0.x ("portanet-model-1", an .npz) still load, through a reader
that trusts nothing in the zip: it reads each member's .npy header, never its data, until
a tensor is asked for.

    check_destination(path)                          before training: can we save there?
    write(path, architecture, tensors, metadata)     atomic, by files.write_atomically's rule
    with read(path, max_bytes) as f:                 header only
        f.architecture, f.metadata, f.entries        {name: Entry(dtype, shape)}
        f.tensor(name)                               one tensor, checked float and finite
"""
import json
import math
import os
import stat
import struct
import zipfile
import zlib
from pathlib import Path
from typing import NamedTuple

import numpy as np
import safetensors
import safetensors.numpy

from . import files
from .errors import ModelFileError

FORMAT = "portanet-model-2"
OLD_FORMAT = "portanet-model-1"   # the .npz that Sequential.save wrote before FORMAT

FLOAT_SIZES = (2, 4, 8)            # float16, float32, float64, in either byte order
ARCHITECTURE_MAX_BYTES = 1 << 20  # an architecture is a few KiB of JSON; cap before reading
_CHUNK = 1 << 24                  # .npz members are copied in 16 MiB pieces, never whole

# safetensors dtype codes NumPy can hold; the others (BF16, F8_*, F4...) are refused whole.
_ST_DTYPES = {code: np.dtype(t) for code, t in [
    ("F16", "<f2"), ("F32", "<f4"), ("F64", "<f8"), ("C64", "<c8"), ("BOOL", "?"),
    ("U8", "u1"), ("I8", "i1"), ("U16", "<u2"), ("I16", "<i2"), ("U32", "<u4"),
    ("I32", "<i4"), ("U64", "<u8"), ("I64", "<i8")]}

# What the errors say a model file is and how to make one.
_HOW = "save one with net.save(path)"


class Entry(NamedTuple):
    """One tensor as the file's header declares it; nothing of its data has been read."""
    dtype: np.dtype
    shape: tuple

    @property
    def nbytes(self):
        return math.prod(self.shape) * self.dtype.itemsize   # Python ints: no overflow


# -- writing -------------------------------------------------------------------------

# The writer rule is files.write_atomically's, one for every file portanet writes; these
# name it for model files.
_WHAT = "the model"


def check_destination(path):
    """The Path a model can be saved to, checked now rather than after hours of training.

    Raises ModelFileError naming the path and the fix when its folder is missing, is not a
    folder or is not writable, or when the path is an existing folder or special file."""
    return files.check_destination(path, _WHAT, ModelFileError)


def write(path, architecture, tensors, metadata=None):
    """Save atomically: after this returns, or fails, or the process is killed at any
    moment, `path` holds either the complete previous file or the complete new one.

    architecture: a JSON-able dict; tensors: {name: float16/32/64 array} (written
    little-endian, C-contiguous, in their own dtype); metadata: extra {str: str}.
    Raises ModelFileError (naming the path and the OS's reason) for a bad destination, a
    full disk, a file-size limit, a non-float or non-finite tensor; the previous file is
    left intact. KeyboardInterrupt propagates as itself, also after removing the temp.
    Returns the Path written (for a symlink, the file it points to)."""
    tensors = {name: _prepare(name, x) for name, x in tensors.items()}
    header = dict(metadata or {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in header.items()):
        raise TypeError("metadata must map str to str (safetensors stores text only)")
    header.update(format=FORMAT, architecture=json.dumps(architecture, allow_nan=False))
    return write_atomically(
        path, lambda tmp: safetensors.numpy.save_file(tensors, tmp, metadata=header))


def write_atomically(path, save, what=_WHAT):
    """files.write_atomically raising ModelFileError: save(temp_path) writes a file, which
    then replaces `path` atomically (model files, ONNX exports). Returns the Path written."""
    return files.write_atomically(path, save, what, ModelFileError)


def _prepare(name, x):
    x = np.asarray(x)
    if not _is_float(x.dtype):
        raise ModelFileError(f"cannot save tensor {name!r} of dtype {x.dtype}: a model file "
                             f"holds float16, float32 or float64 tensors")
    _check_finite(name, x, "cannot save: tensor")
    # safetensors writes an array's buffer as it lies in memory: a strided view would be
    # saved scrambled, without an error. Little-endian is the format's byte order.
    return np.ascontiguousarray(x, dtype=x.dtype.newbyteorder("<"))


# -- reading -------------------------------------------------------------------------


class ModelFile:
    """An open model file whose header has been read and checked, and no tensor yet.

    format: FORMAT or OLD_FORMAT; architecture: dict; metadata: the extra str -> str
    entries given to write(); entries: {name: Entry(dtype, shape)} from the header."""

    def __init__(self, path, format, architecture, metadata, entries, max_bytes):
        self.path, self.format = path, format
        self.architecture, self.metadata, self.entries = architecture, metadata, entries
        if max_bytes is not None:
            for name, e in entries.items():
                if e.nbytes > max_bytes:
                    raise ModelFileError(f"{path}: tensor {name!r} {e.shape} of {e.dtype} "
                                         f"needs {e.nbytes} bytes, more than the {max_bytes} "
                                         f"allowed; this file is not for this device")
            total = sum(e.nbytes for e in entries.values())
            if total > max_bytes:
                raise ModelFileError(f"{path}: its tensors need {total} bytes, more than the "
                                     f"{max_bytes} allowed; this file is not for this device")

    def tensor(self, name):
        """The tensor's data, read now (each call reads it again), as a native-order
        float array. Raises ModelFileError if it is missing, not float16/32/64 (bool,
        ints, complex, strings), holds NaN or inf, or its bytes cannot be read."""
        if name not in self.entries:
            raise ModelFileError(f"{self.path} has no tensor {name!r}; it has "
                                 f"{sorted(self.entries)}")
        dtype = self.entries[name].dtype
        if not _is_float(dtype):
            raise ModelFileError(f"{self.path}: tensor {name!r} has dtype {dtype}; a model "
                                 f"file holds float16, float32 or float64 tensors")
        try:
            x = self._read(name)
        except _FILE_ERRORS as e:
            raise ModelFileError(f"{self.path}: cannot read tensor {name!r} ({e}); the file "
                                 f"is damaged; {_HOW}") from e
        _check_finite(name, x, f"{self.path}: tensor")
        return x.astype(x.dtype.newbyteorder("="), copy=False)

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _SafetensorsFile(ModelFile):
    def __init__(self, path, max_bytes):
        # The pread backend, not mmap: with mmap, a file that another program truncates
        # while we read it kills the process with SIGBUS; pread gives a Python error.
        self._file = safetensors.safe_open(str(path), framework="numpy", backend="pread")
        try:
            metadata = dict(self._file.metadata() or {})
            if "format" not in metadata:
                raise ModelFileError(f"{path} is a safetensors file without portanet's "
                                     f"metadata, not a portanet model file; {_HOW}")
            format = metadata.pop("format")
            if format != FORMAT:
                raise ModelFileError(f"{path} is in format {format!r}, which this portanet "
                                     f"cannot read (it reads {FORMAT!r} and {OLD_FORMAT!r}); "
                                     f"upgrade portanet")
            architecture = _parse_architecture(path, metadata.pop("architecture", None))
            entries = {}
            for name in self._file.offset_keys():
                piece = self._file.get_slice(name)
                code = piece.get_dtype()
                if code not in _ST_DTYPES:
                    raise ModelFileError(f"{path}: tensor {name!r} has dtype {code}, which "
                                         f"portanet cannot load; a model file holds F16, F32 "
                                         f"or F64 tensors")
                entries[name] = Entry(_ST_DTYPES[code], tuple(piece.get_shape()))
            super().__init__(path, format, architecture, metadata, entries, max_bytes)
        except BaseException:
            self.close()
            raise

    def _read(self, name):
        return self._file.get_tensor(name)

    def close(self):
        self._file.__exit__(None, None, None)


class _NpzFile(ModelFile):
    """An OLD_FORMAT file: np.savez of an "architecture" uint8 member holding the JSON and
    float arrays "0.w", "0.b", ... Nothing is inflated before a tensor is asked for: a
    member's .npy header declares dtype and shape, the zip directory declares its size,
    and the two must agree (zipfile then stops inflating at that size)."""

    def __init__(self, path, max_bytes):
        self._zip = zipfile.ZipFile(path)
        try:
            self._members = {}     # name -> (ZipInfo, data offset in it, Fortran order)
            entries, architecture = {}, None
            infos = self._zip.infolist()
            if len({i.filename for i in infos}) != len(infos):
                raise ModelFileError(f"{path}: the zip holds two members of the same name; "
                                     f"it is damaged or forged")
            for info in infos:
                if not info.filename.endswith(".npy"):
                    raise ModelFileError(f"{path}: member {info.filename!r} is not a NumPy "
                                         f"array; not a portanet model file; {_HOW}")
                name = info.filename[:-len(".npy")]
                if name == "architecture" and info.file_size > ARCHITECTURE_MAX_BYTES:
                    raise ModelFileError(f"{path}: its architecture member is "
                                         f"{info.file_size} bytes, more than the "
                                         f"{ARCHITECTURE_MAX_BYTES} an architecture needs")
                entry, offset, fortran = self._header(path, info)
                if name == "architecture":
                    if entry.dtype != np.uint8 or len(entry.shape) != 1:
                        raise ModelFileError(f"{path}: its architecture member is "
                                             f"{entry.dtype} {entry.shape}, not JSON bytes")
                    with self._zip.open(info) as f:
                        architecture = f.read()[offset:]
                else:
                    entries[name], self._members[name] = entry, (info, offset, fortran)
            if architecture is None:
                raise ModelFileError(f"{path} is an .npz without an architecture, not a "
                                     f"portanet model file; {_HOW}")
            architecture = _parse_architecture(path, architecture)
            if architecture.get("format") != OLD_FORMAT:
                raise ModelFileError(f"{path}: unknown model format "
                                     f"{architecture.get('format')!r}, expected {OLD_FORMAT!r}")
            super().__init__(path, OLD_FORMAT, architecture, {}, entries, max_bytes)
        except BaseException:
            self.close()
            raise

    def _header(self, path, info):
        """(Entry, data offset, Fortran order) from the member's .npy header: at most a few
        KiB inflated (numpy refuses headers over 10000 bytes)."""
        with self._zip.open(info) as f:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            else:
                raise ModelFileError(f"{path}: member {info.filename!r} is .npy version "
                                     f"{version}, which portanet files never use")
            offset = f.tell()
        if dtype.hasobject:   # loading it would unpickle: run code from the file
            raise ModelFileError(f"{path}: member {info.filename!r} holds Python objects "
                                 f"(pickles), which portanet never loads")
        if any(n < 0 for n in shape):
            raise ModelFileError(f"{path}: member {info.filename!r} declares shape {shape}")
        entry = Entry(dtype, shape)
        if offset + entry.nbytes != info.file_size:
            raise ModelFileError(f"{path}: member {info.filename!r} declares {dtype} "
                                 f"{shape} ({entry.nbytes} bytes) but holds "
                                 f"{info.file_size - offset}; the file is damaged")
        return entry, offset, fortran

    def _read(self, name):
        info, offset, fortran = self._members[name]
        entry = self.entries[name]
        x = np.empty(math.prod(entry.shape), entry.dtype)
        raw = x.view(np.uint8)
        with self._zip.open(info) as f:
            f.read(offset)
            done = 0
            while done < len(raw):
                piece = f.read(min(_CHUNK, len(raw) - done))
                if not piece:
                    raise EOFError("the member ends early")
                raw[done:done + len(piece)] = np.frombuffer(piece, np.uint8)
                done += len(piece)
            f.read(1)   # reaching the member's end makes zipfile check its CRC
        return x.reshape(entry.shape[::-1]).T if fortran else x.reshape(entry.shape)

    def close(self):
        self._zip.close()


# Everything a damaged or forged file can make the parsers raise. MemoryError is not
# here: the size checks come before any allocation a file could make large.
_FILE_ERRORS = (OSError, EOFError, ValueError, TypeError, KeyError, IndexError,
                NotImplementedError, RuntimeError, struct.error, zlib.error, zipfile.BadZipFile,
                safetensors.SafetensorError)


def read(path, max_bytes=None):
    """Open a model file and check its header; read no tensor yet. Use as a context
    manager (or call .close()).

    The format is told by the first bytes, not the name: safetensors (FORMAT) or the old
    .npz (OLD_FORMAT). max_bytes: if given, the most bytes one tensor, and all together,
    may declare (the caller derives it from the device's memory).
    Raises ModelFileError naming the path for a missing file, a folder, an empty,
    truncated, random or foreign file (a plain .npy, an .npz without architecture), a
    header or architecture that does not parse (deep JSON nesting, bad UTF-8, not a
    dict), an unknown format, object (pickled) arrays, a member whose declared size does
    not match its size, or tensors declaring more than max_bytes."""
    try:
        info = os.stat(path)
        if stat.S_ISDIR(info.st_mode):
            raise ModelFileError(f"{path} is a folder, not a portanet model file; give the "
                                 f"file's path")
        if not stat.S_ISREG(info.st_mode):
            raise ModelFileError(f"{path} is not a regular file, not a portanet model file")
        with open(path, "rb") as f:
            head = f.read(9)
    except FileNotFoundError as e:
        raise ModelFileError(f"{path} does not exist; check the path, or {_HOW}") from e
    except OSError as e:
        raise ModelFileError(f"cannot open {path}: {e.strerror or e}") from e

    if not head:
        raise ModelFileError(f"{path} is empty (0 bytes), not a portanet model file (an "
                             f"interrupted save?); {_HOW}")
    if head.startswith(b"\x93NUMPY"):
        raise ModelFileError(f"{path} is a single NumPy array (.npy), not a portanet model "
                             f"file; {_HOW}")
    if head.startswith(b"PK"):
        opener = _NpzFile
    elif len(head) == 9 and head[8:9] == b"{":
        opener = _SafetensorsFile
    else:
        raise ModelFileError(f"{path} is not a portanet model file (it starts with "
                             f"{head!r}); {_HOW}")
    try:
        return opener(path, max_bytes)
    except _FILE_ERRORS as e:
        raise ModelFileError(f"{path} is not a readable portanet model file ({e}); it is "
                             f"truncated or damaged; {_HOW}") from e


def _parse_architecture(path, raw):
    if raw is None:
        raise ModelFileError(f"{path} holds no architecture, not a portanet model file; "
                             f"{_HOW}")

    def not_json(reason):
        return ModelFileError(f"{path}: its architecture is not valid JSON for portanet "
                              f"({reason}); {_HOW}")
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError as e:
        raise not_json(f"{type(e).__name__}: the file is damaged") from e
    # a forged "[[[[..." is refused by its depth before Python's parser recurses into it
    architecture = files.parse_json(text, "it", error=not_json)
    if not isinstance(architecture, dict):
        raise ModelFileError(f"{path}: its architecture is a {type(architecture).__name__}, "
                             f"not a JSON object; the file is damaged; {_HOW}")
    return architecture


def _is_float(dtype):
    return dtype.kind == "f" and dtype.itemsize in FLOAT_SIZES


def _check_finite(name, x, what):
    if x.dtype.kind == "f":
        finite = np.isfinite(x)
        if not finite.all():
            first = np.unravel_index(int(np.argmin(finite)), x.shape)
            raise ModelFileError(f"{what} {name!r} holds NaN or inf (first at index "
                                 f"{tuple(int(i) for i in first)}); the network diverged "
                                 f"or the file is damaged")
