"""What every layer shares: the Layer protocol, walking a network's layers, parameter
views, and the bounds a layer's arguments are held to."""
import functools
import reprlib

from .. import distributed
from ..backends.base import ACTIVATIONS
from ..errors import InputError, check_count
from ..memory import elements
from ..rng import key_array, mix32


# How deep Residual blocks may nest, one inside another (a ResNet's are 1 deep): far above
# any real network, and low enough that everything that walks a network recursively (its
# description, its saved architecture, configure, walk) stays within Python's recursion and
# its file's JSON within files.MAX_JSON_DEPTH (3 levels a block).
MAX_NESTING = 16

class Tokens(tuple):
    """A per-sample shape (features, T) that is a sequence of T tokens, as Embedding makes
    it and the layers after it keep it: Dense and LayerNorm take it a token at a time. A
    plain shape of two axes (an input of (N, A, B) floats) is no sequence: Dense flattens
    it as any other."""


# backward's delta_in_z where the loss kernel left the last layer's delta in its z and also
# formed its bias gradient (SoftmaxCrossEntropy.forward in losses.py); true, so other layers take it as True
DELTA_AND_BIAS = "delta and bias"


class Layer:
    trainable = False
    capturable = True           # its step launches the same work every time (see train_step)
    keeps_input = False         # its products read a_prev, kept (keep_operands) until read
    output_kept = False         # the next layer keeps our output so (set by its network)
    output_summed = False       # a Residual block makes its sum over our output (set by it)
    half_storage = False        # its z and a may be 16-bit, and it reads a 16-bit a_prev
    #                             (Dense, Conv2D, BatchNorm, Residual blocks of these:
    #                             docs/storage16.md)
    half_alike = False          # and it stores its output as it reads its input (BatchNorm,
    #                             Residual): 16 bits only where both are
    half_out = False            # its z and a are 16-bit (set by its network: bf16 or fp16,
    #                             and the next layer reads them so)
    half_in = False             # its a_prev is 16-bit (the previous layer's, or the batch)
    half_grad = False           # and the previous layer's: dL/da_prev goes to one of the
    #                             network's float32 products buffers, where that layer reads it
    half_slot = 0               # which of the two holds our sums and dL/da (half_out),
    grad_slot = 0               # and which our dL/da_prev (half_grad; set by the network)
    grad_in_place = True        # we read dL/da before we write dL/da_prev, so the two may
    #                             share a buffer (a pool reads one while it writes the other)
    passes_storage = False      # our output is stored as our input is (Flatten, the pools,
    #                             Dropout): a 16-bit input gives a 16-bit output
    is_view = False             # our output is a view of our input (Flatten)
    takes_ids = False           # first, it reads token ids (Embedding: inputs.check_x)
    nesting = 0                 # Residual blocks this layer is, or holds, one inside another
    decayed = ()                # parameters that weight decay applies to (listed first)

    def config(self):
        """The constructor arguments, for save files."""
        return {}

    def configure(self, backend, in_shape):
        """Shapes for inputs of per-sample shape `in_shape`; returns the output's. Nothing
        is allocated: the network plans memory from what the layer declares (parameters,
        buffers, batch_buffers, shared_sizes) and then allocates it."""
        self.backend = backend
        self.in_shape = in_shape if isinstance(in_shape, Tokens) else tuple(in_shape)
        self.out_shape = self.output_shape(self.in_shape)
        return self.out_shape

    def output_shape(self, in_shape):
        return in_shape

    def parameters(self):
        """{name: shape} of the trained parameters, the `decayed` ones first. The network
        keeps them in one flat vector per layer (`flat`), each name a view of it, so that
        an optimizer updates a layer in one launch."""
        return {}

    def buffers(self):
        """{name: shape} of state that is saved with the network but not trained
        (BatchNorm's running statistics)."""
        return {}

    def initial(self, rng):
        """{name: host array} of initial parameter and buffer values (missing names start
        at zero)."""
        return {}

    def batch_buffers(self, m):
        """{attribute: (elements, dtype or None for the real type)}: the layer's own batch
        buffers for up to m samples."""
        return {}

    def shared_sizes(self, m):
        """(ones, workspace) elements this layer needs from the network's shared buffers
        for a batch of m: the ones vector of bias gradients, the conv workspace."""
        return 0, 0

    def product_size(self, m):
        """Elements of the network's float32 products buffer half_slot this layer uses
        (half_out: its sums, dL/da): its output's, which a layer that stores its output
        in 16 bits takes there."""
        return elements(self.out_shape) * m if self.half_out and not self.is_view else 0

    def grad_size(self, m):
        """Elements of the network's float32 products buffer grad_slot this layer writes
        before dL/da_prev (BatchNorm's delta): the layer before sizes that buffer for
        dL/da_prev, but inside a Residual block the buffer may be the one the block's input
        gradient takes, of the block's input's size."""
        return 0

    def half_views(self, shared, da, da_prev):
        """(da, da_prev): where dL/da arrives and dL/da_prev goes, given as the arrays they
        take in real storage (a and a_prev, as the layer views them); where the layer
        stores 16 bits, views of the same shapes in the network's products buffers
        instead (half_out: buffer half_slot; half_grad: buffer grad_slot)."""
        products = shared.products
        if self.half_out:
            da = self.backend.view(products[self.half_slot], da.shape)
        if self.half_grad:
            da_prev = self.backend.view(products[self.grad_slot], da_prev.shape)
        return da, da_prev

    def products(self, m):
        """[(elements of a, of b, of c)] of the matrix products c = op(a) op(b) a vendor
        GEMM may make for this layer in a training step of m samples (at most): what a
        backend that copies their inputs (16-bit, or a transposed) needs room for
        (Backend.operand_bytes)."""
        return []

    def kept_operands(self, m):
        """Elements of each array the layer keeps (Backend.keep_operands) in a training
        step of m samples."""
        return []

    def sublayers(self):
        """[(name, layer)] of the layers inside this one (Residual's), in order."""
        return []

    def backward_order(self):
        """This layer and those inside it, in the order backward updates them."""
        return [self]

    def plan_half(self):
        """Where the layers inside this one store (half_in, half_out, half_grad) and which
        products buffers they use, once the network has set this one's."""

    def begin_step(self):
        """Host work before each training step, outside what a recorded step replays
        (Dropout writes its new key to the device)."""

    def bind(self, a_prev, m, shared):
        """Views for a batch of m samples: a_prev is the previous layer's output; shared
        holds the network's ones vector and workspace."""
        self.a_prev = a_prev
        self.m = m
        self.shared = shared

    def params(self):
        """{name: device array} of the parameters and buffers saved with the network."""
        return {name: getattr(self, name) for name in (*self.parameters(), *self.buffers())}

    def weights(self):
        """{name: view} of the parameters and saved buffers (BatchNorm's running statistics),
        lent to other libraries without a copy through DLPack: NumPy arrays on cpu, DLPack
        views on cuda (torch.from_dlpack(layer.weights()["w"]) is the layer's memory: a
        write there is the layer's). OpenCL cannot lend them: a DeviceError says so."""
        names = (*self.parameters(), *self.buffers()) if hasattr(self, "backend") else None
        arrays = {name: getattr(self, name, None) for name in names or ()}
        # the parameters are views of `flat`, which free() lets go of
        if names is None or any(x is None for x in arrays.values()) or (
                self.parameters() and getattr(self, "flat", None) is None):
            raise InputError(f"{self} holds no parameters now: weights() lends those of a "
                             f"layer in a Sequential, which has not been freed")
        return {name: self.backend.dlpack_view(x) for name, x in arrays.items()}

    @functools.cached_property
    def n_decay(self):
        """Elements of the flat parameter vector that weight decay applies to."""
        shapes = self.parameters()
        return sum(elements(shapes[name]) for name in self.decayed)

    def forward(self, training=True):
        raise NotImplementedError

    def backward(self, train, first, delta_in_z=False):
        """On entry self.a holds dL/da (or self.z the delta, if delta_in_z: True, or
        DELTA_AND_BIAS where the loss kernel formed the bias gradient as well); on exit
        a_prev holds dL/da_prev (unless first) and the parameters are updated: the layer
        writes its gradient products where train.gradient(self) says, and train.update(self)
        applies the optimizer (training.Step)."""
        raise NotImplementedError

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.config().items())
        return f"{type(self).__name__}({args})"


