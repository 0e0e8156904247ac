"""Sequential networks: build, fit, evaluate, predict, save and load.

Users hand in NumPy arrays samples-first, (N, features) or (N, C, H, W); each batch is
transposed once on upload to the device layout (features, batch) and predictions once
on download. Batch buffers are sized for the largest batch seen and viewed for smaller
ones, so after the first step of a size training allocates nothing.
"""
import dataclasses
import math
import time

import numpy as np

from . import backends, config, layers as layer_module, losses, saving, schedules
from .errors import DivergedError, InputError, OutOfMemoryError, ShapeError, check_count
from .memory import (Buffer, MemoryPlan, allocate, elements, largest_batch, refuse,
                     size_text as _size)
from .optim import SGD

MAX_GRAPHS = 16         # recorded steps kept per network (see Sequential._train_step)
DATA_SHARE = 0.5        # fit keeps the training set on a GPU if all fits in this share


class Shared:
    """Buffers all layers of a network share: a ones vector (bias gradients by gemv) and
    the im2col workspace, sized once for the largest layer; workspace_holds is the id of
    the conv layer whose cols it holds (an id, not the layer: no reference cycle, so a
    dropped network is freed at once, not at the next cycle collection)."""

    def __init__(self, ones, workspace):
        self.ones, self.workspace, self.workspace_holds = ones, workspace, None


class History(dict):
    """Per-epoch lists: loss, accuracy, lr, seconds (and val_loss, val_accuracy if asked)."""


