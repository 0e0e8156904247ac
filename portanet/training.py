"""Training a Sequential network: the optimizer's state, one step, evaluation and fit.

network.py holds the network and the user's API, plan.py its memory (buffers, binding,
recorded steps); this module holds what training adds, working through the network's plan
(`net.plan`) and its public attributes, never its private ones:

- `OptimizerState`: the optimizer's buffers for every trainable layer (its `slots`, each a
  flat vector like the layer's parameters), the network's one gradient workspace (sized
  for the largest layer, or for the whole network: Plan.whole_workspace), the device
  scalars of Adam's bias correction, the step count, the loss scale, and the sum of
  squares of a clipped step's gradients.
  It is planned with the network's memory (plan.Plan.state_buffers) and allocated once,
  when fit first sees an optimizer of its kind; the plan holds it (`plan.state`); layers
  ask it where their gradient goes (`gradient`) and for the optimizer's kernel (`update`).
- a training step (`train_step`): forward and loss (the loss's own forward, which fuses
  what it can: losses.py), backward, recorded and replayed where the device records steps.
- `evaluate`: the mean loss and accuracy over checked data (Sequential.evaluate's, and
  fit's validation).
- `fit`: epochs of shuffled batches, validation, callbacks, checkpoints and resume, with
  its options in one `FitConfig`, which Sequential.fit makes from the user's keywords.

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

from . import callbacks as callback_module, distributed, dlpack, inputs, optim, progress
from . import schedules
from . import precision as precisions
from .errors import DivergedError, InputError, ModelFileError, check_count
from .layers import parameter_views
from .memory import Buffer, MemoryPlan, allocate, refuse
from .plan import flat_size, trainable
from .run_state import SCHEDULE_UNITS, Run, history_names, optimizer_config

log = logging.getLogger("portanet")

DATA_SHARE = 0.5        # fit keeps the training set on a GPU if all fits in this share
AUTO_EPOCHS = 2         # ... and runs this many epochs or more (data_on_device="auto")
DEFAULT_OPTIMIZER = optim.SGD(0.01, 0.9)


class OptimizerState:
    """The buffers an optimizer keeps for one network, and its step count t. It holds the
    network's trainable layers, not the network: no reference cycle, so a dropped network
    gives its memory back at once rather than at the next cycle collection."""

    def __init__(self, plan, optimizer):
        self.backend = plan.backend
        self._layers = trainable(plan.layers)
        # the trainable layers in the order backward updates them (others_update)
        self._backward = [l for top in reversed(plan.layers) for l in top.backward_order()
                          if l.parameters()]
        self.scaling = plan.scaling         # an optim.LossScale, or None
        self.kind = state_kind(optimizer, self.scaling)
        # every gradient in the workspace before the updates (loss scaling, clipping)
        self.gathered = plan.gathers(optimizer)
        self.optimizer = optimizer          # the one of this epoch (its lr follows the schedule)
        self.t = 0
        self.share = 1.0                    # this rank's part of the global batch (update)
        self.tokens = plan.tokens           # the loss is the mean over a sample's tokens too
        self._pending = []                  # layers whose update waits for finish()
        self._averaging = None              # in a distributed job: its Buckets
        # [(owner, Buffer, device array)], which the plan counts as held
        self.whole = plan.whole_for(optimizer)     # each layer its own part of the workspace
        self.arrays = plan.allocate(plan.state_buffers(optimizer))
        self.workspace = self.scalars = self.loss_scale = self.steps = self.squares = None
        bk = self.backend
        for owner, buf, x in self.arrays:
            if buf.dtype == np.int32:
                bk.write(x, np.zeros(x.size, np.int32))
            else:
                bk.clear(x)
            if owner is None and buf.name in optimizer.slots():    # one slot of all layers
                start = 0
                for _, layer in self._layers:
                    layer.state[buf.name] = bk.view(x, (flat_size(layer),), start)
                    start += flat_size(layer)
            elif owner is None:             # the network's (see Plan.state_buffers)
                setattr(self, buf.name, x)
            else:
                owner.state[buf.name] = x
        if self.scaling is not None:
            bk.write(self.loss_scale, [self.scaling.initial, 1 / self.scaling.initial, 0, 0])
        start = 0
        for _, layer in self._layers:
            views = {slot: _named_views(bk, layer, flat) for slot, flat in layer.state.items()}
            if self.workspace is not None:  # whole: each layer its own part of it
                views[None] = _named_views(bk, layer, bk.view(self.workspace,
                                                              (flat_size(layer),), start))
                start += flat_size(layer) if self.whole else 0
            layer.grad_views = views
            layer.grad_flat = {slot: views[slot]["flat"] for slot in views}

    def use(self, optimizer):
        """Train with `optimizer` (the same kind, this epoch's rate) from now on."""
        self.optimizer = optimizer
        self.rate = optimizer.lr        # a schedule by steps moves it before each step
        self._slot, self._scale, self._beta = optimizer.target(self.gathered)

    def begin_step(self):
        """Count the step; give the update the numbers of step t at this step's rate (Adam's
        bias correction and decay), of which a loss-scaled step forms the bias correction
        on the device (`finish`: a step it skips is not counted there) from the rate the
        host writes."""
        self.t += 1
        scalars = self.optimizer.step_scalars(self.t, self.rate)
        if scalars is None:
            return
        if self.scaling is None:
            self.backend.write(self.scalars, scalars)
        else:
            self.backend.write(self.backend.view(self.scalars, (2,), 2), scalars[2:])

    def gradient(self, layer):
        """({parameter name: view}, alpha, beta): where the layer writes its gradient."""
        return layer.grad_views[self._slot], self._scale / (layer.m * self.tokens), self._beta

    def update(self, layer):
        """The optimizer's kernel on the layer; in a distributed job (distributed.py) the
        layer's gradient target goes to the step's averaging over the ranks (this one
        weighted by its share of the global batch, `share`), and its kernel waits for
        `finish`, where the averaging ends. A target in the optimizer's own state (SGD's
        velocity) is the layer's alone, so its kernel waits for `finish`, which updates
        the step's layers together (Optimizer.update_layers: on GPUs one launch where a
        layer took one, 6-8 us of host time each on NVIDIA's OpenCL). No later layer's
        backward reads the parameters, so the results are the same bit for bit. The shared
        gradient workspace is the next layer's to write: its kernel goes at once."""
        target = layer.grad_flat[self._slot]
        group = distributed.current()
        if group is not None:       # the updates wait for the averaging's end (finish)
            self._averaging_in(group).add(target, self.share)
        if group is None and self._slot is None and not self.gathered:
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
        (one launch over the whole workspace), which the updates then obey; a clipped one
        then scales them to the optimizer's clip_norm where their global norm is above it
        (after the averaging of a distributed step, as with DDP); then the scale moves for
        the next step."""
        bk, scaling = self.backend, self.scaling
        group = distributed.current()
        if group is not None:
            self._averaging_in(group).end(self.share)
        if scaling is not None:
            bk.unscale_check(self.workspace, self.loss_scale, self.found)
            if self.steps is not None:
                self.optimizer.count_step(bk, self.scalars, self.steps, self.found)
        if self.optimizer.clip_norm is not None:
            # the workspace holds _scale times the gradient (plain SGD: -lr)
            bk.clip_norm(self.workspace, self.squares, self.optimizer.clip_norm, self._scale)
        if self._pending:
            self.optimizer.update_layers(bk, self._pending, self.scalars, self.found,
                                         self.gathered)
            self._pending = []
        if scaling is not None:
            bk.update_loss_scale(self.loss_scale, self.found, scaling.growth_interval,
                                 scaling.LOW, scaling.HIGH)

    def _averaging_in(self, group):
        """The job's bucketed averaging of this state's targets (distributed.Buckets)."""
        if self._averaging is None or self._averaging.group is not group:
            self._averaging = group.averaging(self.backend)
        return self._averaging

    def scale_now(self):
        """(the loss scale, steps skipped so far) read from the device, or None unscaled."""
        if self.scaling is None:
            return None
        scale, _, _, skipped = self.backend.download(self.loss_scale)
        return float(scale), int(skipped)

    def others_update(self):
        """The update of a distributed step this rank had no samples for (its empty share
        of a short last batch): the other ranks' averaged targets, then the optimizer,
        layer by layer in the order backward updates them (Layer.backward_order), so that
        the ranks' averagings pair up and this rank's weights stay theirs."""
        self.share = 0.0
        for layer in self._backward:
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
        for owner, buf, x in self.arrays:
            self.backend.free(x)
        for _, layer in self._layers:
            layer.state, layer.grad_views, layer.grad_flat = {}, {}, {}
        self.arrays = []


def state_kind(optimizer, scaling):
    """What decides an optimizer's buffers: equal kinds share them (and their values)."""
    return (type(optimizer), optimizer.slots(), optimizer.uses_workspace, scaling,
            optimizer.gathers)


def _named_views(bk, layer, flat):
    """layers.parameter_views of a flat vector, and "flat": its first flat_size elements."""
    return {"flat": bk.view(flat, (flat_size(layer),)), **parameter_views(layer, flat)}


def prepare(net, optimizer):
    """The network's OptimizerState for `optimizer`: kept if it is of the same kind (its
    values carry on, as in Keras and PyTorch), else planned and made anew; a state that
    does not fit is refused before anything is freed or allocated."""
    optimizer = optim.get(optimizer)
    plan = net.plan
    state = plan.state
    # a distributed job needs the whole network's gradient workspace (Plan.whole_workspace):
    # a state made alone with one layer's is made again, a whole one serves alone too
    if state is None or state.kind != state_kind(optimizer, plan.scaling) \
            or (optimizer.uses_workspace and plan.whole_workspace and not state.whole):
        memory = plan.memory(plan.capacity, optimizer)
        if not memory.fits:
            raise refuse(memory, f"training with {optimizer.describe()}")
        if state is not None:
            state.free()
            plan.state = None
            plan.replays.clear()
        state = plan.state = OptimizerState(plan, optimizer)
    state.use(optimizer)
    return state


# -- one step ------------------------------------------------------------------------------


def step(net, opt):
    """Forward, loss, backward and update on the batch already on the device."""
    plan = net.plan
    state, layers, loss = plan.state, plan.layers, plan.loss
    delta_in_z = loss.forward(plan.backend, layers, plan.y, plan.loss_sum, plan.hit_sum,
                              True, state)
    state.scale_delta(loss.delta(layers[-1]))
    backward(layers, plan.first, state, delta_in_z)


def backward(layers, first, state, delta_in_z):
    """Each layer's backward (first[i]: layer i skips da_prev), the last one's with
    delta_in_z as the loss's forward said; then the updates the layers left for the end."""
    last = len(layers) - 1
    for i in reversed(range(len(layers))):
        layers[i].backward(state, first[i], delta_in_z=i == last and delta_in_z)
    state.finish()


def begin_step(net):
    """What the host writes to the device before a step, outside what a recorded step
    replays: the optimizer's step numbers, Dropout's keys."""
    plan = net.plan
    plan.state.begin_step()
    for layer in plan.stepped:
        layer.begin_step()


def null_step(net):
    """A distributed step on no samples (see OptimizerState.others_update): the step's host
    work too (the optimizer's step count, Dropout's keys), so that every rank counts alike."""
    begin_step(net)
    net.plan.state.others_update()


def gather_step(net, opt, data):
    """The batch whose indices are in the plan's order, gathered from the training set on
    the device into the input and target buffers; then the step."""
    plan = net.plan
    plan.backend.gather_batch(plan.x, data[0], plan.y, data[1], plan.order)
    step(net, opt)


def staged_step(net, opt, staged):
    """The batch that Plan.stage left in staging laid out into the input buffer; then
    the step."""
    net.plan.backend.lay_out(net.plan.x, staged)
    step(net, opt)


def train_step(net, opt, data=None, staged=None):
    """step (after gathering the batch, with data on the device, or laying out the batch
    that Plan.stage staged), replayed from a recorded graph where the device records
    them (CUDA; OpenCL's launch lists: plan.Replays): the second step of a batch size and optimizer
    setting is captured, later ones are one launch. The first runs
    eagerly, so that kernels are built, GEMM shapes routed and workspaces grown before
    capture. The recorded step reads the same buffers (a new batch is uploaded into them,
    Adam's step numbers into its scalars, Dropout's key into its own: begin_step) and bakes
    in its other numbers (the rate: a new graph per setting); a layer whose launches could
    not be replayed would say so (capturable) and keep the network eager. Replays give bit
    for bit the eager step's results. In a distributed job the key holds this rank's share
    (its weight is baked into the recorded averaging), and a job whose averaging is host
    work between the launches (distributed.Group.records) runs every step eagerly."""
    begin_step(net)
    if data:
        work = lambda: gather_step(net, opt, data)
    elif staged is not None:
        work = lambda: staged_step(net, opt, staged)
    else:
        work = lambda: step(net, opt)
    group = distributed.current()
    plan = net.plan
    if group is not None and not group.records:
        work()
    else:
        plan.replays((plan.m, opt, data is not None, staged is not None,
                      group and plan.state.share), work)


def evaluate(net, x, t, batch_size=None):
    """(mean loss, accuracy) over data as inputs.check_data gives it (targets in the
    device's layout): Sequential.evaluate's, and fit's validation data, checked once for
    all its epochs."""
    plan = net.plan
    chunk = plan.inference_batch(batch_size, len(x))
    plan.bind(chunk)
    plan.reset_sums()
    plan.reset_nonfinite()

    def forward_loss():
        plan.loss.forward(plan.backend, plan.layers, plan.y, plan.loss_sum, plan.hit_sum)
    plan.foresee("evaluate", forward_loss, chunk, len(x))
    # the device runs batch i while i + 1 goes up (y is not changed before the sums
    # are read, which waits for the copies)
    for i in range(0, len(x), chunk):
        plan.upload(x[i:i + chunk], t[..., i:i + chunk], wait=False, first=i)
        plan.replays(("evaluate", plan.m), forward_loss)
    sums = plan.read_sums(len(x))
    plan.check_nonfinite()
    return sums


def train_batch(net, x, y, optimizer):
    """One forward, loss and backward step on one batch (no host synchronisation, but
    where x is on the device already: it is checked there for NaN and inf before the step,
    and let go after it). In a distributed job each rank gives its own batch, and the step
    is the one over all of them (the ranks' batch sizes are summed first)."""
    prepare(net, optimizer)
    plan = net.plan
    group = distributed.current()
    with dlpack.taken(x, net.backend) as x, distributed.collective():
        x, t = inputs.check_data(net, x, y)
        if group is not None:       # each rank its own batch: weighted by its size
            plan.state.share = len(x) / group.sum([len(x)])[0]
        if isinstance(x, dlpack.DeviceSamples):
            plan.scan_nonfinite(x, len(x))      # the batch laid out, and checked
            net.backend.write(plan.y, t)
        else:
            plan.upload(x, t)
        plan.replays.foresee({("train_batch", plan.m, optimizer): lambda: step(net, optimizer)})
        begin_step(net)
        step(net, optimizer)


def _labels_per_token_sent(net, x, mode):
    """Whether a sequence output's targets (a label per token) go up with each batch, as
    they must (the gathers take one label a sample); an InputError where fit was asked to
    keep them on the device."""
    if net.tokens == 1:
        return False
    if isinstance(x, dlpack.DeviceSamples) or mode is True:
        raise InputError("a sequence output's targets (a label per token) are sent with "
                         "each batch: give x as a host array and data_on_device='auto' or "
                         "False")
    return True


def data_on_device(net, x, t, mode, epochs):
    """(x (N, features), targets (N,) or (N, outputs)) on the device, or None (see fit's
    data_on_device; epochs: how many this call runs). DeviceSamples x are there already:
    the batches are gathered from its memory, whatever the mode, and only the targets go
    up. "auto" keeps the set on a GPU for two epochs or more: the upload, and recording the
    steps that gather from it, are paid once a call (docs/batches.md)."""
    if mode not in ("auto", True, False):
        raise InputError(f"data_on_device must be 'auto', True or False, got {mode!r}")
    in_place = isinstance(x, dlpack.DeviceSamples)
    if _labels_per_token_sent(net, x, mode):
        return None
    if not in_place and (mode is False or mode == "auto" and (
            not net.backend.is_gpu or epochs < AUTO_EPOCHS)):
        return None
    targets = t if t.ndim == 1 else np.ascontiguousarray(t.T)
    need = [Buffer("fit", "training targets", "dataset", targets.shape, targets.dtype)]
    if not in_place:
        samples = np.ascontiguousarray(x.reshape(len(x), -1))
        need.insert(0, Buffer("fit", "training inputs", "dataset", samples.shape,
                              samples.dtype))
    plan = net.plan.memory(net.plan.capacity)
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


@dataclasses.dataclass(frozen=True)
class FitConfig:
    """fit's options as one value: Sequential.fit makes it from the user's keywords (its
    docstring says what each does) and passes it down; `checked` gives it with each option
    checked and made the object it names."""
    epochs: int = 1
    batch_size: int = 32
    optimizer: object = DEFAULT_OPTIMIZER   # an optim.Optimizer
    seed: object = None                     # None: the network's
    shuffle: bool = True
    validation_data: object = None          # (x_val, y_val)
    validation_split: float = 0.0
    callbacks: object = None                # callbacks.Callback objects
    schedule: object = None                 # a schedules.Schedule, or its text
    checkpoint: object = None               # a path, written after each epoch
    resume: object = None                   # a path that checkpoint wrote
    progress: object = None                 # progress(done, total) after each batch
    on_epoch: object = None                 # on_epoch(epoch, logs) after each epoch
    data_on_device: object = "auto"         # True, False or "auto"
    verbose: object = "auto"                # 0, 1, 2, "auto", or a progress.Progress
    clip_norm: object = None                # the optimizer's clip_norm, given to fit
    schedule_unit: object = "epoch"         # what the schedule counts: "epoch" or "step"

    def checked(self):
        """This config with the optimizer, the schedule, epochs, batch_size and callbacks
        checked (an InputError naming the first that is wrong) and made objects."""
        optimizer = optim.clipped(optim.get(self.optimizer), self.clip_norm)
        if self.schedule_unit not in SCHEDULE_UNITS:
            raise InputError(f"schedule_unit must be 'epoch' or 'step', got "
                             f"{self.schedule_unit!r}")
        if self.schedule_unit == "step" and not optimizer.rate_on_device:
            raise InputError(f"a schedule by steps needs an optimizer that reads its rate "
                             f"from the device each step (Adam, AdamW); "
                             f"{type(optimizer).__name__}'s rate is part of its recorded "
                             f"step: give schedule_unit='epoch'")
        return dataclasses.replace(
            self, optimizer=optimizer, clip_norm=None, schedule=schedules.get(self.schedule),
            epochs=check_count("epochs", self.epochs, 1),
            batch_size=check_count("batch_size", self.batch_size, 1),
            callbacks=callback_module.checked(self.callbacks),
            verbose=progress.checked(self.verbose))


def fit(net, x, y, config):
    """Sequential.fit, with its options in `config` (a FitConfig). x and the validation
    inputs are taken through DLPack (dlpack.taken) for the whole of the call: arrays on the
    network's device (a CUDA tensor on cuda) are read in place, checked for NaN and inf
    there, and the batches gathered from them."""
    with contextlib.ExitStack() as held:
        x = held.enter_context(dlpack.taken(x, net.backend))
        validation = None
        if config.validation_data is not None:
            x_val, y_val = _pair(config.validation_data)
            validation = (held.enter_context(dlpack.taken(x_val, net.backend)), y_val)
        return _fit(net, x, y, validation, config)


def _fit(net, x, y, validation, config):
    from . import checkpoint as files, saving
    config = config.checked()
    x, t = inputs.check_data(net, x, y)
    _labels_per_token_sent(net, x, config.data_on_device)   # before anything changes
    if config.validation_split:
        if validation is not None:
            raise InputError("give validation_data or validation_split, not both")
        x, t, validation = _split(x, t, config.validation_split)
    elif validation is not None:
        validation = inputs.check_data(net, *validation)
    checkpoint, resume, epochs = config.checkpoint, config.resume, config.epochs
    if checkpoint is not None:
        files.check_destination(checkpoint)         # before the training, not after it
    # a ModelCheckpoint's saves, which hold no training state, never replace the checkpoint
    callback_module.keep_apart(config.callbacks, checkpoint)
    n = len(x)
    seed = net.seed if config.seed is None else check_count("seed", config.seed, 0)
    group = distributed.current()
    # everything the run's numbers depend on beside the architecture and the data: a run
    # resumed with other settings could not end where the uninterrupted one would
    settings = {"precision": net.backend.precision,
                "batch_size": config.batch_size, "optimizer": optimizer_config(config.optimizer),
                "schedule": repr(config.schedule), "seed": seed, "shuffle": bool(config.shuffle),
                "samples": n, "loss_scale": None, "loss": net.loss.name,
                "schedule_unit": config.schedule_unit,
                "validation": validation is not None,
                "ranks": group.size if group is not None else 1}
    if net.loss_scaling is not None:
        settings["loss_scale"] = net.loss_scaling.config()
    rng = np.random.default_rng(seed)
    run = Run(0, {}, rng.bit_generator.state, settings)
    if resume is not None:                  # refused here, before anything changes
        saving.check_resume(net, resume, settings, epochs)
    prepare(net, config.optimizer)          # refused here, before any step, if too big
    plan = net.plan
    plan.bind(min(config.batch_size, n))
    for checked in (x, validation and validation[0]):
        if isinstance(checked, dlpack.DeviceSamples):   # as check_data does on the host
            plan.scan_nonfinite(checked, plan.m)
    if resume is not None:
        run = saving.resume(net, resume, settings, epochs)
        rng.bit_generator.state = run.rng
    if group is not None:           # the same settings everywhere, and rank 0's start
        with distributed.collective():
            group.agree(dict(settings, epochs=epochs, validation=validation is not None,
                             resume=resume is not None,
                             # the targets' layout, which the all-reduces' spans follow
                             optimizer_state="one vector" if plan.state.whole else "per layer",
                             network=saving.describe(net.architecture())))
            group.broadcast_state(net)
    data = data_on_device(net, x, t, config.data_on_device, epochs - run.epoch)
    # what the run says as it goes (progress.py): rank 0's alone
    shown = progress.for_fit(config.verbose) if distributed.leader() else None
    try:
        with distributed.collective():
            return _epochs(net, x, t, data, validation, rng, run, config, shown)
    finally:
        if shown is not None:
            shown.close()               # a bar that an error left open
        if data:
            for array in data:
                net.backend.free(array)
            # recorded with the data's buffers
            plan.replays.forget(lambda key: len(key) == 5 and key[2])


def _epochs(net, x, t, data, validation, rng, run, config, shown):
    """fit's epochs from run.epoch on, over x, t (or `data`, the set on the device),
    validating on `validation` after each, shuffled by rng; reported to `shown` (a
    progress.Progress, or None)."""
    from . import saving
    n, plan, callbacks = len(x), net.plan, config.callbacks
    epochs, optimizer, checkpoint = config.epochs, config.optimizer, config.checkpoint
    history = net.history = _History(run.history or
                                     {k: [] for k in ("loss", "accuracy", "lr", "seconds")})
    # distributed: a global batch of each rank's share (distributed.py), this rank's part
    group = distributed.current()
    shares = group.shares(config.batch_size * group.size) if group else [config.batch_size]
    batch_size = sum(shares)
    batches = -(-n // batch_size)
    net.stop_training = False
    state = plan.state
    metrics = history_names(state.scaling is not None, validation is not None)
    for c in callbacks:
        c.on_train_begin(net, {"epochs": epochs, "metrics": metrics})
    logs = {}
    scaled = state.scale_now()                  # (scale, steps skipped), read once an epoch
    if shown is not None:
        shown.begin(epochs, batches, plan.read_sums)
    bar = shown if shown is not None and shown.draws_bar else None
    by_step = config.schedule_unit == "step"
    # the first and the last batch's builds together (a distributed job's last batch is each
    # rank's share of it: foreseen when it comes)
    if group is None:
        plan.state.use(optimizer)
        plan.bind(min(batch_size, n))
        plan.foresee(("train", data is not None), lambda: step(net, optimizer), plan.m, n)
    for epoch in range(run.epoch, epochs):
        if shown is not None:
            shown.start(epoch)
        start = time.perf_counter()
        if by_step:         # one recorded step; each one's rate reaches the device with it
            opt = optimizer
        else:
            lr = config.schedule(epoch, optimizer.lr)
            opt = dataclasses.replace(optimizer, lr=lr)
        plan.state.use(opt)
        order = rng.permutation(n) if config.shuffle else np.arange(n)
        plan.bind(min(max(shares), n))
        plan.reset_sums()
        trained = 0                             # this rank's samples of the epoch
        for i in range(batches):
            if by_step:                         # the rate of step t + 1 (t steps taken)
                lr = plan.state.rate = config.schedule(plan.state.t, optimizer.lr)
            idx = order[i * batch_size:(i + 1) * batch_size]
            if group:
                idx, plan.state.share = group.part(
                    idx, shares if len(idx) == batch_size else group.shares(len(idx)))
                if not len(idx):
                    null_step(net)
                    continue
                trained += len(idx)
            staged = None
            if data:                            # the batch's indices, gathered there
                plan.bind(len(idx))
                net.backend.write(plan.order, idx.astype(np.int32), wait=False)  # ours
            else:                               # laid out by the step: one launch of it
                staged = plan.stage(x[idx], t[..., idx])     # copies: ours
            train_step(net, opt, data, staged)
            if config.progress:
                config.progress(i + 1, batches)
            if bar is not None:
                bar.batch(trained if group else min((i + 1) * batch_size, n))
        loss, acc = _epoch_sums(net, n, group, trained)    # the one host read of the epoch
        logs = {"loss": loss, "accuracy": acc, "lr": lr,
                "seconds": time.perf_counter() - start}
        if scaled is not None:                  # what loss scaling did in the epoch
            skipped_before, scaled = scaled[1], state.scale_now()
            logs.update(loss_scale=scaled[0], skipped_steps=scaled[1] - skipped_before)
        if not math.isfinite(loss):
            raise DivergedError(
                f"training diverged in epoch {epoch + 1}: the loss is {loss} at learning "
                f"rate {progress.number(lr)}; lower the learning rate (e.g. "
                f"{progress.number(lr / 10)}), scale the "
                f"inputs, or add a schedule with warmup"
                + (f"; in fp16 a product's inputs from {precisions.HALF_OVERFLOW:g} up are "
                   f"inf: bf16 keeps float32's range" if net.backend.precision == "fp16"
                   else ""),
                epoch=epoch, loss=loss, lr=lr, history=history,
                precision=net.backend.precision)
        if validation is not None:              # checked by _fit: targets laid out
            logs["val_loss"], logs["val_accuracy"] = evaluate(net, *validation)
        for k, v in logs.items():
            history.setdefault(k, []).append(v)
        if checkpoint is not None and distributed.leader():
            try:
                saving.save(net, checkpoint, Run(epoch + 1, dict(history),
                                                 rng.bit_generator.state, run.settings))
            except ModelFileError as e:     # the training is worth more than its safety net
                log.warning("epoch %d's checkpoint was not written, the training goes on: %s",
                            epoch + 1, e)
        if shown is not None:
            shown.end(epoch, logs)
        if config.on_epoch:
            config.on_epoch(epoch, logs)
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
    sums = net.plan.read_sums(n, group)
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


def _split(x, t, fraction):
    """The last `fraction` of the samples (before any shuffling) set apart for validation,
    as Keras does: (x, t, (x_val, t_val)), the targets as inputs.check_data lays them out."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) \
            or not 0 < fraction < 1:
        raise InputError(f"validation_split must be a fraction in (0, 1), got {fraction!r}")
    keep = len(x) - int(round(len(x) * fraction))
    if keep < 1 or keep == len(x):
        raise InputError(f"validation_split={fraction} of {len(x)} samples leaves "
                         f"{keep} to train on and {len(x) - keep} to validate: both need one")
    return x[:keep], t[..., :keep], (x[keep:], t[..., keep:])
