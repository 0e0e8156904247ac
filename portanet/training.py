"""Training a Sequential network: the optimizer's state, one step, and fit's epochs.

network.py holds what a network is (layers, memory, inference, files); this module holds
what training adds to it:

- `OptimizerState`: the optimizer's buffers for every trainable layer (its `slots`, each a
  flat vector like the layer's parameters), the network's one gradient workspace (sized
  for the largest layer, or with loss scaling for the whole network), the device scalars of
  Adam's bias correction, the step count, and the loss scale.
  It is planned with the network's memory and allocated once, when fit first sees an
  optimizer of its kind; layers ask it where their gradient goes (`gradient`) and for the
  optimizer's kernel (`update`).
- a training step (`train_step`): forward, loss, backward, recorded and replayed where the
  device records steps.
- `fit`: epochs of shuffled batches, validation, callbacks, checkpoints and resume.

Checkpoints hold the parameters, the optimizer's state and step count, the epoch, fit's
random generator, Dropout's step counters and the history so far, so that a run resumed
from one ends bit for bit where the uninterrupted run would have (on a device whose
kernels are deterministic: the NumPy reference, PoCL, and CUDA/OpenCL without atomics).
"""
import contextlib
import dataclasses
import logging
import math
import time

import numpy as np

from . import callbacks as callback_module, distributed, dlpack, optim, schedules
from . import precision as precisions
from .errors import DivergedError, InputError, ModelFileError, check_count
from .layers import parameter_views
from .memory import Buffer, MemoryPlan, allocate, elements, refuse
from .run_state import Run, optimizer_config

log = logging.getLogger("portanet")

MAX_GRAPHS = 16         # recorded steps kept per network (see train_step)
DATA_SHARE = 0.5        # fit keeps the training set on a GPU if all fits in this share
AUTO_EPOCHS = 2         # ... and runs this many epochs or more (data_on_device="auto")
DEFAULT_OPTIMIZER = optim.SGD(0.01, 0.9)