class Sequential:
    """A stack of layers trained with a fused loss and SGD with momentum.

    >>> net = Sequential([Dense(30, "relu"), Dense(1, "sigmoid")], input_shape=2,
    ...                  loss="binary_cross_entropy", device="cpu")

    Memory is planned before it is allocated (`memory_plan`): a network or a batch that
    does not fit is refused with the numbers, and a failed call leaves the network as it
    was.
    """

    def __init__(self, layers, input_shape, loss="softmax_cross_entropy", device=None,
                 dtype="float32", seed=0):
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
        self.backend = backends.device(device, dtype)
        shape = self.input_shape
        for layer in self.layers:
            shape = layer.configure(self.backend, shape)
        self.output_shape = shape
        self._check_output()
        # first[i]: layer i reads the network input directly, so it skips da_prev
        self._first = []
        seen_trainable = False
        for layer in self.layers:
            self._first.append(not seen_trainable)
            seen_trainable = seen_trainable or layer.trainable
        self.capacity, self.m = 0, None
        self._graphs = {}               # (m, optimizer, data on device) -> recorded step,
        #                                 None (seen once) or False (cannot be recorded)
        self._capturable = config.graphs() and all(l.capturable for l in self.layers)
        self._batch = []                # (owner, Buffer, device array) of the batch buffers
        self._params = []               # the same for parameters and optimizer state
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

    def _parameter_buffers(self):
        """[(layer, Buffer)] of parameters and optimizer state."""
        out = []
        for layer in self.layers:
            for kind, shapes in (("parameters", layer.parameters()),
                                 ("optimizer state", layer.state())):
                out += [(layer, Buffer(repr(layer), name, kind, shape, self.backend.dtype))
                        for name, shape in shapes.items()]
        return out

    def _batch_buffers(self, m):
        """[(owner, Buffer)] of everything sized by the batch, for up to m samples."""
        real = self.backend.dtype
        target = np.dtype(np.int32) if self.loss.name == "softmax_cross_entropy" else real
        sizes = [layer.shared_sizes(m) for layer in self.layers]
        own = [("_x", "batch", self.n_in * m, real), ("_y", "batch", self.n_out * m, target),
               ("_loss_sum", "batch", m, real), ("_hit_sum", "batch", m, real),
               ("_order", "batch", m, np.dtype(np.int32)),
               ("_ones", "workspace", max([m] + [n for n, _ in sizes]), real),
               ("_workspace", "workspace", max(1, max(w for _, w in sizes)), real)]
        out = [(self, Buffer("network", name, kind, (n,), dtype)) for name, kind, n, dtype in own]
        for layer in self.layers:
            out += [(layer, Buffer(repr(layer), name, "batch", (n,), dtype or real))
                    for name, (n, dtype) in layer.batch_buffers(m).items()]
        return out

    def memory_plan(self, batch_size):
        """Every buffer the network holds when it runs batches of `batch_size` (0: the
        parameters and optimizer state alone), with their bytes, the total and the room
        on the device (free memory plus what the network holds already)."""
        m = check_count("batch_size", batch_size, 0)
        buffers = [b for _, b in self._parameter_buffers()]
        if m:
            buffers += [b for _, b in self._batch_buffers(m)]
        free, _ = self.backend.memory_info()
        held = sum(b.nbytes for _, b, _ in self._params + self._batch)
        return MemoryPlan(buffers, m, self.backend.name, free + held,
                          getattr(self.backend, "max_alloc_bytes", None))

    def _largest_batch(self, limit):
        return largest_batch(self.memory_plan, limit)

    def _allocate_parameters(self, rng):
        plan = self.memory_plan(0)
        if not plan.fits:
            raise refuse(plan, f"the network {self._describe()}")
        self._params = self._allocate(self._parameter_buffers())
        for layer, buf, x in self._params:
            setattr(layer, buf.name, x)
        for layer in self.layers:       # drawn on the host, layer by layer, after the plan
            values = layer.initial(rng)
            for name in list(layer.parameters()) + list(layer.state()):
                if name in values:
                    self.backend.write(getattr(layer, name), values[name])   # cast there
                else:
                    self.backend.fill(getattr(layer, name), 0.0)

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
        plan = self.memory_plan(m)
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
            setattr(owner, buf.name, x)
        self.shared = Shared(self._ones, self._workspace)
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
            setattr(owner, buf.name, None)
        self._batch = []
        self.capacity, self.m = 0, None

    def free(self):
        """Give back every device buffer of the network now (it cannot be used afterwards;
        a network that is simply dropped gives its memory back when it is collected)."""
        self._free_batch_buffers()
        for layer, buf, x in self._params:
            self.backend.free(x)
            setattr(layer, buf.name, None)
        self._params = []

    def _reset_sums(self):
        self.backend.fill(self._loss_sum, 0.0)
        self.backend.fill(self._hit_sum, 0.0)

    def _read_sums(self, n):
        """(mean loss, accuracy) over the n samples accumulated; one host read."""
        loss = float(np.sum(self.backend.download(self._loss_sum), dtype=np.float64))
        hits = float(np.sum(self.backend.download(self._hit_sum), dtype=np.float64))
        return loss / n, hits / n

    # -- one batch -----------------------------------------------------------------------

    def _upload_batch(self, xb, yb=None):
        self._bind(len(xb))
        self.backend.write(self.x, np.ascontiguousarray(xb.reshape(len(xb), -1).T))
        if yb is not None:
            self.backend.write(self.y, yb)

    def _forward(self, training=False):
        for layer in self.layers:
            layer.forward(training)

    def _loss(self):
        """Loss kernel: the delta into the last layer; each sample's loss and hit added to
        the epoch's sums (per batch position: the first m of the capacity)."""
        self.loss(self.backend, self.layers[-1], self.loss_sum, self.hit_sum, self.y)

    def _backward(self, opt):
        for i in reversed(range(len(self.layers))):
            last = i == len(self.layers) - 1
            self.layers[i].backward(opt, self._first[i], delta_in_z=last and self.loss.fused)

    def _step(self, opt):
        """Forward, loss, backward and update on the batch already on the device."""
        self._forward(training=True)
        self._loss()
        self._backward(opt)

    def _gather_step(self, opt, data):
        """The batch whose indices are in self.order, gathered from the training set on the
        device into the input and target buffers; then the step."""
        self.backend.gather(self.x, data[0], self.order)
        self.backend.gather(self.y, data[1], self.order)
        self._step(opt)

    def _data_on_device(self, x, t, mode):
        """(x (N, features), targets (N,) or (N, outputs)) uploaded to the device, or None
        (see fit's data_on_device)."""
        if mode not in ("auto", True, False):
            raise InputError(f"data_on_device must be 'auto', True or False, got {mode!r}")
        if mode is False or (mode == "auto" and not self.backend.is_gpu):
            return None
        samples = np.ascontiguousarray(x.reshape(len(x), -1))
        targets = t if t.ndim == 1 else np.ascontiguousarray(t.T)
        plan = self.memory_plan(self.capacity)
        need = [Buffer("fit", "training inputs", "dataset", samples.shape, samples.dtype),
                Buffer("fit", "training targets", "dataset", targets.shape, targets.dtype)]
        with_data = MemoryPlan(plan.buffers + need, plan.batch_size, plan.device,
                               plan.available, plan.max_alloc)
        if mode == "auto" and not (with_data.fits and with_data.total <= DATA_SHARE * plan.available):
            return None
        if not with_data.fits:
            raise refuse(with_data, "the training set on the device")
        made = allocate(self.backend, need)
        self.backend.write(made[0], samples)
        self.backend.write(made[1], targets)
        return made

    def _train_step(self, opt, data=None):
        """_step (after gathering the batch, with data on the device), replayed from a
        recorded graph where the device records them (CUDA; OpenCL's launch lists):
        the second step of a batch size and optimizer setting is captured, later ones are
        one launch. The first runs eagerly, so that kernels are built, GEMM shapes routed
        and workspaces grown before capture. The recorded step reads the same buffers
        (a new batch is uploaded into them) and bakes in its scalars (the rate: a new
        graph per setting); layers whose launches change every step (Dropout's key) keep
        the network eager. Replays give bit for bit the eager step's results."""
        key = (self.m, opt, data is not None)
        graph = self._graphs.get(key)
        if graph and not graph.current:         # it points at a workspace since freed
            graph = self._graphs[key] = None
        step = (lambda: self._gather_step(opt, data)) if data else (lambda: self._step(opt))
        if graph is None and key in self._graphs and self._capturable:
            graph = self._graphs[key] = self.backend.capture(step) or False
        if graph:
            graph()
        else:
            step()
            if key not in self._graphs and len(self._graphs) >= MAX_GRAPHS:
                self._graphs.clear()                    # a schedule makes one per epoch
            self._graphs.setdefault(key, None)          # seen once: capture next time

    def train_batch(self, x, y, optimizer=SGD()):
        """One forward, loss and backward step on one batch (no host synchronisation)."""
        _check_optimizer(optimizer)
        x, t = self._check_data(x, y)
        self._upload_batch(x, t)
        self._step(optimizer)

    # -- the user's API ------------------------------------------------------------------

    def fit(self, x, y, epochs=1, batch_size=32, optimizer=SGD(0.01, 0.9), seed=None,
            shuffle=True, validation_data=None, progress=None, on_epoch=None, schedule=None,
            data_on_device=False):
        """Train; returns a History of per-epoch loss, accuracy, lr and seconds.

        schedule (portanet.schedules, or its text such as "exponential(0.6)") sets each
        epoch's learning rate from optimizer.lr; without one the rate is constant.
        progress(done, total) is called after each batch; on_epoch(epoch, logs) after each
        epoch. The last batch of an epoch may be smaller than batch_size. A loss that
        becomes NaN or infinite ends training with a DivergedError.

        data_on_device: True uploads the training set once and gathers each shuffled batch
        there (the host sends the batch's indices only; an OutOfMemoryError if the memory
        plan has no room); "auto" does so on GPUs when the set takes at most half the room;
        False (the default) sends every batch from the host, which measured as fast or
        faster for LeNet on Fashion-MNIST on an H100 (bench/README.md).
        """
        _check_optimizer(optimizer)
        schedule = schedules.get(schedule)
        epochs = check_count("epochs", epochs, 1)
        batch_size = check_count("batch_size", batch_size, 1)
        x, t = self._check_data(x, y)
        n = len(x)
        rng = np.random.default_rng(self.seed if seed is None else
                                    check_count("seed", seed, 0))
        self._bind(min(batch_size, n))              # refused here, before any step, if too big
        data = self._data_on_device(x, t, data_on_device)
        try:
            return self._epochs(x, t, data, epochs, batch_size, optimizer, schedule, rng,
                                shuffle, validation_data, progress, on_epoch)
        finally:
            if data:
                for array in data:
                    self.backend.free(array)
                for key in [k for k in self._graphs if k[2]]:
                    del self._graphs[key]           # recorded with the data's buffers

    def _epochs(self, x, t, data, epochs, batch_size, optimizer, schedule, rng, shuffle,
                validation_data, progress, on_epoch):
        n = len(x)
        history = History(loss=[], accuracy=[], lr=[], seconds=[])
        batches = -(-n // batch_size)
        for epoch in range(epochs):
            start = time.perf_counter()
            lr = schedule(epoch, optimizer.lr)
            opt = dataclasses.replace(optimizer, lr=lr)
            order = rng.permutation(n) if shuffle else np.arange(n)
            self._bind(min(batch_size, n))
            self._reset_sums()
            for i in range(batches):
                idx = order[i * batch_size:(i + 1) * batch_size]
                if data:                            # the batch's indices, gathered there
                    self._bind(len(idx))
                    self.backend.write(self.order, idx.astype(np.int32))
                else:
                    self._upload_batch(x[idx], t[..., idx])
                self._train_step(opt, data)
                if progress:
                    progress(i + 1, batches)
            loss, acc = self._read_sums(n)      # the one host read of the epoch
            logs = {"loss": loss, "accuracy": acc, "lr": lr,
                    "seconds": time.perf_counter() - start}
            if not math.isfinite(loss):
                raise DivergedError(
                    f"training diverged in epoch {epoch + 1}: the loss is {loss} at learning "
                    f"rate {lr:g}; lower the learning rate (e.g. {lr / 10:g}), scale the "
                    f"inputs, or add a schedule with warmup", epoch=epoch, loss=loss, lr=lr,
                    history=history)
            if validation_data is not None:
                logs["val_loss"], logs["val_accuracy"] = self.evaluate(*validation_data)
            for k, v in logs.items():
                history.setdefault(k, []).append(v)
            if on_epoch:
                on_epoch(epoch, logs)
        return history

    def evaluate(self, x, y, batch_size=None):
        """(mean loss, accuracy) over the whole of x, y."""
        x, t = self._check_data(x, y)
        chunk = self._inference_batch(batch_size, len(x))
        self._bind(chunk)
        self._reset_sums()
        for i in range(0, len(x), chunk):
            self._upload_batch(x[i:i + chunk], t[..., i:i + chunk])
            self._forward()
            self._loss()
        return self._read_sums(len(x))

    def predict(self, x, batch_size=None):
        """The network's outputs, (N, outputs): probabilities for softmax/sigmoid outputs."""
        x = self._check_x(x)
        chunk = self._inference_batch(batch_size, len(x))
        out = np.empty((len(x), self.n_out), dtype=self.backend.dtype)
        for i in range(0, len(x), chunk):
            self._upload_batch(x[i:i + chunk])
            self._forward()
            out[i:i + chunk] = self.backend.download(self.layers[-1].a).T
        return out

    def predict_classes(self, x, batch_size=None):
        p = self.predict(x, batch_size)
        return (p[:, 0] > 0.5).astype(np.int64) if self.n_out == 1 else p.argmax(axis=1)

    def _inference_batch(self, batch_size, n):
        """The chunk size of evaluate and predict: as asked, or by default the batch
        buffers already there (at least 1000 samples), cut to what the memory plan allows."""
        if batch_size is not None:
            return min(check_count("batch_size", batch_size, 1), n)
        chunk = min(max(self.capacity, 1000), n)
        if chunk <= self.capacity or self.memory_plan(chunk).fits:
            return chunk
        return max(self._largest_batch(chunk), 1)      # 0: _bind raises with the numbers

    # -- input checks --------------------------------------------------------------------

    def _check_x(self, x):
        if not isinstance(x, np.ndarray):
            x = np.asarray(x)
        if not np.issubdtype(x.dtype, np.floating):
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
        with np.errstate(over="ignore"):
            cast = x.astype(self.backend.dtype, copy=False)
        if not np.all(np.isfinite(cast)):       # checked after the cast: 1e39 is inf in float32
            bad = int(np.argwhere(~np.isfinite(cast.reshape(len(cast), -1)))[0][0])
            what = "NaN or inf" if not np.all(np.isfinite(x)) else \
                f"values too large for {self.backend.dtype} (they become inf)"
            raise InputError(f"input contains {what} (first at sample {bad}); clean, impute "
                             f"or rescale the data before training")
        return cast

    def _check_data(self, x, y):
        x = self._check_x(x)
        y = np.asarray(y)
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

    def load_weights(self, path):
        """Parameters from a file saved by a network of the same architecture; checked
        whole before any is written, so a bad file leaves the network as it was."""
        saving.load_weights(self, path)

    def summary(self):
        """The layers, their output shapes and parameters, and the bytes they hold."""
        lines = [f"Sequential on {self.backend.name} ({self.backend.dtype}), "
                 f"input {self.input_shape}, loss {self.loss.name}"]
        total = 0
        for layer in self.layers:
            n = sum(elements(shape) for shape in layer.parameters().values())
            total += n
            lines.append(f"  {layer!r:48s} -> {str(layer.out_shape):16s} {n:>10,d} parameters")
        plan = self.memory_plan(self.capacity)
        kinds = ", ".join(f"{kind} {_size(nbytes)}" for kind, nbytes in plan.by_kind().items())
        lines.append(f"  {total:,d} parameters; {_size(plan.total)} on the device "
                     f"({kinds}{'' if self.capacity else '; batch buffers come with the first batch'})")
        return "\n".join(lines)

    def _describe(self):
        return saving.describe(self.architecture())


def _input_shape(shape):
    """The per-sample input shape as a tuple of whole numbers >= 1."""
    dims = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
    if not dims:
        raise ShapeError(f"input_shape must be a number of features or a tuple such as "
                         f"(1, 28, 28), got {shape!r}")
    return tuple(check_count("input_shape entries", d, 1) for d in dims)


def _check_optimizer(optimizer):
    if not isinstance(optimizer, SGD):
        raise InputError(f"optimizer must be an optimizer object such as "
                         f"pn.SGD(lr=0.01, momentum=0.9), got {optimizer!r}")

