"""An ONNX file read and checked by portanet before any of it is used.

`read` takes a path: a regular file of at most MAX_FILE_BYTES, stat'ed before it is opened
and opened without blocking, parsed by the onnx package without its external data, which
`read_external` then reads itself: each tensor's data a regular file inside the model's
folder (links resolved), its bytes within the file and as many as its type and shape take,
no two tensors on the same bytes. Every refusal is a ModelFileError naming the file and the
tensor. What the graph means is onnx_graph.py's.
"""
import io
import math
import os

import numpy as np

from . import files
from .errors import ModelFileError

# protobuf's limit (a larger model keeps its weights in external data files)
MAX_FILE_BYTES = 2 << 30


def read(onnx, path):
    """The ModelProto in the file at `path`, its external data read (read_external). The
    file is stat'ed before it is opened and opened without blocking, so that a FIFO or a
    device is refused, never read."""
    what = f"{path} as an ONNX model"
    try:
        _check_regular(path, os.stat(path))
        with _open(path) as f:
            info = os.fstat(f.fileno())         # what was opened, were it swapped since
            _check_regular(path, info)
            if info.st_size > MAX_FILE_BYTES:
                raise ModelFileError(
                    f"{path} is {info.st_size / 2**30:.1f} GiB, more than the "
                    f"{MAX_FILE_BYTES >> 30} GiB an ONNX file can be (protobuf's limit): a "
                    f"larger model keeps its weights in external data files beside it")
            data = f.read(info.st_size)
    except OSError as e:                        # missing, unreadable
        raise ModelFileError(f"cannot read {what}: {e}") from e
    # the format onnx.load would take from the name (.onnx: protobuf; .txtpb, .json: text)
    registry = getattr(getattr(onnx, "serialization", None), "registry", None)
    fmt = registry and registry.get_format_from_file_extension(os.path.splitext(path)[1])
    try:
        model = onnx.load_model(io.BytesIO(data), load_external_data=False,
                                **({"format": fmt} if fmt else {}))
    except ValueError as e:
        raise ModelFileError(f"cannot read {what}: {e}") from e
    except Exception as e:      # protobuf's DecodeError is no OSError or ValueError
        raise ModelFileError(f"{path} is not an ONNX model ({type(e).__name__}: {e})") from e
    read_external(onnx, model, os.path.dirname(os.path.abspath(path)), path)
    return model


def _open(path, flags=0):
    """The file at path opened to read without blocking: a FIFO that no one writes returns
    at once (and is then refused, by its fstat)."""
    flags |= os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    return os.fdopen(os.open(path, flags), "rb")


def _check_regular(path, info):
    """A ModelFileError unless os.stat's `info` of the model's path is a regular file's."""
    kind = files.kind_of(info.st_mode)
    if kind == "a folder":
        raise ModelFileError(f"{path} is a folder, not a regular file: give the ONNX file's "
                             f"path")
    if kind:
        raise ModelFileError(f"{path} is not a regular file ({kind}): give the path of an "
                             f"ONNX file")


def _tensors(model):
    """Every TensorProto of a model: the initializers and attributes of its graph and of
    the graphs inside its nodes (walked without recursion)."""
    graphs = [model.graph]
    while graphs:
        graph = graphs.pop()
        yield from graph.initializer
        for sparse in graph.sparse_initializer:
            yield from (sparse.values, sparse.indices)
        for node in graph.node:
            for a in node.attribute:
                if a.HasField("t"):
                    yield a.t
                yield from a.tensors
                sparse = list(a.sparse_tensors)
                if a.HasField("sparse_tensor"):
                    sparse.append(a.sparse_tensor)
                for tensor in sparse:
                    yield from (tensor.values, tensor.indices)
                if a.HasField("g"):
                    graphs.append(a.g)
                graphs.extend(a.graphs)