class OptimizerState:
    """The buffers an optimizer keeps for one network, and its step count t. It holds the
    network's trainable layers, not the network: no reference cycle, so a dropped network
    gives its memory back at once rather than at the next cycle collection."""

    def __init__(self, net, optimizer, planned):
        self.backend = net.backend
        self._layers = trainable(net)
        self.scaling = net.loss_scaling     # an optim.LossScale, or None
        self.kind = state_kind(optimizer, self.scaling)
        self.optimizer = optimizer          # the one of this epoch (its lr follows the schedule)
        self.t = 0
        self.share = 1.0                    # this rank's part of the global batch (update)
        self._pending = []                  # layers whose update waits for finish()
        self._arrays = net._allocate(planned)
        self.workspace = self.scalars = self.loss_scale = self.steps = None
        bk = self.backend
        for owner, buf, x in self._arrays:
            if buf.dtype == np.int32:
                bk.write(x, np.zeros(x.size, np.int32))
            else:
                bk.fill(x, 0.0)
            if owner is None:               # the network's (see state_buffers)
                setattr(self, buf.name, x)
            else:
                owner.state[buf.name] = x
        if self.scaling is not None:
            bk.write(self.loss_scale, [self.scaling.initial, 1 / self.scaling.initial, 0, 0])
        start = 0
        for _, layer in self._layers:
            views = {slot: _named_views(bk, layer, flat) for slot, flat in layer.state.items()}
            if self.workspace is not None:  # scaled: each layer its own part of it
                views[None] = _named_views(bk, layer, bk.view(self.workspace,
                                                              (flat_size(layer),), start))
                start += flat_size(layer) if self.scaling is not None else 0
            layer.grad_views = views
            layer.grad_flat = {slot: views[slot]["flat"] for slot in views}

    def use(self, optimizer):
        """Train with `optimizer` (the same kind, this epoch's rate) from now on."""
        self.optimizer = optimizer
        self._slot, self._scale, self._beta = optimizer.target(self.scaling is not None)

    def begin_step(self):
        """Count the step; give the update the numbers of step t (Adam's bias correction),
        which a loss-scaled step forms on the device instead (`finish`: a step it skips is
        not counted there)."""
        self.t += 1
        scalars = self.optimizer.step_scalars(self.t)
        if scalars is not None and self.scaling is None:
            self.backend.write(self.scalars, scalars)

    def gradient(self, layer):
        """({parameter name: view}, alpha, beta): where the layer writes its gradient."""
        return layer.grad_views[self._slot], self._scale / layer.m, self._beta

    def update(self, layer):
        """The optimizer's kernel on the layer; in a distributed job (distributed.py) after
        averaging the layer's gradient target over the ranks, this one weighted by its
        share of the global batch (`share`). A target in the optimizer's own state (SGD's
        velocity) is the layer's alone, so its kernel waits for `finish`, which updates
        the step's layers together (Optimizer.update_layers: on GPUs one launch where a
        layer took one, 6-8 us of host time each on NVIDIA's OpenCL). No later layer's
        backward reads the parameters, so the results are the same bit for bit. The shared
        gradient workspace is the next layer's to write: its kernel goes at once."""
        target = layer.grad_flat[self._slot]
        group = distributed.current()
        if group is not None:
            group.average(self.backend, target, self.share)
        if self._slot is None and self.scaling is None:
            self.optimizer.update(self.backend, layer.flat, target, layer.state,
                                  layer.n_decay, self.scalars, self.found)
        else:
            self._pending.append((layer.flat, target, layer.state, layer.n_decay))

    def scale_delta(self, delta):
        """A scaled step's delta of the loss times the loss scale (before backward)."""
        if self.scaling is not None:
            self.backend.scale_by(delta, self.loss_scale)

    def finish(self):
        """The updates that `update` left for the end of backward. A scaled step first
        divides the network's gradients by the scale and looks for inf and NaN in them
        (one launch over the whole workspace), which the updates then obey; then the
        scale moves for the next step."""
        bk, scaling = self.backend, self.scaling
        if scaling is not None:
            bk.unscale_check(self.workspace, self.loss_scale, self.found)
            if self.steps is not None:
                self.optimizer.count_step(bk, self.scalars, self.steps, self.found)
        if self._pending:
            self.optimizer.update_layers(bk, self._pending, self.scalars, self.found,
                                         scaling is not None)
            self._pending = []
        if scaling is not None:
            bk.update_loss_scale(self.loss_scale, self.found, scaling.growth_interval,
                                 scaling.LOW, scaling.HIGH)

    def scale_now(self):
        """(the loss scale, steps skipped so far) read from the device, or None unscaled."""
        if self.scaling is None:
            return None
        scale, _, _, skipped = self.backend.download(self.loss_scale)
        return float(scale), int(skipped)

    def others_update(self):
        """The update of a distributed step this rank had no samples for (its empty share
        of a short last batch): the other ranks' averaged targets, then the optimizer,
        layer by layer in the order backward updates them (a block's projection, then its
        layers from the last), so that this rank's weights stay theirs."""
        self.share = 0.0
        for _, layer in reversed(self._layers):
            # zeros: weight 0 times a stale NaN would still be NaN
            self.backend.fill(layer.grad_flat[self._slot], 0.0)
            self.update(layer)
        self.finish()

    def tensors(self):
        """{name in a checkpoint: device array} of every state buffer."""
        tensors = {f"optimizer.{path}.{slot}": x for path, layer in self._layers
                   for slot, x in layer.state.items()}
        if self.scaling is not None:
            tensors["optimizer.loss_scale"] = self.loss_scale
        if self.steps is not None:
            tensors["optimizer.steps"] = self.steps
        return tensors

    def free(self):
        for owner, buf, x in self._arrays:
            self.backend.free(x)
        for _, layer in self._layers:
            layer.state, layer.grad_views, layer.grad_flat = {}, {}, {}
        self._arrays = []


def state_kind(optimizer, scaling):
    """What decides an optimizer's buffers: equal kinds share them (and their values)."""
    return type(optimizer), optimizer.slots(), optimizer.uses_workspace, scaling


def trainable(net):
    """(path, layer) of the layers with parameters, those inside Residual blocks included."""
    return [(path, layer) for path, layer in net.walk() if layer.parameters()]


