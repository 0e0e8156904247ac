"""Networks made from files saved by portanet: portanet.load.

A file is read bounded by the device's memory (saving.max_bytes), its architecture checked
(saving.file_architecture), its layers built and their sizes bounded (_check_declared)
before the Sequential is made and allocates anything; its parameters are then written by
saving's one path (saving.write_parameters). This module sits above network.py, which it
builds; saving.py, below it, maps networks that exist.
"""
from . import checkpoint, layers as layer_module, saving
from .backends import device_for
from .errors import InputError, ModelFileError, ShapeError
from .memory import elements, size_text
from .network import Sequential, _input_shape


def load(path, device=None, dtype="float32", precision=None, loss_scale="auto"):
    """A network rebuilt from a file written by Sequential.save, on any device, in any
    precision it computes (None: a Backend's own, else PORTANET_PRECISION, else fp32): the
    file holds float32 weights whatever the precision they were trained in, as PyTorch's
    state dicts do. loss_scale as Sequential's."""
    backend = device_for(device, dtype, precision)
    with checkpoint.read(path, max_bytes=saving.max_bytes(backend)) as f:
        arch = saving.file_architecture(f.architecture, path)
        try:
            layers = [layer_module.from_config(name, cfg) for name, cfg in arch["layers"]]
            _check_declared(layers, arch["input_shape"], f, path, backend)
            net = Sequential(layers, arch["input_shape"], arch["loss"], backend, dtype,
                             loss_scale=loss_scale)
        except (InputError, ShapeError) as e:
            raise ModelFileError(f"{path}: the architecture in the file is not valid: {e}") from e
        saving.write_parameters(net, f, path)
    return net


def _check_declared(layers, input_shape, f, path, backend):
    """The sizes the file's architecture declares, bounded before the network is made
    (Sequential allocates every parameter and draws its initial values): the layers'
    shapes worked out (configure: nothing allocated), their parameters and one sample's
    activations within the device's memory, and each parameter and saved buffer one of the
    file's tensors, of its shape. So no layer is larger than the bytes the file holds, and
    a file that does not hold its network is refused before any of it is allocated."""
    shape = _input_shape(input_shape)
    sample = elements(shape)
    for layer in layers:
        shape = layer.configure(backend, shape)
    walked = list(layer_module.walk(layers))
    declared = {f"{p}.{name}": tuple(int(n) for n in dims) for p, layer in walked
                for name, dims in {**layer.parameters(), **layer.buffers()}.items()}
    itemsize, cap = backend.dtype.itemsize, saving.max_bytes(backend)
    weights = sum(elements(dims) for dims in declared.values()) * itemsize
    sample = (sample + sum(elements(layer.out_shape) for _, layer in walked)) * itemsize
    if weights + sample > cap:
        raise ModelFileError(
            f"{path}: its architecture declares {size_text(weights)} of parameters and "
            f"{size_text(sample)} for one sample's activations, more than the "
            f"{size_text(cap)} {backend.name} has; this file is not for this device")
    found = {name: tuple(e.shape) for name, e in f.entries.items()
             if not name.startswith(saving.TRAINING)}
    saving.check_tensors(path, found, declared, "the parameters of the layers it declares",
                         "the layer's")