class Masks:
    """What a layer that draws dropout masks adds to the protocol (Dropout; attention with
    dropout): no mask is stored, a counter-based hash of (seed, step, element) draws it
    again for the backward, the same on every backend (rng.py). Each step's key is written
    to the device before the step (begin_step) into the layer's `_key`, where the kernels
    read it: a recorded step stays valid. The network numbers these layers (`stream`),
    which the key mixes in, so that several of one seed draw masks of their own; a
    checkpoint keeps each one's `step`."""
    stream = 0                  # this layer's number in its network (set by the network)
    step = 0                    # steps drawn so far
    key = 0                     # this step's key

    @property
    def draws_masks(self):
        """Whether it draws masks at all (a checkpoint keeps its step where it does)."""
        return True

    def begin_step(self):
        if not self.draws_masks:
            return
        self.step += 1
        # in a distributed job each rank its own masks (rank 0's are one process's): with
        # one key, every rank would drop the same units of its j-th sample
        group = distributed.current()
        rank = group.rank if group else 0
        self.key = mix32(self.seed * 0x9E3779B1 + mix32(self.step) + rank * 0x85EBCA6B
                         + self.stream * 0x27D4EB2F)
        self.backend.write(self._key, key_array(self.key))


def masking(layers):
    """[(path, layer)] of the layers under `layers` that draw masks (Masks.draws_masks)."""
    return [(path, layer) for path, layer in walk(layers)
            if isinstance(layer, Masks) and layer.draws_masks]