def state_buffers(net, optimizer):
    """[(owner, Buffer)] of an optimizer's state for this network; owner None for the
    network-wide ones (kept by the OptimizerState): the gradient workspace (as large as
    the largest layer, or with loss scaling the whole network), Adam's step numbers, the
    loss scale, and `found`, the updates' skip flag (set by a scaled step that overflowed;
    an unscaled one keeps it 0)."""
    real = net.backend.dtype
    out, largest, total = [], 0, 0
    for path, layer in trainable(net):
        n = flat_size(layer)
        largest, total = max(largest, n), total + n
        out += [(layer, Buffer(repr(layer), slot, "optimizer state", (n,), real))
                for slot in optimizer.slots()]
    scaled = net.loss_scaling is not None
    if optimizer.uses_workspace or scaled:
        out.append((None, Buffer("network", "workspace", "workspace",
                                 (max(total if scaled else largest, 1),), real)))
    if optimizer.step_scalars(1) is not None:
        out.append((None, Buffer("network", "scalars", "optimizer state", (2,), real)))
        if scaled:                          # its steps, counted on the device
            out.append((None, Buffer("network", "steps", "optimizer state", (1,), real)))
    if scaled:
        out.append((None, Buffer("network", "loss_scale", "optimizer state", (4,), real)))
    out.append((None, Buffer("network", "found", "optimizer state", (1,), np.dtype(np.int32))))
    return out


def flat_size(layer):
    return sum(elements(shape) for shape in layer.parameters().values())


def _named_views(bk, layer, flat):
    """layers.parameter_views of a flat vector, and "flat": its first flat_size elements."""
    return {"flat": bk.view(flat, (flat_size(layer),)), **parameter_views(layer, flat)}


def prepare(net, optimizer):
    """The network's OptimizerState for `optimizer`: kept if it is of the same kind (its
    values carry on, as in Keras and PyTorch), else planned and made anew; a state that
    does not fit is refused before anything is freed or allocated."""
    optimizer = optim.get(optimizer)
    state = net.optimizer_state
    if state is None or state.kind != state_kind(optimizer, net.loss_scaling):
        plan = net.memory_plan(net.capacity, optimizer)
        if not plan.fits:
            raise refuse(plan, f"training with {optimizer.describe()}")
        if state is not None:
            state.free()
            net.optimizer_state = None
            net._graphs.clear()
        state = net.optimizer_state = OptimizerState(net, optimizer,
                                                     state_buffers(net, optimizer))
    state.use(optimizer)
    return state


# -- one step ------------------------------------------------------------------------------


def step(net, opt):
    """Forward, loss, backward and update on the batch already on the device."""
    state = net.optimizer_state
    delta_in_z = net._forward_loss(training=True, state=state)
    state.scale_delta(net._output_delta())
    net._backward(state, delta_in_z)


def begin_step(net):
    """What the host writes to the device before a step, outside what a recorded step
    replays: the optimizer's step numbers, Dropout's keys."""
    net.optimizer_state.begin_step()
    for layer in net._stepped:
        layer.begin_step()


def null_step(net):
    """A distributed step on no samples (see OptimizerState.others_update): the step's host
    work too (the optimizer's step count, Dropout's keys), so that every rank counts alike."""
    begin_step(net)
    net.optimizer_state.others_update()


def gather_step(net, opt, data):
    """The batch whose indices are in net.order, gathered from the training set on the
    device into the input and target buffers; then the step."""
    net.backend.gather_batch(net.x, data[0], net.y, data[1], net.order)
    step(net, opt)


def staged_step(net, opt, staged):
    """The batch that _stage_batch left in staging laid out into the input buffer; then
    the step."""
    net.backend.lay_out(net.x, staged)
    step(net, opt)


def train_step(net, opt, data=None, staged=None):
    """step (after gathering the batch, with data on the device, or laying out the batch
    that _stage_batch staged), replayed from a recorded graph where the device records
    them (CUDA; OpenCL's launch lists): the second step of a batch size and optimizer
    setting is captured, later ones are one launch. The first runs
    eagerly, so that kernels are built, GEMM shapes routed and workspaces grown before
    capture. The recorded step reads the same buffers (a new batch is uploaded into them,
    Adam's step numbers into its scalars, Dropout's key into its own: begin_step) and bakes
    in its other numbers (the rate: a new graph per setting); a layer whose launches could
    not be replayed would say so (capturable) and keep the network eager. Replays give bit
    for bit the eager step's results. In a distributed job always eagerly: the averaging is
    host work between the launches, which a step recorded alone would skip."""
    begin_step(net)
    if data:
        work = lambda: gather_step(net, opt, data)
    elif staged is not None:
        work = lambda: staged_step(net, opt, staged)
    else:
        work = lambda: step(net, opt)
    if distributed.current() is not None:
        work()
    else:
        replayed(net, (net.m, opt, data is not None, staged is not None), work)


