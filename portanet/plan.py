"""A network's memory: planned, allocated, bound to its layers, its steps replayed.

`Plan` holds every device buffer of a Sequential network: its parameters, the optimizer's
state (`state`, made by the trainer), and the batch buffers, sized for the largest batch
seen and viewed for smaller ones, so that after the first step of a size nothing is
allocated. Each is listed as a `memory.Buffer` before it is made; the same list is what is
allocated, all or nothing, so a network or a batch that does not fit is refused with the
numbers and a failed call leaves the memory as it was.

Sequential and the trainer (training.py) use it through:

- planning: `memory(m, optimizer)` (a memory.MemoryPlan), `largest_batch`,
  `parameter_buffers`, `batch_buffers(m)`, `state_buffers(optimizer)`, `inference_batch`;
- making: `allocate(planned)`, `allocate_parameters(rng)`, `bind(m)` (every layer's buffers
  as views for a batch of m samples, grown first where m is more than `capacity`),
  `free_batch()`, `free()`;
- batches: the bound views `x` (features, m), `y` (the loss's targets), `order` (the
  batch's indices), `loss_sum` and `hit_sum`; `upload`, `stage`, `reset_sums`, `read_sums`,
  and the device's NaN and inf check (`reset_nonfinite`, `check_nonfinite`,
  `scan_nonfinite`);
- steps: `replays` (recorded steps, see Replays), `first` (which layers skip da_prev),
  `stepped` (layers with host work before each step).

It holds the layers, not the network, and the layers hold nothing of it but the buffers:
no reference cycle, so a dropped network gives its memory back at once.
"""
import math

import numpy as np

from . import config, distributed, dlpack, layers as layer_module
from .errors import InputError, OutOfMemoryError, check_count
from .memory import (Buffer, MemoryPlan, allocate, elements, largest_batch, refuse)

# what evaluate and predict give their batch buffers by default (inference_batch): LeNet
# then predicts 10000 images in batches of 1224, a plan of 388 MiB with the conv workspace
# (cpu), where one batch of 10000 had taken 5.8 GiB on an H100 (192 MiB, batches of 734,
# took 10 ms on an H100 against 9.3 for PyTorch's one batch: the fewer, the less each
# batch's host work costs)
INFERENCE_BYTES = 320 * 2**20

# the most the buffer that batches go through to the device (write_samples) takes: two
# halves, each a batch or, for larger batches, a part of whole samples
STAGING_BYTES = 16 * 2**20

# what the device's NaN and inf check holds while it has met none (check_nonfinite)
NO_SAMPLE = 2**31 - 1

# the network's two float32 products buffers (Shared.products), by Layer.half_slot
PRODUCTS = ("_products", "_products1")

MAX_GRAPHS = 16         # recorded steps kept per network (see Replays)


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


class Replays:
    """A network's recorded steps, by key: (m, optimizer, data on device, staged, this
    rank's share in a distributed job or None) for a training step (training.train_step),
    ("predict" or "evaluate", m) for a forward pass.
    Where the device records them (CUDA graphs; OpenCL's launch lists) a step is run
    eagerly the first time its key is seen, recorded the second, replayed after; replays
    give bit for bit the eager step's results. `capturable`: whether every layer's launches
    can be replayed (else every step runs eagerly)."""

    def __init__(self, backend, capturable):
        self.backend, self.capturable = backend, capturable
        self.graphs = {}    # key -> recorded step, None (seen once) or False (cannot be)
        self.foreseen = set()   # keys whose builds were made ahead (foresee)

    def __call__(self, key, work):
        """work(), for the batch buffers as bound now, as the class says. An eager step
        during which the backend moved something a recorded step would point at (a
        workspace grown mid-step: its `generation`) does not count as seen: the step
        recorded must find every workspace, and what is made for it (CUDA's tensor maps),
        made already, since a recording cannot make them."""
        graphs = self.graphs
        graph = graphs.get(key)
        if graph and not graph.current:             # it points at a workspace since freed
            del graphs[key]
            graph = None
        if graph is None and key in graphs and self.capturable:
            graph = graphs[key] = self.backend.capture(work) or False
        if graph:
            graph()
        else:
            if key not in graphs:       # a first step of its kind: its builds made together
                self.foresee({key: work})
            generation = getattr(self.backend, "generation", 0)
            work()
            if key not in graphs and len(graphs) >= MAX_GRAPHS:
                graphs.clear()                      # a schedule makes one per epoch
            if getattr(self.backend, "generation", 0) == generation:
                graphs.setdefault(key, None)        # seen once: capture next time

    def foresee(self, works):
        """Make every build the calls of `works` ({key: work}) will need, those of the keys
        not seen before, several at once (Backend.prebuild, which calls them dry), rather
        than each as a call meets it; each key once its builds are made."""
        new = {key: work for key, work in works.items() if key not in self.foreseen}
        if not new:
            return
        if len(self.foreseen) >= MAX_GRAPHS:
            self.foreseen.clear()               # a schedule makes one per epoch
        self.backend.prebuild(*new.values())
        self.foreseen.update(new)

    def clear(self):
        """Forget every recorded step (they point at buffers about to go), and which
        steps' builds were made ahead (the backend may have dropped some since)."""
        self.graphs.clear()
        self.foreseen.clear()

    def forget(self, which):
        """Forget the recorded steps whose key `which(key)` is true."""
        for key in [k for k in self.graphs if which(k)]:
            del self.graphs[key]


