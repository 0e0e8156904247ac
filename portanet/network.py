"""Sequential networks: build, fit, evaluate, predict, save and load.

Users hand in arrays samples-first, (N, features) or (N, C, H, W): NumPy's, or any other
library's through DLPack (portanet/dlpack.py); each batch goes to the device as it is and is
laid out there (features, batch) by the backend's write_samples (or, where the array is on
the network's device already, write_samples_device, straight from its memory), and
predictions are transposed once on download. Batch buffers are sized
for the largest batch seen and viewed for smaller ones, so after the first step of a size
training allocates nothing.
"""
import functools
import inspect
import threading

import numpy as np

from . import precision as precisions
from . import (backends, config, distributed, dlpack, layers as layer_module, losses, optim,
               saving, training)
from .errors import InputError, OutOfMemoryError, PortanetError, ShapeError, check_count
from .memory import (Buffer, MemoryPlan, allocate, elements, largest_batch, refuse,
                     size_text as _size)
from .saving import checked_weights

# what evaluate and predict give their batch buffers by default (_inference_batch): LeNet
# then predicts 10000 images in batches of 1224, a plan of 388 MiB with the conv workspace
# (cpu), where one batch of 10000 had taken 5.8 GiB on an H100 (192 MiB, batches of 734,
# took 10 ms on an H100 against 9.3 for PyTorch's one batch: the fewer, the less each
# batch's host work costs)
INFERENCE_BYTES = 320 * 2**20

# the most the buffer that batches go through to the device (write_samples) takes: two
# halves, each a batch or, for larger batches, a part of whole samples
STAGING_BYTES = 16 * 2**20

# what the device's NaN and inf check holds while it has met none (_check_nonfinite)
NO_SAMPLE = 2**31 - 1

# the network's two float32 products buffers (Shared.products), by Layer.half_slot
PRODUCTS = ("_products", "_products1")

# the most pinned host memory predict's background downloads fill before it waits for them
PREDICTIONS_BYTES = 16 * 2**20


class Shared:
    """Buffers all layers of a network share: a ones vector (bias gradients by gemv), the
    conv workspace (patch matrices, at most CONV_WORKSPACE_BYTES) and in bf16 and fp16 the
    two float32 products buffers (16-bit layers' product sums and the gradients that reach
    them: Layer.half_slot says which, None where no layer takes it); workspace_holds is the
    id of the conv layer whose patch matrix it holds (an id, not the layer: no reference
    cycle, so a dropped network is freed at once, not at the next cycle collection)."""

    def __init__(self, ones, workspace, products=(None, None)):
        self.ones, self.workspace, self.workspace_holds = ones, workspace, None
        self.products = products


def _storage(layers, half):
    """Which arrays a network of `layers` stores in 16 bits, where `half` (bf16, fp16): what
    only the layers that read a 16-bit input read (half_storage: Dense, Conv2D, BatchNorm,
    Residual blocks of these), the batch where one reads it first and each one's z and a
    where another reads them, looking through the layers that store their output as their
    input is (passes_storage: Flatten, the pools, Dropout). BatchNorm and Residual blocks
    read and store alike (half_alike): 16 bits where what reads them does and their input
    is a 16-bit layer's, not the batch. Sets each layer's half_in, half_out and half_grad,
    and the products buffer each 16-bit layer's sums and gradients use (half_slot,
    grad_slot); returns whether the batch is stored so."""
    def reader(i):                  # the first layer after i that does not pass storage on
        j = i + 1
        while j < len(layers) and layers[j].passes_storage:
            j += 1
        return j if j < len(layers) else None

    reads = [False] * len(layers)   # reads[j]: layer j (not passing storage) reads 16 bits
    for j in reversed(range(len(layers))):
        after = reader(j)
        reads[j] = half and layers[j].half_storage and (
            not layers[j].half_alike or after is not None and reads[after])

    def read(j):
        return j is not None and reads[j]

    # the batch as it came where what reads it first reads and stores alike: BatchNorm put
    # first normalizes raw features, which 16 bits would round (bf16 steps by 4 near 1000;
    # fp16 ends at 65504), as autocast leaves a network's input float32
    first = reader(-1)
    stored = half_x = read(first) and not layers[first].half_alike
    from_layer = False              # whether the input is a layer's output, not the batch
    for i, layer in enumerate(layers):
        layer.half_in, layer.half_grad = stored, stored and from_layer
        if layer.passes_storage:
            layer.half_out = stored
        elif layer.half_alike:      # (read(i): what reads it reads 16 bits)
            layer.half_out = stored and read(i)
        else:
            layer.half_out = read(i) and read(reader(i))
        from_layer = from_layer or not layer.is_view
        stored = layer.half_out
    # dL/da of a 16-bit layer arrives in a products buffer, where the layer after it writes
    # its dL/da_prev; a layer that reads dL/da while it writes dL/da_prev (a pool, a
    # Residual block) takes it from one buffer into the other, so the two alternate there
    slot = 0
    for layer in reversed(layers):
        layer.half_slot = slot
        layer.grad_slot = slot = slot if layer.grad_in_place else 1 - slot
        layer.plan_half()           # (the layers inside it: Residual's)
    return half_x


class _Call:
    """One call of a network's public API (see Sequential, "Threads"): its lock held for
    the call, and a network that free() gave back refused. A class, not a
    contextlib.contextmanager: n_in and walk pass here several times a step."""
    __slots__ = ("net", "what")

    def __init__(self, net, what):
        self.net, self.what = net, what

    def __enter__(self):
        net = self.net
        net._lock.acquire()
        if net._freed:
            net._lock.release()
            raise PortanetError(f"Sequential.{self.what}: the network was freed: free() gave "
                                f"its device memory back, so it cannot be used any more; "
                                f"build or load it again (pn.load of a file it saved)")
        net._calls += 1

    def __exit__(self, *exc):
        self.net._calls -= 1
        self.net._lock.release()