def replayed(net, key, work):
    """work(), for the network's batch buffers as bound now: eagerly the first time key is
    seen, recorded the second (where the device and the layers can), replayed after. An
    eager step during which the backend moved something a recorded step would point at (a
    workspace grown mid-step: its `generation`) does not count as seen: the step recorded
    must find every workspace, and what is made for it (CUDA's tensor maps), made already,
    since a recording cannot make them."""
    graphs = net._graphs
    graph = graphs.get(key)
    if graph and not graph.current:             # it points at a workspace since freed
        del graphs[key]
        graph = None
    if graph is None and key in graphs and net._capturable:
        graph = graphs[key] = net.backend.capture(work) or False
    if graph:
        graph()
    else:
        generation = getattr(net.backend, "generation", 0)
        work()
        if key not in graphs and len(graphs) >= MAX_GRAPHS:
            graphs.clear()                      # a schedule makes one per epoch
        if getattr(net.backend, "generation", 0) == generation:
            graphs.setdefault(key, None)        # seen once: capture next time


def train_batch(net, x, y, optimizer):
    """One forward, loss and backward step on one batch (no host synchronisation, but
    where x is on the device already: it is checked there for NaN and inf before the step,
    and let go after it). In a distributed job each rank gives its own batch, and the step
    is the one over all of them (the ranks' batch sizes are summed first)."""
    prepare(net, optimizer)
    group = distributed.current()
    with dlpack.taken(x, net.backend) as x, distributed.collective():
        x, t = net._check_data(x, y)
        if group is not None:       # each rank its own batch: weighted by its size
            net.optimizer_state.share = len(x) / group.sum([len(x)])[0]
        if isinstance(x, dlpack.DeviceSamples):
            net._scan_nonfinite(x, len(x))      # the batch laid out, and checked
            net.backend.write(net.y, t)
        else:
            net._upload_batch(x, t)
        begin_step(net)
        step(net, optimizer)


def data_on_device(net, x, t, mode, epochs):
    """(x (N, features), targets (N,) or (N, outputs)) on the device, or None (see fit's
    data_on_device; epochs: how many this call runs). DeviceSamples x are there already:
    the batches are gathered from its memory, whatever the mode, and only the targets go
    up. "auto" keeps the set on a GPU for two epochs or more: the upload, and recording the
    steps that gather from it, are paid once a call (docs/batches.md)."""
    if mode not in ("auto", True, False):
        raise InputError(f"data_on_device must be 'auto', True or False, got {mode!r}")
    in_place = isinstance(x, dlpack.DeviceSamples)
    if not in_place and (mode is False or mode == "auto" and (
            not net.backend.is_gpu or epochs < AUTO_EPOCHS)):
        return None
    targets = t if t.ndim == 1 else np.ascontiguousarray(t.T)
    need = [Buffer("fit", "training targets", "dataset", targets.shape, targets.dtype)]
    if not in_place:
        samples = np.ascontiguousarray(x.reshape(len(x), -1))
        need.insert(0, Buffer("fit", "training inputs", "dataset", samples.shape,
                              samples.dtype))
    plan = net._plan(net.capacity)
    with_data = MemoryPlan(plan.buffers + need, plan.batch_size, plan.device,
                           plan.available, plan.max_alloc, precision=plan.precision)
    if mode == "auto" and not in_place and not (
            with_data.fits and with_data.total <= DATA_SHARE * plan.available):
        return None
    if not with_data.fits:
        raise refuse(with_data, "the training set on the device")
    made = allocate(net.backend, need)
    net.backend.write(made[-1], targets)
    if in_place:
        return [x.array, made[0]]               # not net.backend's: its free() passes it by
    net.backend.write(made[0], samples)
    return made


# -- fit -----------------------------------------------------------------------------------


def fit(net, x, y, epochs, batch_size, optimizer, seed, shuffle, validation_data,
        validation_split, progress, on_epoch, schedule, data_mode, callbacks, checkpoint,
        resume):
    """Sequential.fit. x and the validation inputs are taken through DLPack (dlpack.taken)
    for the whole of the call: arrays on the network's device (a CUDA tensor on cuda) are
    read in place, checked for NaN and inf there, and the batches gathered from them."""
    with contextlib.ExitStack() as held:
        x = held.enter_context(dlpack.taken(x, net.backend))
        if validation_data is not None:
            x_val, y_val = _pair(validation_data)
            validation_data = (held.enter_context(dlpack.taken(x_val, net.backend)), y_val)
        return _fit(net, x, y, epochs, batch_size, optimizer, seed, shuffle, validation_data,
                    validation_split, progress, on_epoch, schedule, data_mode, callbacks,
                    checkpoint, resume)