def _output_dtype(layer):
    """The dtype of a layer's output buffer: its backend's 16-bit storage where the network
    stores it so (half_out), else None (the real type)."""
    return layer.backend.storage_dtype if layer.half_out else None


def parameter_views(layer, flat):
    """{name: view} of a flat vector laid out as the layer's parameters (in the order of
    parameters(): the decayed ones first): the parameters themselves, or the optimizer's
    state and gradient alike."""
    views, offset = {}, 0
    for name, shape in layer.parameters().items():
        views[name] = layer.backend.view(flat, shape, offset)
        offset += elements(shape)
    return views


def walk(layers, prefix=""):
    """(name, layer) of every layer, those inside others included, parents first: the
    names of their parameters in save files ("0.w", "3.1.gamma", "3.proj.w")."""
    for i, layer in enumerate(layers):
        yield from walk_one(f"{prefix}{i}", layer)


def walk_one(name, layer):
    yield name, layer
    for sub, inner in layer.sublayers():
        yield from walk_one(f"{name}.{sub}", inner)


def _count(name, value, low, layer):
    """An integer argument of a layer; an activation given in its place gets a hint."""
    if isinstance(value, str) and value in ACTIVATIONS:
        raise InputError(f"{layer}: {name} must be a whole number, got {value!r}: an "
                         f"activation is passed as activation={value!r}")
    return check_count(f"{layer}: {name}", value, low)


def _rate(name, value, layer):
    """A dropout rate argument of a layer, a number in [0, 1), as a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise InputError(f"{layer}: {name} must be a number in [0, 1), got {value!r}")
    return float(value)




def nesting_error(depth, what):
    return InputError(f"{what} nest {depth} deep, more than the {MAX_NESTING} portanet "
                      f"builds (layers.MAX_NESTING); make the network flatter: blocks one "
                      f"after another rather than one inside another")


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother = 4, 80, 80


def _short(value):
    """repr(value) of a few levels and items: a file's values may be long or deep."""
    return _SHORT.repr(value)