def flat_size(layer):
    """The elements of a layer's parameters (one flat vector: Layer.parameters)."""
    return sum(elements(shape) for shape in layer.parameters().values())


def trainable(layers):
    """(path, layer) of the layers with parameters, those inside Residual blocks included."""
    return [(path, layer) for path, layer in layer_module.walk(layers) if layer.parameters()]


def storage(layers, half):
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


def nonfinite(what, sample):
    """The InputError for an input holding NaN or inf (or values that become inf)."""
    return InputError(f"input contains {what} (first at sample {sample}); clean, impute or "
                      f"rescale the data before training")


class Plan:
    """The memory of a network of `layers` (configured for `input_shape`, giving
    `output_shape`) on `backend`, trained against `loss` with `scaling` (an
    optim.LossScale, or None): see the module's docstring."""

    def __init__(self, backend, layers, loss, input_shape, output_shape, scaling):
        self.backend, self.layers, self.loss, self.scaling = backend, layers, loss, scaling
        self.n_in, self.n_out = elements(input_shape), output_shape[0]
        # columns a sample's output takes: a sequence's T tokens, each with its own target
        # and loss (the mean over every token), else 1
        self.tokens = output_shape[1] if isinstance(output_shape, layer_module.Tokens) else 1
        # first[i]: layer i reads the network input directly, so it skips da_prev
        self.first = []
        seen_trainable = False
        for layer, after in zip(layers, layers[1:] + [None]):
            self.first.append(not seen_trainable)
            seen_trainable = seen_trainable or layer.trainable
            # the next layer keeps our output for its products (keep_operands)
            layer.output_kept = after is not None and after.keeps_input
        self.half_x = storage(layers, backend.storage_dtype is not None)
        self.capacity, self.m = 0, None
        self._batch_bytes = None        # (a, b): batch buffers of a m + b bytes (inference_batch)
        self.replays = Replays(backend, config.graphs() and all(l.capturable for l in layers))
        # layers with host work before each step (a dropout mask's key)
        self.stepped = [l for _, l in self.walk()
                        if type(l).begin_step is not layer_module.Layer.begin_step]
        self.batch = []                 # (owner, Buffer, device array) of the batch buffers
        self._staging = None            # the batch buffer write_samples goes through
        self._products = self._products1 = None     # 16-bit layers' float32 sums (Shared)
        self.params = []                # the same for parameters and saved buffers
        self.state = None               # training.OptimizerState, made by the first fit
        for _, layer in self.walk():
            layer.state, layer.grad_views, layer.grad_flat = {}, {}, {}

    def walk(self):
        """(path, layer) of every layer, those inside Residual blocks included."""
        return layer_module.walk(self.layers)

    # -- planned -------------------------------------------------------------------------

    def parameter_buffers(self):
        """[(layer, Buffer)] of parameters (one flat vector per layer, see
        Layer.parameters) and saved buffers (BatchNorm's running statistics)."""
        real, out = self.backend.dtype, []
        for path, layer in self.walk():
            n = flat_size(layer)
            if n:
                out.append((layer, Buffer(repr(layer), "flat", "parameters", (n,), real,
                                          path)))
            out += [(layer, Buffer(repr(layer), name, "parameters", shape, real, path))
                    for name, shape in layer.buffers().items()]
        return out

    def batch_buffers(self, m):
        """[(owner, Buffer)] of everything sized by the batch, for up to m samples."""
        real = self.backend.dtype
        target = self.loss.target_dtype(real)
        sizes = [layer.shared_sizes(m) for layer in self.layers]     # Residual: its inner
        x = self.backend.storage_dtype if self.half_x else real
        products = [max([0] + [layer.product_size(m) for _, layer in self.walk()
                               if layer.half_slot == slot]
                        + [layer.grad_size(m) for _, layer in self.walk()
                           if layer.grad_slot == slot]) for slot in (0, 1)]
        cols = self.tokens * m
        targets = math.prod(self.loss.target_shape(self.n_out, cols))     # labels: cols
        own = [("_x", "batch", self.n_in * m, x), ("_y", "batch", targets, target),
               ("_loss_sum", "batch", cols, real), ("_hit_sum", "batch", cols, real),
               ("_order", "batch", m, np.dtype(np.int32)),
               ("_nonfinite", "workspace", 1, np.dtype(np.int32)),     # see upload
               ("_ones", "workspace", max([m] + [n for n, _ in sizes]), real),
               ("_workspace", "workspace", max(1, max(w for _, w in sizes)), real)]
        for name, n in zip(PRODUCTS, products):     # 16-bit layers' float32 sums (Shared)
            if n:
                own.append((name, "batch", n, real))
        if self.backend.stages_samples:     # two halves of whole samples (write_samples)
            room = max(1, min(m, STAGING_BYTES // (2 * self.n_in * real.itemsize)))
            own.append(("_staging", "workspace", 2 * self.n_in * room, real))
        # owner None: the plan's own, named as the network's in a memory plan
        out = [(None, Buffer("network", name, kind, (n,), dtype)) for name, kind, n, dtype in own]
        for path, layer in self.walk():
            out += [(layer, Buffer(repr(layer), name, "batch", (n,), dtype or real, path))
                    for name, (n, dtype) in layer.batch_buffers(m).items()]
        return out

    @property
    def whole_workspace(self):
        """Whether every layer has its own part of the gradient workspace: with loss scaling
        (one check of all of it), in a distributed job (buckets of several layers'
        gradients are averaged while backward goes on), and where the state held was made
        so (it serves alone as well)."""
        return (self.scaling is not None or distributed.current() is not None
                or bool(self.state is not None and self.state.whole))

    def gathers(self, optimizer):
        """Whether a step with `optimizer` gathers every gradient in the workspace before
        the updates: loss scaling and clipping (optim.py)."""
        return self.scaling is not None or optimizer.gathers

    def whole_for(self, optimizer):
        """Whether each layer has its own part of the workspace in a step with `optimizer`:
        whole_workspace, or a step that gathers the gradients."""
        return self.whole_workspace or self.gathers(optimizer)

    def state_buffers(self, optimizer):
        """[(owner, Buffer)] of an optimizer's state for this network; owner None for the
        network-wide ones (kept by the OptimizerState): the gradient workspace (as large as
        the largest layer, or the whole network's: whole_workspace, and where the step
        gathers the gradients), Adam's step numbers, the loss scale, the sum of squares a
        clipped step's norm comes from, and `found`, the updates' skip flag (set by a scaled
        step that overflowed; an unscaled one keeps it 0)."""
        real = self.backend.dtype
        scaled, gathered = self.scaling is not None, self.gathers(optimizer)
        whole = self.whole_for(optimizer)
        # with a whole workspace, a slot that is the gradient's target (SGD's velocity) is
        # one vector of the network too, each layer a part: averaged in a distributed job,
        # a bucket of adjacent layers is one span, one all-reduce
        joined = optimizer.target(gathered)[0] if whole else None
        out, largest, total = [], 0, 0
        for path, layer in trainable(self.layers):
            n = flat_size(layer)
            largest, total = max(largest, n), total + n
            out += [(layer, Buffer(repr(layer), slot, "optimizer state", (n,), real, path))
                    for slot in optimizer.slots() if slot != joined]
        if joined is not None:
            out.append((None, Buffer("network", joined, "optimizer state", (max(total, 1),),
                                     real)))
        if optimizer.uses_workspace or gathered:
            out.append((None, Buffer("network", "workspace", "workspace",
                                     (max(total if whole else largest, 1),), real)))
        if optimizer.clip_norm is not None:
            out.append((None, Buffer("network", "squares", "optimizer state", (1,), real)))
        scalars = optimizer.step_scalars(1)
        if scalars is not None:
            out.append((None, Buffer("network", "scalars", "optimizer state", scalars.shape,
                                     real)))
            if scaled:                          # its steps, counted on the device
                out.append((None, Buffer("network", "steps", "optimizer state", (1,), real)))
        if scaled:
            out.append((None, Buffer("network", "loss_scale", "optimizer state", (4,), real)))
        out.append((None, Buffer("network", "found", "optimizer state", (1,),
                                 np.dtype(np.int32))))
        return out

    def memory(self, batch_size, optimizer=None):
        """The MemoryPlan of the network on batches of `batch_size` (0: without batch
        buffers) with `optimizer`'s state, where optimizer None means the state held now
        (none before the first fit): with their bytes, the total and the room on the device
        (free memory plus what the network holds already)."""
        m = check_count("batch_size", batch_size, 0)
        if optimizer is None and self.state:
            optimizer = self.state.optimizer
        buffers = [b for _, b in self.parameter_buffers()]
        if optimizer is not None:
            buffers += [b for _, b in self.state_buffers(optimizer)]
        held = 0
        if m:
            buffers += [b for _, b in self.batch_buffers(m)]
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
        held += sum(b.nbytes for _, b, _ in self.params + self.batch)
        if self.state:
            held += sum(b.nbytes for _, b, _ in self.state.arrays)
        return MemoryPlan(buffers, m, self.backend.name, free + held,
                          getattr(self.backend, "max_alloc_bytes", None), distributed.current(),
                          self.backend.precision)

    def largest_batch(self, limit):
        """The largest batch up to `limit` whose buffers fit, or 0."""
        return largest_batch(lambda m: self.memory(m).fits, limit)

    def inference_batch(self, batch_size, n):
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
            one, two = (self.memory(m).by_kind().get("batch", 0) for m in (1, 2))
            self._batch_bytes = two - one, 2 * one - two
        a, b = self._batch_bytes
        m = max(1, min(n, (INFERENCE_BYTES - b) // a))
        if self.memory(m).fits:
            return max(m, self.capacity)

        def fits(m):
            plan = self.memory(m)
            return plan.fits and plan.by_kind().get("batch", 0) <= INFERENCE_BYTES
        # at least 1: a sample that does not fit makes bind raise with the numbers
        return max(largest_batch(fits, m), self.capacity, 1)

    # -- made, bound, freed --------------------------------------------------------------

    def allocate(self, planned):
        """[(owner, Buffer, device array)] for [(owner, Buffer)], all or nothing."""
        arrays = allocate(self.backend, [buf for _, buf in planned])
        return [(owner, buf, x) for (owner, buf), x in zip(planned, arrays)]

    def allocate_parameters(self, rng):
        """The parameters and saved buffers, each layer's parameters views of its flat
        vector, with their initial values drawn from rng on the host, layer by layer (the
        caller has checked that the plan fits)."""
        self.params = self.allocate(self.parameter_buffers())
        bk = self.backend
        for layer, buf, x in self.params:
            setattr(layer, buf.name, x)
            if buf.name == "flat":              # each parameter a view of the flat vector
                for name, view in layer_module.parameter_views(layer, x).items():
                    setattr(layer, name, view)
        for _, layer in self.walk():
            values = layer.initial(rng)
            for name in list(layer.parameters()) + list(layer.buffers()):
                if name in values:
                    bk.write(getattr(layer, name), values[name])   # cast there
                else:
                    bk.clear(getattr(layer, name))

    def bind(self, m):
        """Make every layer's buffers views for a batch of m samples."""
        if m == self.m:
            return
        if m > self.capacity:
            self._grow(m)
        bk = self.backend
        self.m = m
        self.x = bk.view(self._x, (self.n_in, m))
        self.y = bk.view(self._y, self.loss.target_shape(self.n_out, m * self.tokens))
        self.order = bk.view(self._order, (m,))
        self.loss_sum = bk.view(self._loss_sum, (m * self.tokens,))
        self.hit_sum = bk.view(self._hit_sum, (m * self.tokens,))
        a = self.x
        for layer in self.layers:
            layer.bind(a, m, self.shared)
            a = layer.a

    def foresee(self, kind, work, batch, n):
        """Make together, once per kind and size, the builds work() needs on n samples taken
        `batch` at a time (at most the buffers' size): at `batch` and at the last, smaller
        batch (Replays.foresee, work called dry with the buffers bound to that size), rather
        than as the last batch meets them; the buffers bound as they were after."""
        assert batch <= self.capacity, (batch, self.capacity)     # views, no allocation
        bound = self.m

        def at(m):
            def work_at():
                self.bind(m)
                work()
            return work_at
        try:
            self.replays.foresee({(kind, m): at(m) for m in {batch, n % batch or batch}})
        finally:
            self.bind(bound)

    def _grow(self, m):
        """Batch buffers for m samples in place of the smaller ones; refused by the plan
        when they do not fit, and put back as they were when an allocation fails."""
        plan = self.memory(m)
        if not plan.fits:
            raise refuse(plan, f"a batch of {m} samples", self.largest_batch(m))
        old = self.capacity
        self.free_batch()
        try:
            self._allocate_batch(m)
        except OutOfMemoryError:
            if old:
                self._allocate_batch(old)
            raise

    def _allocate_batch(self, m):
        self.batch = self.allocate(self.batch_buffers(m))
        for owner, buf, x in self.batch:
            setattr(owner or self, buf.name, x)
        self.shared = Shared(self._ones, self._workspace,
                             tuple(getattr(self, name) for name in PRODUCTS))
        # from the host and by `clear`, not by kernels: on CUDA a first use builds nothing
        # before its first step, whose builds are made together
        self.backend.write(self._ones, np.ones(self._ones.shape, np.float32))
        # train_batch adds into the sums without an epoch to zero them (Oclgrind saw the
        # loss kernel read them unwritten)
        self.reset_sums()
        self.capacity, self.m = m, None

    def free_batch(self):
        """Give back the batch buffers (and forget the steps recorded on them)."""
        self.replays.clear()            # they point at these buffers
        for owner, buf, x in self.batch:
            self.backend.free(x)
            setattr(owner or self, buf.name, None)
        self.batch = []
        self.capacity, self.m = 0, None

    def free(self):
        """Give back every buffer: the batch's, the optimizer state's, the parameters'."""
        self.free_batch()
        if self.state:
            self.state.free()
            self.state = None
        for layer, buf, x in self.params:
            self.backend.free(x)
            setattr(layer, buf.name, None)
        self.params = []

    # -- batches -------------------------------------------------------------------------

    def reset_sums(self):
        """Zero the per-sample loss and hit sums (an epoch's, an evaluation's)."""
        self.backend.clear(self._loss_sum)
        self.backend.clear(self._hit_sum)

    def read_sums(self, n, ranks=None):
        """(mean loss, accuracy) over the n samples accumulated, of every token of a
        sequence's (with ranks, a distributed Group: by all of its ranks); one host read."""
        sums = [np.sum(self.backend.download(s), dtype=np.float64)
                for s in (self._loss_sum, self._hit_sum)]
        loss, hits = ranks.sum(sums) if ranks is not None else sums
        return float(loss) / (n * self.tokens), float(hits) / (n * self.tokens)

    def upload(self, xb, yb=None, wait=True, first=None):
        """The batch into the input and target buffers (bound for its size); wait=False
        where yb is the caller's own or not changed before the next wait. first: xb's place
        in an input not checked for NaN and inf yet: the device looks as it lays the batch
        out, for check_nonfinite to report. xb may be DeviceSamples (on the device
        already)."""
        self.bind(len(xb))
        bad = None if first is None else self._nonfinite
        if isinstance(xb, dlpack.DeviceSamples):
            self.backend.write_samples_device(self.x, xb.array, bad, first or 0)
        else:
            self.backend.write_samples(self.x, xb, self._staging, bad, first or 0)
        if yb is not None:
            self.backend.write(self.y, yb, wait)

    def stage(self, xb, yb):
        """The batch into the staging buffer as it is, and its targets, for a step that
        lays it out first (training.staged_step): the staged view; None where the backend
        took it whole (upload, without a wait)."""
        self.bind(len(xb))
        staged = self.backend.stage_samples(self._staging, xb)
        if staged is None:
            self.upload(xb, yb, wait=False)
        else:
            self.backend.write(self.y, yb, wait=False)
        return staged

    def reset_nonfinite(self):
        """Start the device's NaN and inf check of the uploads that follow."""
        self.backend.write(self._nonfinite, np.array([NO_SAMPLE], np.int32))

    def check_nonfinite(self):
        """The InputError naming the first sample holding NaN or inf that the uploads
        since reset_nonfinite met; after a wait, so that reading costs nothing more."""
        bad = int(self.backend.download(self._nonfinite)[0])
        if bad != NO_SAMPLE:
            raise nonfinite("NaN or inf", bad)

    def scan_nonfinite(self, x, m):
        """The InputError naming the first sample of DeviceSamples x that holds NaN or inf,
        looked for by the device as it lays x out into the input buffer m samples at a time
        (as predict's batches are): the check a host array gets whole in inputs.check_x."""
        self.reset_nonfinite()
        for i in range(0, len(x), m):
            self.upload(x[i:i + m], first=i)
        self.check_nonfinite()