def _fit(net, x, y, epochs, batch_size, optimizer, seed, shuffle, validation_data,
         validation_split, progress, on_epoch, schedule, data_mode, callbacks, checkpoint,
         resume):
    from . import checkpoint as files, saving
    optimizer = optim.get(optimizer)
    schedule = schedules.get(schedule)
    epochs = check_count("epochs", epochs, 1)
    batch_size = check_count("batch_size", batch_size, 1)
    callbacks = callback_module.checked(callbacks)
    x, t = net._check_data(x, y)
    if validation_split:
        if validation_data is not None:
            raise InputError("give validation_data or validation_split, not both")
        x, t, validation_data = _split(net, x, t, validation_split)
    elif validation_data is not None:
        validation_data = net._check_data(*validation_data)
    if checkpoint is not None:
        files.check_destination(checkpoint)         # before the training, not after it
    # a ModelCheckpoint's saves, which hold no training state, never replace the checkpoint
    callback_module.keep_apart(callbacks, checkpoint)
    n = len(x)
    seed = net.seed if seed is None else check_count("seed", seed, 0)
    group = distributed.current()
    # everything the run's numbers depend on beside the architecture and the data: a run
    # resumed with other settings could not end where the uninterrupted one would
    settings = {"precision": net.backend.precision,
                "batch_size": batch_size, "optimizer": optimizer_config(optimizer),
                "schedule": repr(schedule), "seed": seed, "shuffle": bool(shuffle),
                "samples": n, "loss_scale": None, "loss": net.loss.name,
                "validation": validation_data is not None,
                "ranks": group.size if group is not None else 1}
    if net.loss_scaling is not None:
        settings["loss_scale"] = net.loss_scaling.config()
    rng = np.random.default_rng(seed)
    run = Run(0, {}, rng.bit_generator.state, settings)
    if resume is not None:                  # refused here, before anything changes
        saving.check_resume(net, resume, settings, epochs)
    prepare(net, optimizer)                 # refused here, before any step, if too big
    net._bind(min(batch_size, n))
    for checked in (x, validation_data and validation_data[0]):
        if isinstance(checked, dlpack.DeviceSamples):       # as _check_data does on the host
            net._scan_nonfinite(checked, net.m)
    if resume is not None:
        run = saving.resume(net, resume, settings, epochs)
        rng.bit_generator.state = run.rng
    if group is not None:           # the same settings everywhere, and rank 0's start
        with distributed.collective():
            group.agree(dict(settings, epochs=epochs, validation=validation_data is not None,
                             resume=resume is not None, network=net._describe()))
            group.broadcast_state(net)
    data = data_on_device(net, x, t, data_mode, epochs - run.epoch)
    try:
        with distributed.collective():
            return _epochs(net, x, t, data, epochs, batch_size, optimizer, schedule, rng,
                           shuffle, validation_data, progress, on_epoch, callbacks,
                           checkpoint, run)
    finally:
        if data:
            for array in data:
                net.backend.free(array)
            for key in [k for k in net._graphs if len(k) == 4 and k[2]]:
                del net._graphs[key]           # recorded with the data's buffers


