"""Sequential networks: build, fit, evaluate, predict, save and load.

Users hand in NumPy arrays samples-first, (N, features) or (N, C, H, W); each batch is
transposed once on upload to the device layout (features, batch) and predictions once
on download. Batch buffers are sized for the largest batch seen and viewed for smaller
ones, so after the first step of a size training allocates nothing.
"""
import io
import json
import time
import zipfile

import numpy as np

from . import backends, layers as layer_module, losses
from .errors import InputError, ModelFileError, ShapeError
from .optim import SGD

FORMAT = "portanet-model-1"


class Shared:
    """Buffers all layers of a network share: a ones vector (bias gradients by gemv) and
    the im2col workspace, sized once for the largest layer; workspace_holds names the
    conv layer whose cols it holds."""

    def __init__(self, ones, workspace):
        self.ones, self.workspace, self.workspace_holds = ones, workspace, None


class History(dict):
    """Per-epoch lists: loss, accuracy, seconds (and val_loss, val_accuracy if asked)."""


class Sequential:
    """A stack of layers trained with a fused loss and SGD with momentum.

    >>> net = Sequential([Dense(30, "relu"), Dense(1, "sigmoid")], input_shape=2,
    ...                  loss="binary_cross_entropy", device="cpu")
    """

    def __init__(self, layers, input_shape, loss="softmax_cross_entropy", device=None,
                 dtype="float32", seed=0):
        self.backend = backends.device(device, dtype)
        self.layers = list(layers)
        self.loss = losses.get(loss)
        self.input_shape = (input_shape,) if np.isscalar(input_shape) else tuple(input_shape)
        self.seed = seed
        if not self.layers:
            raise ShapeError("Sequential needs at least one layer")
        rng = np.random.default_rng(seed)
        shape = self.input_shape
        for layer in self.layers:
            shape = layer.build(self.backend, shape, rng)
        self.output_shape = shape
        self._check_output()
        # first[i]: layer i reads the network input directly, so it skips da_prev
        self._first = []
        seen_trainable = False
        for layer in self.layers:
            self._first.append(not seen_trainable)
            seen_trainable = seen_trainable or layer.trainable
        self.capacity = 0
        self.m = None

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

    # -- batch buffers -------------------------------------------------------------------

    @property
    def n_in(self):
        return int(np.prod(self.input_shape))

    @property
    def n_out(self):
        return self.output_shape[0]

    def _bind(self, m):
        """Make every layer's buffers views for a batch of m samples."""
        if m == self.m:
            return
        bk = self.backend
        if m > self.capacity:
            self._free_batch_buffers()
            self.capacity = m
            self._x = bk.empty((self.n_in * m,), label="network input")
            target_dtype = np.int32 if self.loss.name == "softmax_cross_entropy" else bk.dtype
            self._y = bk.empty((self.n_out * m,), target_dtype, label="targets")
            sizes = [layer.shared_sizes(m) for layer in self.layers]
            ones = max([m] + [n for n, _ in sizes])
            self.shared = Shared(bk.empty((ones,), label="ones"),
                                 bk.empty((max(1, max(w for _, w in sizes)),),
                                          label="im2col workspace"))
            bk.fill(self.shared.ones, 1.0)
            self._loss_buf = bk.empty((m,), label="per-sample loss")
            self._hit_buf = bk.empty((m,), label="per-sample hits")
            self._loss_sum = bk.zeros((m,), label="loss accumulator")
            self._hit_sum = bk.zeros((m,), label="hit accumulator")
            for layer in self.layers:
                layer.allocate(m)
        self.m = m
        self.x = bk.view(self._x, (self.n_in, m))
        self.y = bk.view(self._y, (m,) if self.loss.name == "softmax_cross_entropy"
                         else (self.n_out, m))
        self.loss_buf = bk.view(self._loss_buf, (m,))
        self.hit_buf = bk.view(self._hit_buf, (m,))
        a = self.x
        for layer in self.layers:
            layer.bind(a, m, self.shared)
            a = layer.a

    def _free_batch_buffers(self):
        if not self.capacity:
            return
        for x in (self._x, self._y, self.shared.ones, self.shared.workspace, self._loss_buf,
                  self._hit_buf, self._loss_sum, self._hit_sum):
            self.backend.free(x)
        for layer in self.layers:
            layer.free()
        self.capacity, self.m = 0, None

    def free(self):
        """Give back every device buffer of the network (it cannot be used afterwards)."""
        self._free_batch_buffers()
        for layer in self.layers:
            for name in ("w", "b", "v", "vb"):
                if getattr(layer, name, None) is not None:
                    self.backend.free(getattr(layer, name))
                    setattr(layer, name, None)

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
        """Loss kernel: the delta into the last layer, per-sample loss and hits summed."""
        bk, last = self.backend, self.layers[-1]
        self.loss(bk, last, self.loss_buf, self.hit_buf, self.y)
        bk.axpy(1.0, self.loss_buf, bk.view(self._loss_sum, (self.m,)))
        bk.axpy(1.0, self.hit_buf, bk.view(self._hit_sum, (self.m,)))

    def _backward(self, opt):
        for i in reversed(range(len(self.layers))):
            last = i == len(self.layers) - 1
            self.layers[i].backward(opt, self._first[i], delta_in_z=last and self.loss.fused)

    def _step(self, opt):
        """Forward, loss, backward and update on the batch already on the device."""
        self._forward(training=True)
        self._loss()
        self._backward(opt)

    def train_batch(self, x, y, optimizer=SGD()):
        """One forward, loss and backward step on one batch (no host synchronisation)."""
        x, t = self._check_data(x, y)
        self._upload_batch(x, t)
        self._step(optimizer)

    # -- the user's API ------------------------------------------------------------------

    def fit(self, x, y, epochs=1, batch_size=32, optimizer=SGD(0.01, 0.9), seed=None,
            shuffle=True, validation_data=None, progress=None, on_epoch=None):
        """Train; returns a History of per-epoch loss, accuracy and seconds.

        progress(done, total) is called after each batch; on_epoch(epoch, logs) after each
        epoch. The last batch of an epoch may be smaller than batch_size.
        """
        x, t = self._check_data(x, y)
        if int(batch_size) != batch_size or batch_size < 1:
            raise InputError(f"batch_size must be a positive integer, got {batch_size!r}")
        n = len(x)
        rng = np.random.default_rng(self.seed if seed is None else seed)
        history = History(loss=[], accuracy=[], seconds=[])
        batches = -(-n // batch_size)
        for epoch in range(epochs):
            start = time.perf_counter()
            order = rng.permutation(n) if shuffle else np.arange(n)
            self._bind(min(batch_size, n))
            self._reset_sums()
            for i in range(batches):
                idx = order[i * batch_size:(i + 1) * batch_size]
                self._upload_batch(x[idx], t[..., idx])
                self._step(optimizer)
                if progress:
                    progress(i + 1, batches)
            loss, acc = self._read_sums(n)      # the one host read of the epoch
            logs = {"loss": loss, "accuracy": acc, "seconds": time.perf_counter() - start}
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
        if batch_size is None:
            batch_size = max(self.capacity, 1000)
        return max(1, min(int(batch_size), n))

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
        flat_ok = len(self.input_shape) == 1 and int(np.prod(sample)) == self.n_in
        if sample != self.input_shape and not flat_ok:
            raise ShapeError(f"input has samples of shape {sample} but the network's first "
                             f"layer {self.layers[0]} expects {self.input_shape}: give x of "
                             f"shape (N, {', '.join(map(str, self.input_shape))})")
        if not np.all(np.isfinite(x)):
            bad = int(np.argwhere(~np.isfinite(x.reshape(len(x), -1)))[0][0])
            raise InputError(f"input contains NaN or inf (first at sample {bad}); clean or "
                             f"impute the data before training")
        return x.astype(self.backend.dtype, copy=False)

    def _check_data(self, x, y):
        x = self._check_x(x)
        y = np.asarray(y)
        if y.ndim == 0 or len(y) != len(x):
            raise ShapeError(f"x has {len(x)} samples but y has "
                             f"{len(y) if y.ndim else 'no'} : give one target per sample")
        t = self.loss.host_targets(y, self.n_out)
        if t.dtype != np.int32:
            t = t.astype(self.backend.dtype)
        return x, t

    # -- save and load -------------------------------------------------------------------

    def architecture(self):
        return {"format": FORMAT, "input_shape": list(self.input_shape),
                "loss": self.loss.name,
                "layers": [[type(l).__name__, l.config()] for l in self.layers]}

    def save(self, path):
        """One backend-neutral file (.npz): the architecture as JSON and float arrays."""
        arrays = {"architecture": np.frombuffer(json.dumps(self.architecture()).encode(),
                                                dtype=np.uint8)}
        for i, layer in enumerate(self.layers):
            for name, x in layer.params().items():
                arrays[f"{i}.{name}"] = self.backend.download(x)
        with open(path, "wb") as f:
            np.savez(f, **arrays)

    def load_weights(self, path):
        """Parameters from a file saved by a network of the same architecture."""
        arch, arrays = _read_model_file(path)
        mine = self.architecture()
        if arch["layers"] != mine["layers"] or arch["input_shape"] != mine["input_shape"]:
            raise ModelFileError(f"{path} holds a different architecture: "
                                 f"{_describe(arch)} vs this network's {_describe(mine)}; "
                                 f"use portanet.load({str(path)!r}) to rebuild it")
        for i, layer in enumerate(self.layers):
            for name, x in layer.params().items():
                value = arrays.get(f"{i}.{name}")
                if value is None or value.shape != x.shape:
                    raise ModelFileError(f"{path}: parameter {i}.{name} of {layer} is missing "
                                         f"or has the wrong shape")
                self.backend.write(x, value.astype(self.backend.dtype))

    def summary(self):
        lines = [f"Sequential on {self.backend.name} ({self.backend.dtype}), "
                 f"input {self.input_shape}, loss {self.loss.name}"]
        for layer in self.layers:
            n = sum(int(np.prod(x.shape)) for x in layer.params().values())
            lines.append(f"  {layer!r:40s} -> {layer.out_shape}  {n} parameters")
        return "\n".join(lines)


def load(path, device=None, dtype="float32"):
    """A network rebuilt from a file written by Sequential.save, on any device."""
    arch, _ = _read_model_file(path)
    try:
        layers = [layer_module.from_config(name, cfg) for name, cfg in arch["layers"]]
        net = Sequential(layers, arch["input_shape"], arch["loss"], device, dtype)
    except (KeyError, TypeError, ValueError) as e:
        raise ModelFileError(f"{path}: the architecture in the file is not valid ({e})") from e
    net.load_weights(path)
    return net


def _read_model_file(path):
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
        arch = json.loads(arrays.pop("architecture").tobytes().decode())
    except FileNotFoundError:
        raise
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, UnicodeDecodeError,
            EOFError, io.UnsupportedOperation) as e:
        raise ModelFileError(f"{path} is not a portanet model file ({e}); save one with "
                             f"net.save(path)") from e
    if not isinstance(arch, dict) or arch.get("format") != FORMAT:
        raise ModelFileError(f"{path}: unknown model format {arch.get('format')!r}, "
                             f"expected {FORMAT!r}")
    return arch, arrays


def _describe(arch):
    layers = " -> ".join(f"{n}({', '.join(f'{v}' for v in c.values())})"
                         for n, c in arch["layers"])
    return f"input {tuple(arch['input_shape'])} -> {layers}"