def _held(function, what):
    """function (a method or a property's getter or setter) run as a _Call."""
    @functools.wraps(function)
    def held(net, *args, **kwargs):
        with _Call(net, what):
            return function(net, *args, **kwargs)
    held.held = True
    return held


def _guard(cls):
    """Every public method and property of cls, those it inherits included, run as a _Call
    (the one entry point of the API: a method added later is guarded without a word);
    free() takes the lock itself."""
    for name in dir(cls):
        member = inspect.getattr_static(cls, name)
        if name.startswith("_") or name == "free":
            continue
        if inspect.isfunction(member) and not getattr(member, "held", False):
            setattr(cls, name, _held(member, name))
        elif isinstance(member, property) and not getattr(member.fget, "held", False):
            setattr(cls, name, property(_held(member.fget, name),
                                        member.fset and _held(member.fset, name),
                                        member.fdel, member.__doc__))
    return cls


class Sequential:
    """A stack of layers trained with a fused loss and an optimizer (portanet.optim).

    >>> net = Sequential([Dense(30, "relu"), Dense(1, "sigmoid")], input_shape=2,
    ...                  loss="binary_cross_entropy", device="cpu")

    Memory is planned before it is allocated (`memory_plan`): a network or a batch that
    does not fit is refused with the numbers, and a failed call leaves the network as it
    was.

    Threads: a network may be used from several threads, one call at a time. Every public
    method and property holds the network's re-entrant lock for the whole call, as every
    backend operation holds the backend's: a fit, predict or evaluate shares the network's
    batch buffers, layer activations and optimizer state, so two at once would each undo
    the other's; one after the other, concurrent calls give what some serial order of them
    gives, bit for bit. A second thread's call waits for the first's to end (a predict
    waits for a whole fit); the lock is re-entrant, so a callback may predict, evaluate or
    save from inside fit. free() waits for a running call as well, and is refused from
    inside one (a callback's) that would go on with the buffers; after it every public
    method raises a PortanetError naming free(). For work in parallel, build one network
    per thread: their backend interleaves their operations.
    """

    def __init_subclass__(cls, **kwargs):
        """A subclass's public methods are guarded as Sequential's are (_guard)."""
        super().__init_subclass__(**kwargs)
        _guard(cls)

    def __init__(self, layers, input_shape, loss="softmax_cross_entropy", device=None,
                 dtype="float32", seed=0, precision=None, loss_scale="auto"):
        # one call at a time (see the class's docstring); _calls: how deep the holding
        # thread is in the network's calls
        self._lock, self._freed, self._calls = threading.RLock(), False, 0
        self.layers = list(layers) if isinstance(layers, (list, tuple)) else None
        if not self.layers:
            raise ShapeError(f"Sequential needs a non-empty list of layers, got {layers!r}")
        for layer in self.layers:
            if not isinstance(layer, layer_module.Layer):
                raise InputError(f"Sequential: {layer!r} is not a layer; give layer objects "
                                 f"such as pn.Dense(10, 'softmax')")
        self.input_shape = _input_shape(input_shape)
        self.loss = losses.get(loss)
        self.seed = check_count("seed", seed, 0)
        # precision: fp32, tf32, bf16 or fp16 (portanet/precision.py); None: a backend's
        # own, else PORTANET_PRECISION for float32, else fp32 (fp64 for float64)
        self.backend = backends.device_for(device, dtype, precision)
        # loss_scale: "auto" (dynamic in fp16), None, or an optim.LossScale
        self.loss_scaling = optim.loss_scale(loss_scale, self.backend.precision)
        shape = self.input_shape
        for layer in self.layers:
            shape = layer.configure(self.backend, shape)
        self.output_shape = shape
        self._check_output()
        # first[i]: layer i reads the network input directly, so it skips da_prev
        self._first = []
        seen_trainable = False
        for layer, after in zip(self.layers, self.layers[1:] + [None]):
            self._first.append(not seen_trainable)
            seen_trainable = seen_trainable or layer.trainable
            # the next layer keeps our output for its products (keep_operands)
            layer.output_kept = after is not None and after.keeps_input
        self._half_x = _storage(self.layers, self.backend.storage_dtype is not None)
        self.capacity, self.m = 0, None
        self._batch_bytes = None        # (a, b): batch buffers of a m + b bytes (_inference_batch)
        self._graphs = {}               # (m, optimizer, data on device, staged) -> recorded step
        #                                 (("predict" or "evaluate", m): a forward pass),
        #                                 None (seen once) or False (cannot be recorded)
        self._capturable = config.graphs() and all(l.capturable for l in self.layers)
        # layers with host work before each step (Dropout's key)
        self._stepped = [l for _, l in self.walk()
                         if type(l).begin_step is not layer_module.Layer.begin_step]
        self._batch = []                # (owner, Buffer, device array) of the batch buffers
        self._staging = None            # the batch buffer write_samples goes through
        self._products = self._products1 = None     # 16-bit layers' float32 sums (Shared)
        self._params = []               # the same for parameters and saved buffers
        self.optimizer_state = None     # training.OptimizerState, made by the first fit
        self.stop_training = False      # a callback sets it to end fit after this epoch
        for _, layer in self.walk():
            layer.state, layer.grad_views, layer.grad_flat = {}, {}, {}
        self._allocate_parameters(np.random.default_rng(self.seed))

    def _check_output(self):
        last = self.layers[-1]
        act = getattr(last, "activation", None)
        want = self.loss.output_activation
        if want and act != want:
            raise ShapeError(f"loss {self.loss.name} is fused with a {want} output, but the "
                             f"last layer {last} has activation {act!r}: use "
                             f"activation={want!r} there")
        for layer in self.layers:
            if getattr(layer, "activation", None) == "softmax" and (
                    layer is not last or self.loss.name != "softmax_cross_entropy"):
                raise ShapeError(f"{layer}: softmax is only supported as the output activation "
                                 f"with loss='softmax_cross_entropy'")
        if len(self.output_shape) != 1:
            raise ShapeError(f"the network's output has shape {self.output_shape} per sample; "
                             f"end with Flatten/Dense so it is a vector")

    @property
    def n_in(self):
        return elements(self.input_shape)

    @property
    def n_out(self):
        return self.output_shape[0]

    # -- memory: planned, then allocated all or nothing ----------------------------------

    def walk(self):
        """(path, layer) of every layer, those inside Residual blocks included: "0",
        "3.1", "3.proj"; the prefixes of their parameters' names."""
        return layer_module.walk(self.layers)

    def _parameter_buffers(self):
        """[(layer, Buffer)] of parameters (one flat vector per layer, see
        Layer.parameters) and saved buffers (BatchNorm's running statistics)."""
        real, out = self.backend.dtype, []
        for _, layer in self.walk():
            n = training.flat_size(layer)
            if n:
                out.append((layer, Buffer(repr(layer), "flat", "parameters", (n,), real)))
            out += [(layer, Buffer(repr(layer), name, "parameters", shape, real))
                    for name, shape in layer.buffers().items()]
        return out

    def _batch_buffers(self, m):
        """[(owner, Buffer)] of everything sized by the batch, for up to m samples."""
        real = self.backend.dtype
        target = np.dtype(np.int32) if self.loss.name == "softmax_cross_entropy" else real
        sizes = [layer.shared_sizes(m) for layer in self.layers]     # Residual: its inner
        x = self.backend.storage_dtype if self._half_x else real
        products = [max([0] + [layer.product_size(m) for _, layer in self.walk()
                               if layer.half_slot == slot]
                        + [layer.grad_size(m) for _, layer in self.walk()
                           if layer.grad_slot == slot]) for slot in (0, 1)]
        own = [("_x", "batch", self.n_in * m, x), ("_y", "batch", self.n_out * m, target),
               ("_loss_sum", "batch", m, real), ("_hit_sum", "batch", m, real),
               ("_order", "batch", m, np.dtype(np.int32)),
               ("_nonfinite", "workspace", 1, np.dtype(np.int32)),     # see _upload_batch
               ("_ones", "workspace", max([m] + [n for n, _ in sizes]), real),
               ("_workspace", "workspace", max(1, max(w for _, w in sizes)), real)]
        for name, n in zip(PRODUCTS, products):     # 16-bit layers' float32 sums (Shared)
            if n:
                own.append((name, "batch", n, real))
        if self.backend.stages_samples:     # two halves of whole samples (write_samples)
            room = max(1, min(m, STAGING_BYTES // (2 * self.n_in * real.itemsize)))
            own.append(("_staging", "workspace", 2 * self.n_in * room, real))
        # owner None: the network's own (not the network itself, which the list of what it
        # holds would then hold: a reference cycle, and a dropped network would keep its
        # memory until the next cycle collection)
        out = [(None, Buffer("network", name, kind, (n,), dtype)) for name, kind, n, dtype in own]
        for _, layer in self.walk():
            out += [(layer, Buffer(repr(layer), name, "batch", (n,), dtype or real))
                    for name, (n, dtype) in layer.batch_buffers(m).items()]
        return out

    def memory_plan(self, batch_size, optimizer=None):
        """Every buffer the network holds when it trains on batches of `batch_size` (0:
        without batch buffers) with `optimizer` (default: the one it trains with, or before
        its first fit fit's default, SGD with momentum), with their bytes, the total and the
        room on the device (free memory plus what the network holds already)."""
        if optimizer is None:
            state = self.optimizer_state
            optimizer = state.optimizer if state else training.DEFAULT_OPTIMIZER
        return self._plan(batch_size, optimizer)

    def _plan(self, batch_size, optimizer=None):
        """memory_plan, where optimizer None means the optimizer state held now (none
        before the first fit): what growing the batch buffers has room for."""
        m = check_count("batch_size", batch_size, 0)
        if optimizer is None and self.optimizer_state:
            optimizer = self.optimizer_state.optimizer
        buffers = [b for _, b in self._parameter_buffers()]
        if optimizer is not None:
            buffers += [b for _, b in training.state_buffers(self, optimizer)]
        held = 0
        if m:
            buffers += [b for _, b in self._batch_buffers(m)]
            # the backend's own: the copies of a vendor GEMM's inputs (CUDA's bf16 and fp16
            # copy them to 16 bits, and keep those layers keep from the forward for the
            # backward; a large float32 product may run on a transposed copy of a)
            layers = [layer for _, layer in self.walk()]
            workspaces = self.backend.operand_bytes(
                [p for layer in layers for p in layer.products(m)],
                [n for layer in layers for n in layer.kept_operands(m)])
            for name, (needed, now, dtype) in workspaces.items():
                held += min(now, needed)    # what it holds beyond is not room for ours
                buffers.append(Buffer("backend", name, "workspace",
                                      (needed // dtype.itemsize,), dtype))
        free, _ = self.backend.memory_info()
        held += sum(b.nbytes for _, b, _ in self._params + self._batch)
        if self.optimizer_state:
            held += sum(b.nbytes for _, b, _ in self.optimizer_state._arrays)
        return MemoryPlan(buffers, m, self.backend.name, free + held,
                          getattr(self.backend, "max_alloc_bytes", None), distributed.current(),
                          self.backend.precision)

    def _largest_batch(self, limit):
        return largest_batch(lambda m: self._plan(m).fits, limit)

    def _allocate_parameters(self, rng):
        plan = self._plan(0)
        if not plan.fits:
            raise refuse(plan, f"the network {self._describe()}")
        self._params = self._allocate(self._parameter_buffers())
        bk = self.backend
        for layer, buf, x in self._params:
            setattr(layer, buf.name, x)
            if buf.name == "flat":              # each parameter a view of the flat vector
                for name, view in layer_module.parameter_views(layer, x).items():
                    setattr(layer, name, view)
        for _, layer in self.walk():    # drawn on the host, layer by layer, after the plan
            values = layer.initial(rng)
            for name in list(layer.parameters()) + list(layer.buffers()):
                if name in values:
                    bk.write(getattr(layer, name), values[name])   # cast there
                else:
                    bk.fill(getattr(layer, name), 0.0)

    def _bind(self, m):
        """Make every layer's buffers views for a batch of m samples."""
        if m == self.m:
            return
        if m > self.capacity:
            self._grow(m)
        bk = self.backend
        self.m = m
        self.x = bk.view(self._x, (self.n_in, m))
        self.y = bk.view(self._y, (m,) if self.loss.name == "softmax_cross_entropy"
                         else (self.n_out, m))
        self.order = bk.view(self._order, (m,))
        self.loss_sum = bk.view(self._loss_sum, (m,))
        self.hit_sum = bk.view(self._hit_sum, (m,))
        a = self.x
        for layer in self.layers:
            layer.bind(a, m, self.shared)
            a = layer.a

    def _grow(self, m):
        """Batch buffers for m samples in place of the smaller ones; refused by the plan
        when they do not fit, and put back as they were when an allocation fails."""
        plan = self._plan(m)
        if not plan.fits:
            raise refuse(plan, f"a batch of {m} samples", self._largest_batch(m))
        old = self.capacity
        self._free_batch_buffers()
        try:
            self._allocate_batch(m)
        except OutOfMemoryError:
            if old:
                self._allocate_batch(old)
            raise

    def _allocate(self, planned):
        """[(owner, Buffer, device array)] for [(owner, Buffer)], all or nothing."""
        arrays = allocate(self.backend, [buf for _, buf in planned])
        return [(owner, buf, x) for (owner, buf), x in zip(planned, arrays)]

    def _allocate_batch(self, m):
        self._batch = self._allocate(self._batch_buffers(m))
        for owner, buf, x in self._batch:
            setattr(owner or self, buf.name, x)
        self.shared = Shared(self._ones, self._workspace,
                             tuple(getattr(self, name) for name in PRODUCTS))
        self.backend.fill(self._ones, 1.0)
        # train_batch adds into the sums without an epoch to zero them (Oclgrind saw the
        # loss kernel read them unwritten)
        self.backend.fill(self._loss_sum, 0.0)
        self.backend.fill(self._hit_sum, 0.0)
        self.capacity, self.m = m, None

    def _free_batch_buffers(self):
        self._graphs.clear()            # they point at these buffers
        for owner, buf, x in self._batch:
            self.backend.free(x)
            setattr(owner or self, buf.name, None)
        self._batch = []
        self.capacity, self.m = 0, None

    def free(self):
        """Give back every device buffer of the network now (it cannot be used afterwards:
        every public method then raises a PortanetError naming free(); a second free() does
        nothing). It waits for another thread's call on the network to end, and is refused
        from inside one of the network's calls (a callback of fit). A network that is
        simply dropped gives its memory back when it is collected."""
        with self._lock:
            if self._calls:
                raise PortanetError(
                    "free() was called from inside a call of the same network (a callback "
                    "of fit?), which would go on with the buffers it gives back: free the "
                    "network after that call returns (stop fit early with "
                    "net.stop_training = True)")
            if not self._freed:
                self._free_all()
                self._freed = True

    def _using(self, what):
        """The network held for one call that is not one of its methods (load_torch_state):
        see _Call."""
        return _Call(self, what)

    def _free_all(self):
        self._free_batch_buffers()
        if self.optimizer_state:
            self.optimizer_state.free()
            self.optimizer_state = None
        for layer, buf, x in self._params:
            self.backend.free(x)
            setattr(layer, buf.name, None)
        self._params = []

    def _reset_sums(self):
        self.backend.fill(self._loss_sum, 0.0)
        self.backend.fill(self._hit_sum, 0.0)

    def _read_sums(self, n, ranks=None):
        """(mean loss, accuracy) over the n samples accumulated (with ranks, a distributed
        Group: by all of its ranks); one host read."""
        sums = [np.sum(self.backend.download(s), dtype=np.float64)
                for s in (self._loss_sum, self._hit_sum)]
        loss, hits = ranks.sum(sums) if ranks is not None else sums
        return float(loss) / n, float(hits) / n

    # -- one batch -----------------------------------------------------------------------

    def _upload_batch(self, xb, yb=None, wait=True, first=None):
        """The batch into the input and target buffers; wait=False where yb is the
        network's own or not changed before the next wait. first: xb's place in an input
        not checked for NaN and inf yet: the device looks as it lays the batch out, for
        _check_nonfinite to report. xb may be DeviceSamples (on the device already)."""
        self._bind(len(xb))
        bad = None if first is None else self._nonfinite
        if isinstance(xb, dlpack.DeviceSamples):
            self.backend.write_samples_device(self.x, xb.array, bad, first or 0)
        else:
            self.backend.write_samples(self.x, xb, self._staging, bad, first or 0)
        if yb is not None:
            self.backend.write(self.y, yb, wait)

    def _stage_batch(self, xb, yb):
        """The batch into the staging buffer as it is, and its targets, for a step that
        lays it out first (training.staged_step): the staged view; None where the backend
        took it whole (_upload_batch, without a wait)."""
        self._bind(len(xb))
        staged = self.backend.stage_samples(self._staging, xb)
        if staged is None:
            self._upload_batch(xb, yb, wait=False)
        else:
            self.backend.write(self.y, yb, wait=False)
        return staged

    def _reset_nonfinite(self):
        self.backend.write(self._nonfinite, np.array([NO_SAMPLE], np.int32))

    def _check_nonfinite(self):
        """The InputError naming the first sample holding NaN or inf that the uploads
        since _reset_nonfinite met; after a wait, so that reading costs nothing more."""
        bad = int(self.backend.download(self._nonfinite)[0])
        if bad != NO_SAMPLE:
            raise _nonfinite("NaN or inf", bad)

    def _scan_nonfinite(self, x, m):
        """The InputError naming the first sample of DeviceSamples x that holds NaN or inf,
        looked for by the device as it lays x out into the input buffer m samples at a time
        (as predict's batches are): the check a host array gets whole in _check_x."""
        self._reset_nonfinite()
        for i in range(0, len(x), m):
            self._upload_batch(x[i:i + m], first=i)
        self._check_nonfinite()

    def _forward(self, training=False):
        self.backend.drop_all_operands()    # what a step stopped midway kept
        for layer in self.layers:
            layer.forward(training)

    def _forward_loss(self, training=False, state=None):
        """Forward, then the loss kernel. A dense softmax output under softmax cross-entropy
        leaves its bias and softmax to the loss, which does them in the same launch
        (bias_softmax_xent); given a training step's optimizer state that scales no loss,
        the loss also forms the layer's bias gradient from its delta (the gemv of its
        backward: bias_softmax_xent_grad). Returns backward's delta_in_z for the last
        layer: where the delta is, and whether its bias gradient is formed."""
        *hidden, last = self.layers
        if not (isinstance(last, layer_module.Dense) and last.activation == "softmax" and
                self.loss.name == "softmax_cross_entropy"):
            self._forward(training)
            self._loss()
            return self.loss.fused
        self.backend.drop_all_operands()    # as _forward does
        for layer in hidden:
            layer.forward(training)
        last.forward_product(training)
        args = (last.z, last.b, last.a, self.loss_sum, self.hit_sum, self.y)
        if state is None or state.scaling is not None:   # (a scaled delta: its gemv after)
            self.backend.bias_softmax_xent(*args)
            return True
        g, alpha, beta = state.gradient(last)
        self.backend.bias_softmax_xent_grad(*args, alpha, beta, g["b"], last.ones)
        return layer_module.DELTA_AND_BIAS

    def _output_delta(self):
        """Where the loss kernel wrote the delta backward starts from: the last layer's z
        for a loss fused with its activation, else its a."""
        last = self.layers[-1]
        return last.z if self.loss.fused else last.a

    def _loss(self):
        """Loss kernel: the delta into the last layer; each sample's loss and hit added to
        the epoch's sums (per batch position: the first m of the capacity)."""
        self.loss(self.backend, self.layers[-1], self.loss_sum, self.hit_sum, self.y)

    def _backward(self, state, delta_in_z):
        """Each layer's backward, the last one's with delta_in_z as _forward_loss said."""
        for i in reversed(range(len(self.layers))):
            last = i == len(self.layers) - 1
            self.layers[i].backward(state, self._first[i], delta_in_z=last and delta_in_z)
        state.finish()                      # the updates the layers left for the end

    # -- the user's API ------------------------------------------------------------------

    @property
    def loss_scale(self):
        """The loss scale now and the steps it has skipped, (scale, skipped), read from the
        device (as torch's GradScaler.get_scale); None where the network does not scale its
        loss. Both count from the optimizer's state, made by the first fit or train_batch
        (and anew for another optimizer; before it, the initial scale and 0). fit's history
        has them an epoch at a time; for train_batch this is the way to see them."""
        if self.loss_scaling is None:
            return None
        state = self.optimizer_state
        return state.scale_now() if state is not None and state.scaling is not None \
            else (self.loss_scaling.initial, 0)

    def train_batch(self, x, y, optimizer=training.DEFAULT_OPTIMIZER):
        """One forward, loss, backward and update on one batch (no host synchronisation;
        `loss_scale` reads what a loss-scaled step did)."""
        training.train_batch(self, x, y, optimizer)

    def fit(self, x, y, epochs=1, batch_size=32, optimizer=training.DEFAULT_OPTIMIZER,
            seed=None, shuffle=True, validation_data=None, validation_split=0.0,
            callbacks=None, schedule=None, checkpoint=None, resume=None, progress=None,
            on_epoch=None, data_on_device="auto"):
        """Train; returns a History (a dict) of per-epoch lists: loss, accuracy, lr,
        seconds, val_loss and val_accuracy when validating, and loss_scale and
        skipped_steps where the network scales its loss (fp16's default).

        x, y (and validation_data): NumPy arrays, or any with __dlpack__ (PyTorch, CuPy,
        JAX). Host memory is read without a copy. On cuda, an array on the network's GPU
        (float32, C-contiguous) is read in place: its batches are gathered there, whatever
        data_on_device says, and its targets come down to be checked (portanet/dlpack.py).

        optimizer: pn.SGD, pn.Adam, pn.AdamW or pn.RMSprop; its state is allocated at the
        first fit and kept by later ones of the same kind. schedule (portanet.schedules, or
        its text such as "cosine(30)") sets each epoch's learning rate from optimizer.lr.
        validation_split sets the last fraction of x, y apart (before shuffling) to
        validate on after each epoch; or give validation_data=(x_val, y_val).
        callbacks: portanet.callbacks objects (EarlyStopping, ModelCheckpoint).
        checkpoint: a file saved atomically after each epoch with all that resuming needs
        (optimizer state, epoch, random generator); resume: such a file to go on from,
        with the same arguments: the run then ends bit for bit as an uninterrupted one.
        progress(done, total) is called after each batch; on_epoch(epoch, logs) after each
        epoch. The last batch of an epoch may be smaller than batch_size. A loss that
        becomes NaN or infinite ends training with a DivergedError.

        data_on_device: True uploads the training set once and gathers each shuffled batch
        there (the host sends the batch's indices only; an OutOfMemoryError if the memory
        plan has no room); False sends every batch from the host; "auto" (the default) keeps
        the set on a GPU when it takes at most half the room and the call runs two epochs
        or more. On an H100 that made a LeNet epoch on Fashion-MNIST 1.7x faster on NVIDIA's
        OpenCL and 1.07x on cuda, the MLP's 1.35x on cuda (docs/batches.md).
        """
        return training.fit(self, x, y, epochs, batch_size, optimizer, seed, shuffle,
                            validation_data, validation_split, progress, on_epoch, schedule,
                            data_on_device, callbacks, checkpoint, resume)

    def evaluate(self, x, y, batch_size=None):
        """(mean loss, accuracy) over the whole of x, y (NumPy arrays, or any with
        __dlpack__: see fit)."""
        with dlpack.taken(x, self.backend) as x:
            return self._evaluate(*self._check_data(x, y, finite=False), batch_size)

    def _evaluate(self, x, t, batch_size=None):
        """evaluate on data as _check_data gives it (targets in the device's layout): fit's
        validation data, checked once for all its epochs."""
        chunk = self._inference_batch(batch_size, len(x))
        self._bind(chunk)
        self._reset_sums()
        self._reset_nonfinite()
        # the device runs batch i while i + 1 goes up (y is not changed before the sums
        # are read, which waits for the copies)
        for i in range(0, len(x), chunk):
            self._upload_batch(x[i:i + chunk], t[..., i:i + chunk], wait=False, first=i)
            training.replayed(self, ("evaluate", self.m), self._forward_loss)
        sums = self._read_sums(len(x))
        self._check_nonfinite()
        return sums

    def predict(self, x, batch_size=None):
        """The network's outputs, (N, outputs): probabilities for softmax/sigmoid outputs.
        x: a NumPy array, or any with __dlpack__ (see fit)."""
        with dlpack.taken(x, self.backend) as x:
            x = self._check_x(x, finite=False)
            chunk = self._inference_batch(batch_size, len(x))
            out = np.empty((len(x), self.n_out), dtype=self.backend.dtype)
            # the device runs batch i while batch i + 1 goes up; the outputs come back in
            # the background into pinned memory, a slot per batch, read when the slots are
            # full
            self._bind(chunk)
            self._reset_nonfinite()
            each = self.n_out * chunk
            slots = self.backend.host_empty(
                (max(1, min(-(-len(x) // chunk), PREDICTIONS_BYTES // (each * out.itemsize))),
                 each))
            starts = []
            for i in range(0, len(x), chunk):
                self._upload_batch(x[i:i + chunk], first=i)
                training.replayed(self, ("predict", self.m), self._forward)
                a = self.layers[-1].a
                self.backend.download_into(a, slots[len(starts), :a.size])
                starts.append(i)
                if len(starts) == len(slots) or i + chunk >= len(x):
                    self.backend.synchronize()
                    for slot, start in zip(slots, starts):
                        n = min(chunk, len(x) - start)
                        out[start:start + n] = slot[:n * self.n_out].reshape(self.n_out, n).T
                    starts = []
            self._check_nonfinite()
            return out

    def predict_classes(self, x, batch_size=None):
        p = self.predict(x, batch_size)
        return (p[:, 0] > 0.5).astype(np.int64) if self.n_out == 1 else p.argmax(axis=1)

    def _inference_batch(self, batch_size, n):
        """The chunk size of evaluate and predict: as asked, or by default chosen from the
        memory plan: the largest batch (up to n) whose batch buffers take at most
        INFERENCE_BYTES (at least one sample), or the buffers already there where they hold
        more, cut to what the device has room for."""
        if batch_size is not None:
            return min(check_count("batch_size", batch_size, 1), n)
        if n <= self.capacity:
            return n
        # the batch buffers take a m + b bytes (a per sample; b: BatchNorm's statistics,
        # Dropout's key), so the cap gives m at once; one plan then checks it fits, and
        # only where it does not (a full device) are plans searched. Each predict and
        # evaluate asks: the search took 1.2 ms on the host, a tenth of LeNet's inference
        # on 10000 images on an H100.
        if self._batch_bytes is None:
            one, two = (self._plan(m).by_kind().get("batch", 0) for m in (1, 2))
            self._batch_bytes = two - one, 2 * one - two
        a, b = self._batch_bytes
        m = max(1, min(n, (INFERENCE_BYTES - b) // a))
        if self._plan(m).fits:
            return max(m, self.capacity)

        def fits(m):
            plan = self._plan(m)
            return plan.fits and plan.by_kind().get("batch", 0) <= INFERENCE_BYTES
        # at least 1: a sample that does not fit makes _bind raise with the numbers
        return max(largest_batch(fits, m), self.capacity, 1)

    # -- input checks --------------------------------------------------------------------

    def _check_x(self, x, finite=True):
        """x as the backend's dtype, checked; finite=False leaves NaN and inf to the device
        (_upload_batch) where no cast made a copy (which is checked here whole). x is what
        dlpack.taken gave: DeviceSamples (of the backend's dtype) have their shape checked
        here and NaN and inf looked for by the device, as their callers lay them out (fit
        and train_batch before the first step: _scan_nonfinite)."""
        on_device = isinstance(x, dlpack.DeviceSamples)
        if not on_device and not isinstance(x, np.ndarray):
            x = _host_array(x, "x")
        if not on_device and not np.issubdtype(x.dtype, np.floating):
            raise InputError(f"input has dtype {x.dtype}; the network takes floating-point "
                             f"data: convert with x.astype(np.float32) (and scale pixels "
                             f"to [0, 1] with / 255)")
        if x.ndim == 0 or len(x) == 0:
            raise ShapeError(f"input has shape {x.shape}: give at least one sample, "
                             f"shaped (N, {', '.join(map(str, self.input_shape))})")
        sample = x.shape[1:]
        flat_ok = len(self.input_shape) == 1 and elements(sample) == self.n_in
        if sample != self.input_shape and not flat_ok:
            raise ShapeError(f"input has samples of shape {sample} but the network's first "
                             f"layer {self.layers[0]} expects {self.input_shape}: give x of "
                             f"shape (N, {', '.join(map(str, self.input_shape))})")
        if on_device:
            return x
        with np.errstate(over="ignore"):
            cast = x.astype(self.backend.dtype, copy=False)
        if (finite or cast is not x) and not np.all(np.isfinite(cast)):  # after the cast:
            what = "NaN or inf" if not np.all(np.isfinite(x)) else \
                f"values too large for {self.backend.dtype} (they become inf)"  # 1e39 in f32
            rows = cast.reshape(len(cast), -1)
            raise _nonfinite(what, int(np.argwhere(~np.isfinite(rows))[0][0]))
        self._check_half_range(cast)
        return cast

    def _check_half_range(self, x):
        """In fp16 the first product rounds the input to half: from 65520 up, inf, and the
        network's outputs NaN. Refused here, naming the range, where the input reaches a
        product with its magnitude (through layers that pass values on: Flatten, Dropout,
        pooling, a Residual block's first layer); NaN and inf are left to their own check."""
        if self.backend.precision != "fp16" or not _input_meets_product(self.layers):
            return
        limit = precisions.HALF_OVERFLOW
        with np.errstate(invalid="ignore"):
            if np.nanmax(x, initial=0) < limit and np.nanmin(x, initial=0) > -limit:
                return
            rows = x.reshape(len(x), -1)
            large = (np.abs(rows) >= limit) & np.isfinite(rows)
        if not large.any():                 # only inf: the finite check's to report
            return
        sample = int(np.argwhere(large)[0][0])
        top = float(np.abs(rows[large]).max())
        raise InputError(f"input holds values of magnitude up to {top:.4g} "
                         f"(first at sample {sample}), beyond fp16's range: from {limit:g} the "
                         f"first layer's products round them to inf (half's largest is 65504); "
                         f"scale the inputs, or compute in bf16 or fp32")

    def _check_data(self, x, y, finite=True):
        x = self._check_x(x, finite)
        if not isinstance(y, np.ndarray) and not hasattr(y, "__dlpack__"):
            y = _host_array(y, "y")
        y = dlpack.host(y, self.backend)
        if y.ndim == 0 or len(y) != len(x):
            raise ShapeError(f"x has {len(x)} samples but y has "
                             f"{len(y) if y.ndim else 'no'} : give one target per sample")
        t = self.loss.host_targets(y, self.n_out)
        if t.dtype != np.int32:
            with np.errstate(over="ignore"):
                t = t.astype(self.backend.dtype)
            if not np.all(np.isfinite(t)):
                raise InputError(f"{self.loss.name}: targets too large for "
                                 f"{self.backend.dtype} (they become inf); rescale them")
        return x, t

    # -- save and load (portanet/saving.py) ------------------------------------------------

    def architecture(self):
        return saving.architecture(self)

    def save(self, path):
        """Write the network to one backend-neutral file (safetensors: the architecture in
        its metadata, float tensors), atomically: a failed save leaves an earlier file
        at `path` as it was."""
        saving.save(self, path)

    def to_onnx(self, path, opset=None):
        """Write the network as an ONNX model (inference form; input (N, ...) samples
        first, N free), atomically; needs the extra `onnx` (portanet/onnx_io.py)."""
        from . import onnx_io
        onnx_io.to_onnx(self, path, opset)

    def load_weights(self, path):
        """Parameters from a file saved by a network of the same architecture; checked
        whole before any is written, so a bad file leaves the network as it was."""
        saving.load_weights(self, path)

    def summary(self, optimizer=None):
        """The layers, their output shapes and parameters, and the bytes they hold in
        training with `optimizer` (default as memory_plan's)."""
        lines = [f"Sequential on {self.backend.name} ({self.backend.dtype}, "
                 f"{self.backend.precision}), "
                 f"input {self.input_shape}, loss {self.loss.name}"]
        total = 0
        for path, layer in self.walk():
            n = sum(training.flat_size(l) for p, l in self.walk()         # with its inner
                    if p == path or p.startswith(path + "."))
            total += n if "." not in path else 0
            indent = "  " * path.count(".")
            text = repr(layer) if not layer.sublayers() else f"{type(layer).__name__}(...)"
            lines.append(f"  {indent}{text:{48 - len(indent)}s} -> {str(layer.out_shape):16s} "
                         f"{n:>10,d} parameters")
        if optimizer is None:
            state = self.optimizer_state
            optimizer = state.optimizer if state else training.DEFAULT_OPTIMIZER
        plan = self.memory_plan(self.capacity, optimizer)
        kinds = ", ".join(f"{kind} {_size(nbytes)}" for kind, nbytes in plan.by_kind().items())
        lines.append(f"  {total:,d} parameters; {_size(plan.total)} on the device "
                     f"({kinds}{'' if self.capacity else '; batch buffers come with the first batch'})")
        itemsize, scaling = self.backend.dtype.itemsize, self.loss_scaling
        per = optimizer.bytes_per_parameter(itemsize)
        if scaling is not None:
            per += itemsize
            how = f" (its gradient kept whole for loss scaling, {scaling})"
        elif optimizer.uses_workspace:
            how = " and a gradient workspace as large as the largest layer"
        else:
            how = ""
        lines.append(f"  training with {repr(optimizer)}: {per} bytes per parameter{how}")
        return "\n".join(lines)

    def get_weights(self):
        """{name: host array} of every parameter and saved buffer, named as in files
        ("0.w", "0.b", "2.running_mean", "3.1.gamma", "3.proj.w")."""
        return {name: self.backend.download(x) for name, x in saving._parameters(self).items()}

    def set_weights(self, weights):
        """Set parameters and buffers from {name: array} as get_weights gives them: all
        names, shapes and values are checked before any is written (every value finite in
        the network's dtype, every BatchNorm running variance >= 0: checked_weights), so a
        refused call leaves the network as it was."""
        targets = saving._parameters(self)
        if not isinstance(weights, dict):
            raise InputError(f"set_weights takes a dict {{name: array}} as get_weights "
                             f"gives, got {type(weights).__name__}")
        missing, unknown = sorted(set(targets) - set(weights)), sorted(set(weights) - set(targets))
        arrays = {}
        for name in targets:
            if name in weights:
                try:
                    arrays[name] = np.asarray(weights[name])
                except (TypeError, ValueError) as e:    # ragged lists, objects
                    raise InputError(f"set_weights: {name} is not an array of numbers "
                                     f"({e}); give NumPy arrays as get_weights does") from e
        wrong = [f"{n} is {x.shape}, the network's is {targets[n].shape}"
                 for n, x in arrays.items() if x.shape != targets[n].shape]
        if missing or unknown or wrong:
            raise ShapeError("set_weights: " + "; ".join(
                ([f"missing {', '.join(missing)}"] if missing else [])
                + ([f"not in the network: {', '.join(unknown)}"] if unknown else []) + wrong))
        values = checked_weights(arrays, self.backend.dtype,
                                 lambda problem: InputError(f"set_weights: {problem}"))
        for name, x in targets.items():
            self.backend.write(x, values[name])

    def _describe(self):
        return saving.describe(self.architecture())


_guard(Sequential)


def _input_meets_product(layers):
    """Whether a network's input reaches a matrix product (Dense, Conv2D) with its own
    magnitude: through Flatten, Dropout and pooling, into a Residual block's first layer or
    its projection, or past the block, whose identity shortcut adds the input to its output;
    not through BatchNorm or a layer unknown here."""
    for layer in layers:
        if isinstance(layer, layer_module.Dense):           # Conv2D too
            return True
        if isinstance(layer, layer_module.Residual):
            if layer.projection is not None or _input_meets_product(layer.layers):
                return True
        elif not isinstance(layer, (layer_module.Flatten, layer_module.Dropout,
                                    layer_module.MaxPool2D, layer_module.AvgPool2D)):
            return False
    return False


def _host_array(value, what):
    """A value that is no array yet (nested lists, tuples) as a NumPy array; one NumPy
    cannot make (samples of several shapes: a ragged list) an InputError naming `what` and
    the shapes."""
    try:
        return np.asarray(value)
    except (TypeError, ValueError) as e:
        shapes = {}                         # shape -> the first sample of it
        try:
            for i, sample in enumerate(value):
                try:
                    shape = str(np.shape(sample))
                except (TypeError, ValueError):
                    shape = "ragged itself"
                shapes.setdefault(shape, i)
        except TypeError:
            pass
        if len(shapes) > 1:
            seen = ", ".join(f"sample {i} {shape}" for shape, i in list(shapes.items())[:4])
            raise InputError(f"{what} is a ragged sequence, its samples of several shapes "
                             f"({seen}): give {what} as an array, every sample of one "
                             f"shape (pad or cut the shorter ones)") from e
        raise InputError(f"{what} cannot be made an array ({e}): give a NumPy array, or "
                         f"any array with __dlpack__") from e


def _nonfinite(what, sample):
    return InputError(f"input contains {what} (first at sample {sample}); clean, impute or "
                      f"rescale the data before training")


def _input_shape(shape):
    """The per-sample input shape as a tuple of whole numbers >= 1."""
    dims = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
    if not dims:
        raise ShapeError(f"input_shape must be a number of features or a tuple such as "
                         f"(1, 28, 28), got {shape!r}")
    return tuple(check_count("input_shape entries", d, 1) for d in dims)