def _epochs(net, x, t, data, epochs, batch_size, optimizer, schedule, rng, shuffle,
            validation_data, progress, on_epoch, callbacks, checkpoint, run):
    from . import saving
    n = len(x)
    history = net.history = _History(run.history or
                                     {k: [] for k in ("loss", "accuracy", "lr", "seconds")})
    # distributed: a global batch of each rank's share (distributed.py), this rank's part
    group = distributed.current()
    shares = group.shares(batch_size * group.size) if group else [batch_size]
    batch_size = sum(shares)
    batches = -(-n // batch_size)
    net.stop_training = False
    state = net.optimizer_state
    metrics = ["loss", "accuracy", "lr", "seconds"] + \
        (["loss_scale", "skipped_steps"] if state.scaling is not None else []) + \
        (["val_loss", "val_accuracy"] if validation_data is not None else [])
    for c in callbacks:
        c.on_train_begin(net, {"epochs": epochs, "metrics": metrics})
    logs = {}
    scaled = state.scale_now()                  # (scale, steps skipped), read once an epoch
    for epoch in range(run.epoch, epochs):
        start = time.perf_counter()
        lr = schedule(epoch, optimizer.lr)
        opt = dataclasses.replace(optimizer, lr=lr)
        net.optimizer_state.use(opt)
        order = rng.permutation(n) if shuffle else np.arange(n)
        net._bind(min(max(shares), n))
        net._reset_sums()
        trained = 0                             # this rank's samples of the epoch
        for i in range(batches):
            idx = order[i * batch_size:(i + 1) * batch_size]
            if group:
                idx, net.optimizer_state.share = group.part(
                    idx, shares if len(idx) == batch_size else group.shares(len(idx)))
                if not len(idx):
                    null_step(net)
                    continue
                trained += len(idx)
            staged = None
            if data:                            # the batch's indices, gathered there
                net._bind(len(idx))
                net.backend.write(net.order, idx.astype(np.int32), wait=False)  # ours
            else:                               # laid out by the step: one launch of it
                staged = net._stage_batch(x[idx], t[..., idx])     # copies: ours
            train_step(net, opt, data, staged)
            if progress:
                progress(i + 1, batches)
        loss, acc = _epoch_sums(net, n, group, trained)    # the one host read of the epoch
        logs = {"loss": loss, "accuracy": acc, "lr": lr,
                "seconds": time.perf_counter() - start}
        if scaled is not None:                  # what loss scaling did in the epoch
            skipped_before, scaled = scaled[1], state.scale_now()
            logs.update(loss_scale=scaled[0], skipped_steps=scaled[1] - skipped_before)
        if not math.isfinite(loss):
            raise DivergedError(
                f"training diverged in epoch {epoch + 1}: the loss is {loss} at learning "
                f"rate {lr:g}; lower the learning rate (e.g. {lr / 10:g}), scale the "
                f"inputs, or add a schedule with warmup"
                + (f"; in fp16 a product's inputs from {precisions.HALF_OVERFLOW:g} up are "
                   f"inf: bf16 keeps float32's range" if net.backend.precision == "fp16"
                   else ""),
                epoch=epoch, loss=loss, lr=lr, history=history)
        if validation_data is not None:         # checked by _fit: targets laid out
            logs["val_loss"], logs["val_accuracy"] = net._evaluate(*validation_data)
        for k, v in logs.items():
            history.setdefault(k, []).append(v)
        if checkpoint is not None and distributed.leader():
            try:
                saving.save(net, checkpoint, Run(epoch + 1, dict(history),
                                                 rng.bit_generator.state, run.settings))
            except ModelFileError as e:     # the training is worth more than its safety net
                log.warning("epoch %d's checkpoint was not written, the training goes on: %s",
                            epoch + 1, e)
        if on_epoch:
            on_epoch(epoch, logs)
        for c in callbacks:
            c.on_epoch_end(net, epoch, logs)
        if net.stop_training:
            break
    for c in callbacks:
        c.on_train_end(net, logs)
    return history


def _epoch_sums(net, n, group, trained):
    """(mean loss, accuracy) of the epoch's n samples: this process's sums, or in a
    distributed job every rank's (this one trained on `trained` of them). There the ranks
    are made alike again: BatchNorm's running statistics, which each rank kept from its own
    batches, averaged weighted by those samples; then rank 0's parameters and optimizer
    state everywhere, which ends the drift of ranks whose devices round differently."""
    sums = net._read_sums(n, group)
    if group is not None:
        for _, layer in net.walk():
            for name in layer.buffers():
                group.average(net.backend, getattr(layer, name), trained / n)
        group.broadcast_state(net)
    return sums


class _History(dict):
    """Per-epoch lists: loss, accuracy, lr, seconds (and val_loss, val_accuracy if asked)."""


def _pair(validation_data):
    if not isinstance(validation_data, (tuple, list)) or len(validation_data) != 2:
        raise InputError("validation_data must be a pair (x_val, y_val)")
    return validation_data


def _split(net, x, t, fraction):
    """The last `fraction` of the samples (before any shuffling) set apart for validation,
    as Keras does: (x, t, (x_val, t_val)), the targets as _check_data lays them out."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) \
            or not 0 < fraction < 1:
        raise InputError(f"validation_split must be a fraction in (0, 1), got {fraction!r}")
    keep = len(x) - int(round(len(x) * fraction))
    if keep < 1 or keep == len(x):
        raise InputError(f"validation_split={fraction} of {len(x)} samples leaves "
                         f"{keep} to train on and {len(x) - keep} to validate: both need one")
    return x[:keep], t[..., :keep], (x[keep:], t[..., keep:])