def read_external(onnx, model, folder, where):
    """Read the model's external data into its tensors, checked by portanet itself
    whatever the onnx package checks: each location a relative path to a regular file
    inside `folder` once links are resolved, its offset and length within the file, the
    length what the tensor's type and shape take, and no two tensors on the same bytes
    (so that the bytes read are at most the files' sizes). folder None (a ModelProto in
    memory): external data are refused, there is no folder to read them from."""
    external = [t for t in _tensors(model) if t.data_location == onnx.TensorProto.EXTERNAL]
    if not external:
        return
    root = None if folder is None else os.path.realpath(folder)
    spans = {}                  # real path -> (its os.stat, [(offset, end, tensor)])
    for t in external:
        entries = {e.key: e.value for e in t.external_data}
        location = entries.get("location", "")
        say = f"{where}: tensor {t.name!r} takes its data from {location!r}"
        if root is None:
            raise ModelFileError(f"{where}: tensor {t.name!r} has its data in an external "
                                 f"file ({location!r}); give the model's path, not a "
                                 f"ModelProto, so that portanet reads it from the model's "
                                 f"folder")
        if not location or "\0" in location:
            raise ModelFileError(f"{say}, which names no file: the model is damaged")
        real = os.path.realpath(os.path.join(root, location))
        if os.path.isabs(location) or os.path.commonpath([root, real]) != root:
            raise ModelFileError(
                f"{say}, which is {real}, outside the model's folder {root}: external "
                f"data must be files in the model's folder, named relative to it (no "
                f"absolute path, '..' or link leading out)")
        try:
            info = os.stat(real)
        except OSError as e:
            raise ModelFileError(f"{say}, which cannot be read: {e.strerror or e}") from e
        if files.kind_of(info.st_mode):
            raise ModelFileError(f"{say}, which is not a regular file "
                                 f"({files.kind_of(info.st_mode)}): "
                                 f"external data are files in the model's folder; the "
                                 f"model is damaged")
        size = info.st_size
        offset, length = (_whole(say, key, entries.get(key)) for key in ("offset", "length"))
        offset = offset or 0
        length = size - offset if length is None else length
        if offset + length > size:
            raise ModelFileError(f"{say}: bytes {offset} to {offset + length}, past the end "
                                 f"of its {size} bytes: the model or its data is damaged "
                                 f"(a copy cut short?)")
        need, kind = _tensor_bytes(onnx, t, say)
        if length != need:
            raise ModelFileError(f"{say}: {length} bytes, but {kind} take {need} bytes: the "
                                 f"model or its data is damaged")
        spans.setdefault(real, (info, []))[1].append((offset, offset + length, t))
    for real, (info, taken) in spans.items():
        taken.sort(key=lambda span: span[:2])
        for (_, end, first), (start, then_end, then) in zip(taken, taken[1:]):
            if start < end:
                raise ModelFileError(f"{where}: tensor {then.name!r} takes bytes {start} to "
                                     f"{then_end} of {real}, the same bytes as "
                                     f"{first.name!r}: each tensor's data are its own; the "
                                     f"model is damaged or forged")
        try:
            with _open(real, getattr(os, "O_NOFOLLOW", 0)) as f:
                now = os.fstat(f.fileno())
                if (now.st_dev, now.st_ino) != (info.st_dev, info.st_ino):
                    raise ModelFileError(f"{where}: {real} was replaced while the model's "
                                         f"external data were checked; read it again")
                for start, end, t in taken:
                    f.seek(start)
                    data = f.read(end - start)
                    if len(data) != end - start:
                        raise ModelFileError(f"{where}: {real} ended before the data of "
                                             f"tensor {t.name!r}: it changed while read")
                    t.raw_data = data
                    t.data_location = onnx.TensorProto.DEFAULT
                    del t.external_data[:]
        except OSError as e:
            raise ModelFileError(f"{where}: cannot read the external data {real}: "
                                 f"{e.strerror or e}") from e


def _whole(say, key, text):
    """An external data entry's offset or length: None where absent, else a whole number
    >= 0."""
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise ModelFileError(f"{say}: its {key} {text!r} is not a whole number >= 0: the "
                             f"model is damaged")
    return value


# ONNX's types of fewer than 8 bits, packed into bytes
_BITS = {"INT4": 4, "UINT4": 4, "FLOAT4E2M1": 4, "INT2": 2, "UINT2": 2}


def _tensor_bytes(onnx, t, say):
    """(the bytes a tensor of its type and shape takes, "3 x 4 float32")."""
    dims = list(t.dims)
    known = t.data_type in onnx.TensorProto.DataType.values()
    type_name = onnx.TensorProto.DataType.Name(t.data_type) if known else str(t.data_type)
    if not known or any(d < 0 for d in dims) or type_name in ("UNDEFINED", "STRING"):
        raise ModelFileError(f"{say}: a tensor of type {type_name} and shape {dims}, which "
                             f"external data cannot hold: the model is damaged")
    if type_name in _BITS:
        bits, name = _BITS[type_name], type_name.lower()
    else:
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type))
        bits, name = 8 * dtype.itemsize, dtype.name
    shape = " x ".join(map(str, dims)) or "a scalar"
    return -(-math.prod(dims) * bits // 8), f"{shape} {name}"
