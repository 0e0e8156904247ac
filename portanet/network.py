"""Sequential networks: build, fit, evaluate, predict, save and load.

Users hand in arrays samples-first, (N, features) or (N, C, H, W): NumPy's, or any other
library's through DLPack (portanet/dlpack.py); each batch goes to the device as it is and is
laid out there (features, batch) by the backend's write_samples (or, where the array is on
the network's device already, write_samples_device, straight from its memory), and
predictions are transposed once on download.

`Sequential` holds the layers and the user's API; its memory (parameters, optimizer state,
batch buffers sized for the largest batch seen, recorded steps) is its `plan`
(portanet/plan.py), what it takes in is checked by portanet/inputs.py, and training
(fit, train_batch, evaluate's loop) is portanet/training.py's, configured by one
training.FitConfig.
"""
import functools
import inspect
import threading

import numpy as np

from . import backends, dlpack, inputs, layers as layer_module, losses, optim, saving, training
from .errors import InputError, PortanetError, ShapeError, check_count
from .memory import WIDTH, elements, refuse, room_meaning, room_text, size_text as _size
from .memory import wrap
from .plan import Plan, flat_size
from .saving import checked_weights

# the most pinned host memory predict's background downloads fill before it waits for them
PREDICTIONS_BYTES = 16 * 2**20


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
        ids = [(path, l) for path, l in layer_module.walk(self.layers) if l.takes_ids]
        if ids and (ids[0][1] is not self.layers[0] or len(ids) > 1):
            path, layer = ids[-1] if ids[0][1] is self.layers[0] else ids[0]
            raise InputError(f"layer {path}, {layer}, takes token ids: it must be the "
                             f"network's first layer, and the only one")
        for layer in self.layers:
            shape = layer.configure(self.backend, shape)
        self.output_shape = shape
        # each layer that draws masks its own, where several share a seed (a GPT's)
        for i, (_, layer) in enumerate(layer_module.masking(self.layers)):
            layer.stream = i
        self._check_output()
        # the network's memory: its buffers, bound to the layers, and its recorded steps
        self.plan = Plan(self.backend, self.layers, self.loss, self.input_shape,
                         self.output_shape, self.loss_scaling)
        self.stop_training = False      # a callback sets it to end fit after this epoch
        planned = self.plan.memory(0)
        if not planned.fits:
            raise refuse(planned, f"the network {self._describe()}")
        self.plan.allocate_parameters(np.random.default_rng(self.seed))

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
                    layer is not last or self.loss.output_activation != "softmax"):
                raise ShapeError(f"{layer}: softmax is only supported as the output activation "
                                 f"with loss='softmax_cross_entropy'")
        sequence = isinstance(self.output_shape, layer_module.Tokens) \
            and isinstance(last, layer_module.Dense) and self.loss.name == "softmax_cross_entropy"
        if len(self.output_shape) != 1 and not sequence:
            raise ShapeError(f"the network's output has shape {self.output_shape} per sample; "
                             f"end with Flatten/Dense so it is a vector, or, for a sequence "
                             f"(features, T), with a Dense softmax a token at a time and "
                             f"loss='softmax_cross_entropy' (a class per token)")

    @property
    def n_in(self):
        return elements(self.input_shape)

    @property
    def n_out(self):
        """Outputs a sample, or a token of a sequence output."""
        return self.output_shape[0]

    @property
    def tokens(self):
        """Tokens of a sequence output a sample, each with its own target; else 1."""
        return self.output_shape[1] if self.sequence_output else 1

    @property
    def sequence_output(self):
        """Whether the output is a sequence, (classes, T) a sample: a class per token."""
        return isinstance(self.output_shape, layer_module.Tokens)

    # -- memory: planned, then allocated all or nothing ----------------------------------

    def walk(self):
        """(path, layer) of every layer, those inside Residual blocks included: "0",
        "3.1", "3.proj"; the prefixes of their parameters' names."""
        return layer_module.walk(self.layers)

    def memory_plan(self, batch_size, optimizer=None):
        """Every buffer the network holds when it trains on batches of `batch_size` (0:
        without batch buffers) with `optimizer` (default: the one it trains with, or before
        its first fit fit's default, SGD with momentum), with their bytes, the total and the
        room on the device (free memory plus what the network holds already)."""
        if optimizer is None:
            state = self.plan.state
            optimizer = state.optimizer if state else training.DEFAULT_OPTIMIZER
        plan = self.plan.memory(batch_size, optimizer)
        plan.layers = [(path, repr(layer), _layer_text(self, path, layer))
                       for path, layer in self.walk()]
        return plan

    @property
    def optimizer_state(self):
        """The optimizer's state (training.OptimizerState: its buffers, step count and
        loss scale), made by the first fit or train_batch; None before."""
        return self.plan.state

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
                self.plan.free()
                self._freed = True

    def _using(self, what):
        """The network held for one call that is not one of its methods (load_torch_state):
        see _Call."""
        return _Call(self, what)

    def _forward(self, training=False):
        """The forward pass alone (predict's)."""
        self.backend.drop_all_operands()    # what a step stopped midway kept
        for layer in self.layers:
            layer.forward(training)

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
        state = self.plan.state
        return state.scale_now() if state is not None and state.scaling is not None \
            else (self.loss_scaling.initial, 0)

    def train_batch(self, x, y, optimizer=training.DEFAULT_OPTIMIZER):
        """One forward, loss, backward and update on one batch (no host synchronisation;
        `loss_scale` reads what a loss-scaled step did)."""
        training.train_batch(self, x, y, optimizer)

    def fit(self, x, y, epochs=1, batch_size=32, optimizer=training.DEFAULT_OPTIMIZER,
            seed=None, shuffle=True, validation_data=None, validation_split=0.0,
            callbacks=None, schedule=None, checkpoint=None, resume=None, progress=None,
            on_epoch=None, data_on_device="auto", verbose="auto", clip_norm=None,
            schedule_unit="epoch"):
        """Train; returns a History (a dict) of per-epoch lists: loss, accuracy, lr,
        seconds, val_loss and val_accuracy when validating, and loss_scale and
        skipped_steps where the network scales its loss (fp16's default).

        x, y (and validation_data): NumPy arrays, or any with __dlpack__ (PyTorch, CuPy,
        JAX). Host memory is read without a copy. On cuda, an array on the network's GPU
        (float32, C-contiguous) is read in place: its batches are gathered there, whatever
        data_on_device says, and its targets come down to be checked (portanet/dlpack.py).

        optimizer: pn.SGD, pn.Adam, pn.AdamW or pn.RMSprop; its state is allocated at the
        first fit and kept by later ones of the same kind. schedule (portanet.schedules, or
        its text such as "cosine(30)") sets each epoch's learning rate from optimizer.lr;
        with schedule_unit="step" it counts steps instead and sets each step's (nanoGPT's
        "warmup(100, cosine(4900, 1e-4))"; Adam and AdamW, whose rate a recorded step reads
        from the device).
        clip_norm: before each update, the gradients are scaled down so that their global
        norm is at most this (torch.nn.utils.clip_grad_norm_; the optimizer's own
        clip_norm keyword does the same).
        validation_split sets the last fraction of x, y apart (before shuffling) to
        validate on after each epoch; or give validation_data=(x_val, y_val).
        callbacks: portanet.callbacks objects (EarlyStopping, ModelCheckpoint).
        checkpoint: a file saved atomically after each epoch with all that resuming needs
        (optimizer state, epoch, random generator); resume: such a file to go on from,
        with the same arguments: the run then ends bit for bit as an uninterrupted one.
        verbose, as Keras's: "auto" (the default) draws a progress bar where a person
        watches (stdout a terminal, or a notebook) and prints one line per epoch otherwise
        (a file, a log, a pipe); 0 prints nothing, 1 the bar (rate, time left, running loss
        and accuracy; tqdm's, the extra `progress`: without it, the lines), 2 the lines.
        In a distributed job rank 0 alone prints (portanet/progress.py).
        progress(done, total) is called after each batch and on_epoch(epoch, logs) after
        each epoch, whatever verbose says (hooks of the caller's own). The last batch of an
        epoch may be smaller than batch_size. A loss that becomes NaN or infinite ends
        training with a DivergedError.

        data_on_device: True uploads the training set once and gathers each shuffled batch
        there (the host sends the batch's indices only; an OutOfMemoryError if the memory
        plan has no room); False sends every batch from the host; "auto" (the default) keeps
        the set on a GPU when it takes at most half the room and the call runs two epochs
        or more. On an H100 that made a LeNet epoch on Fashion-MNIST 1.7x faster on NVIDIA's
        OpenCL and 1.07x on cuda, the MLP's 1.35x on cuda (docs/batches.md).
        """
        return training.fit(self, x, y, training.FitConfig(
            epochs=epochs, batch_size=batch_size, optimizer=optimizer, seed=seed,
            shuffle=shuffle, validation_data=validation_data,
            validation_split=validation_split, callbacks=callbacks, schedule=schedule,
            checkpoint=checkpoint, resume=resume, progress=progress, on_epoch=on_epoch,
            data_on_device=data_on_device, verbose=verbose, clip_norm=clip_norm,
            schedule_unit=schedule_unit))

    def evaluate(self, x, y, batch_size=None):
        """(mean loss, accuracy) over the whole of x, y (NumPy arrays, or any with
        __dlpack__: see fit)."""
        with dlpack.taken(x, self.backend) as x:
            return training.evaluate(self, *inputs.check_data(self, x, y, finite=False),
                                     batch_size)

    def predict(self, x, batch_size=None):
        """The network's outputs, (N, outputs), or (N, T, outputs) for a sequence output:
        probabilities for softmax/sigmoid outputs. x: a NumPy array, or any with __dlpack__
        (see fit)."""
        plan = self.plan
        with dlpack.taken(x, self.backend) as x:
            x = inputs.check_x(self, x, finite=False)
            chunk = plan.inference_batch(batch_size, len(x))
            per, tokens, sequence = self.n_out * self.tokens, self.tokens, self.sequence_output
            out = np.empty((len(x), *((tokens,) if sequence else ()), self.n_out),
                           dtype=self.backend.dtype)
            # the device runs batch i while batch i + 1 goes up; the outputs come back in
            # the background into pinned memory, a slot per batch, read when the slots are
            # full
            plan.bind(chunk)
            plan.foresee("predict", self._forward, chunk, len(x))
            plan.reset_nonfinite()
            each = per * chunk
            slots = self.backend.host_empty(
                (max(1, min(-(-len(x) // chunk), PREDICTIONS_BYTES // (each * out.itemsize))),
                 each))
            starts = []
            for i in range(0, len(x), chunk):
                plan.upload(x[i:i + chunk], first=i)
                plan.replays(("predict", plan.m), self._forward)
                a = self.layers[-1].a
                self.backend.download_into(a, slots[len(starts), :a.size])
                starts.append(i)
                if len(starts) == len(slots) or i + chunk >= len(x):
                    self.backend.synchronize()
                    for slot, start in zip(slots, starts):
                        n = min(chunk, len(x) - start)
                        block = slot[:n * per].reshape(self.n_out, tokens, n).transpose(2, 1, 0)
                        out[start:start + n] = block if sequence else block[:, 0]
                    starts = []
            plan.check_nonfinite()
            return out

    def predict_classes(self, x, batch_size=None):
        p = self.predict(x, batch_size)
        return (p[..., 0] > 0.5).astype(np.int64) if self.n_out == 1 else p.argmax(axis=-1)

    def generate(self, prompt, tokens, temperature=1.0, top_k=None, seed=None):
        """prompt (N, L) token ids (or (L,): one sequence) continued by `tokens` more, each
        drawn from the network's distribution for the token after the last: a language
        model's (token ids in, as Embedding takes them, and a class per token over the
        same ids out: gpt). The network sees the last `context` tokens (its input's T), the
        prompt's first ones padded after it, which a causal network does not look at.
        temperature divides the log-probabilities (below 1: surer; towards 0: the most
        likely alone); top_k keeps the k likeliest. seed: the draws' generator (None:
        fresh). Returns the prompt with its continuation, (N, L + tokens) (or (L +
        tokens,))."""
        first = self.layers[0]
        if not first.takes_ids or not self.sequence_output \
                or self.tokens != self.input_shape[0] or self.n_out != first.vocab:
            raise InputError("generate takes a language model: token ids in (Embedding "
                             "first) and, for each token, a class over the same ids out "
                             "(a last Dense softmax a token at a time, as gpt builds)")
        whole = [l for _, l in self.walk() if getattr(l, "causal", True) is False]
        if whole:
            raise InputError(f"generate takes a causal network: {whole[0]} attends to the "
                             f"tokens after each, which generate pads")
        count = check_count("tokens", tokens, 0)
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) \
                or not 0 < temperature < float("inf"):
            raise InputError(f"temperature must be a positive number, got {temperature!r}")
        if top_k is not None:
            top_k = min(check_count("top_k", top_k, 1), self.n_out)
        ids = np.asarray(prompt)
        one = ids.ndim == 1
        ids = ids[None] if one else ids
        if ids.ndim != 2 or ids.shape[1] == 0:
            raise ShapeError(f"prompt has shape {np.shape(prompt)}: give token ids (L,) or "
                             f"(N, L), at least one")
        first.check_ids(ids)            # refused here, not midway
        ids = ids.astype(np.int64)
        rng = np.random.default_rng(seed)
        context = self.input_shape[0]
        for _ in range(count):
            window = ids[:, -context:]
            last = window.shape[1] - 1
            padded = np.zeros((len(ids), context), np.int64)
            padded[:, :window.shape[1]] = window
            with np.errstate(divide="ignore"):
                logits = np.log(self.predict(padded)[:, last].astype(np.float64)) / temperature
            if top_k is not None:
                kth = np.sort(logits, axis=1)[:, -top_k][:, None]
                logits = np.where(logits < kth, -np.inf, logits)
            p = np.exp(logits - logits.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            drawn = [rng.choice(self.n_out, p=row) for row in p]
            ids = np.concatenate([ids, np.array(drawn)[:, None]], axis=1)
        return ids[0] if one else ids

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
        first, N free), atomically; needs the extra `onnx` (portanet/onnx_export.py)."""
        from . import onnx_export
        onnx_export.to_onnx(self, path, opset)

    def load_weights(self, path):
        """Parameters from a file saved by a network of the same architecture; checked
        whole before any is written, so a bad file leaves the network as it was."""
        saving.load_weights(self, path)

    def summary(self, optimizer=None):
        """The network as a table, as Keras's model.summary(): a row per layer (its number,
        its whole description, wrapped, its output shape and its parameters; the layers of a
        block below it), then the parameters, the bytes they hold on the device in training
        with `optimizer` (default as memory_plan's) against the device's room, and what
        the optimizer keeps per parameter. repr(net) and print(net) give it too."""
        bk = self.backend
        lines = wrap(f"Sequential on {bk.name} ({bk.dtype}, {bk.precision}): input "
                     f"{self.input_shape}, loss {self.loss.name}", "")
        rule = "  " + "-" * (WIDTH - 2)
        lines += [rule, f"  {'#':6s} {'layer':{_DESCRIBED}s} {'output shape':16s} "
                        f"{'parameters':>12s}", rule]
        total = 0
        walked = list(self.walk())
        for path, layer in walked:
            n = sum(flat_size(l) for p, l in walked                        # with its inner
                    if p == path or p.startswith(path + "."))
            total += n if "." not in path else 0
            indent = "  " * path.count(".")
            text = wrap(indent + _layer_text(self, path, layer), "", indent + "  ",
                        _DESCRIBED)
            lines.append(f"  {path:6s} {text[0]:{_DESCRIBED}s} {str(layer.out_shape):16s} "
                         f"{n:>12,d}")
            lines += [f"  {'':6s} {more}" for more in text[1:]]
        lines.append(rule)
        if optimizer is None:
            state = self.plan.state
            optimizer = state.optimizer if state else training.DEFAULT_OPTIMIZER
        capacity = self.plan.capacity
        plan = self.memory_plan(capacity, optimizer)
        kinds = ", ".join(f"{kind} {_size(nbytes)}" for kind, nbytes in plan.by_kind().items())
        lines += wrap(f"{total:,d} parameters; {_size(plan.total)} on the device ({kinds}"
                      f"{'' if capacity else '; batch buffers come with the first batch'}) "
                      f"of {room_text(plan.device, plan.available)}", "  ", "    ")
        itemsize, scaling = bk.dtype.itemsize, self.loss_scaling
        per = optimizer.bytes_per_parameter(itemsize)
        if scaling is not None:
            per += itemsize
            how = f" (its gradient kept whole for loss scaling, {scaling})"
        elif optimizer.uses_workspace:
            how = " and a gradient workspace as large as the largest layer"
        else:
            how = ""
        lines += wrap(f"training with {repr(optimizer)}: {per} bytes per parameter{how}",
                      "  ", "    ")
        lines += wrap(f"available: {room_meaning(plan.device)}", "  ", "    ")
        return "\n".join(lines)

    def __repr__(self):
        """The summary; a short line where it cannot be made now: a network that free()
        gave back, or one another thread is using (repr must neither raise nor wait for a
        call on the network; it reads the device's free memory, one driver call)."""
        short = f"<Sequential of {len(self.layers)} layers on {self.backend.name}"
        if not self._lock.acquire(blocking=False):
            return short + ": in use by another thread>"
        try:
            return short + ", freed>" if self._freed else self.summary()
        finally:
            self._lock.release()

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

_DESCRIBED = WIDTH - 2 - 6 - 1 - 1 - 16 - 1 - 12   # the summary's layer column


def _layer_text(net, path, layer):
    """A layer as a summary and a plan describe it: its repr; a block by the numbers of
    the layers inside it (each described on its own row)."""
    if not layer.sublayers():
        return repr(layer)
    inner = [p for p, _ in net.walk() if p.startswith(path + ".")]
    body = [p for p in inner if p.count(".") == path.count(".") + 1
            and not p.endswith(".proj")]
    through = [p for p in inner if p == path + ".proj"]
    return (f"{type(layer).__name__}(layers {body[0]} to {body[-1]}, added to its input"
            + (f" through {through[0]})" if through else ")"))


def _input_shape(shape):
    """The per-sample input shape as a tuple of whole numbers >= 1."""
    dims = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
    if not dims:
        raise ShapeError(f"input_shape must be a number of features or a tuple such as "
                         f"(1, 28, 28), got {shape!r}")
    return tuple(check_count("input_shape entries", d, 1) for d in dims)
