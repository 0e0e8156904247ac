"""Parity with PyTorch: portanet's layers and optimizers train as torch's do.

For every device (conftest's device_name) and both dtypes, one network is built in
portanet and again in torch, torch's taking portanet's initial values (get_weights). Before
that the biases, BatchNorm's scale and shift and its running statistics are set to random
values (set_weights), so that weight decay wrongly applied to a bias, or a running average
that is not updated, shows. Both train 20 steps on the same batches (fit with
shuffle=False: x[0:B], x[B:2B], ...), mean softmax cross-entropy (torch: Linear +
CrossEntropyLoss). Then every parameter and running statistic is compared, the epoch's
mean loss, and the predictions and loss in inference (eval mode: running statistics) on
inputs not trained on. That the comparison can fail is checked too: torch's training must
move every compared tensor by more than twice the tolerance.

Optimizers: SGD with Nesterov momentum and weight decay, Adam (L2 in the gradient), AdamW
(decoupled), RMSprop with momentum and weight decay, centered RMSprop. Weight decay applies
to Dense and Conv2D weights only, so torch gets two parameter groups.

The oracle is torch on the CPU in float64, for every portanet device and both dtypes:
exact to float64 and deterministic (no cuDNN algorithm choice, no TF32), so a float32
portanet run is measured against the exact computation, not against another float32
rounding (torch's own on CUDA) that would double the error and leave a failure ambiguous;
it also runs wherever the tests do. Torch on CUDA would test torch's kernels, not
portanet's, so it is not used (torch's float64 on an H100 agreed with its float64 on the
CPU to within 2% of the float64 tolerance over 480 runs of these cases).

float64 runs the networks as written below and holds every element to rtol=1e-5,
atol=1e-9 * scale (scale: the tensor's largest magnitude): the formulas themselves.

float32 holds each tensor to ||ours - torch|| / ||torch|| < 1e-4, on the same networks made
smooth, because 20 steps in float32 cannot be held closer than that, by any library:
measured with torch's float32 against its float64 on these cases
(bench/parity_rounding.py),
- a relu, leaky relu or max pool whose input lies within rounding of its kink sends one
  sample's gradient elsewhere, and Adam, RMSprop and momentum carry that on: 1 to 2% of
  runs ended 1e-5 to 4e-2 apart, SGD runs included. float32 therefore takes elu for relu
  and leaky_relu and average for max pooling (float64 tests those: rounding there is
  1e-16, nothing lies that close);
- Adam and RMSprop divide by the gradient's root mean square, which makes the rounding
  of a small gradient a step of up to the learning rate: with eps = 1e-8, 1% of runs
  still ended beyond 1e-5. float32 gives both libraries eps = 1e-4, which keeps steps of
  gradients below 1e-4 proportional to them;
- a bias that feeds BatchNorm directly (Conv2D or Dense with a linear activation, as in a
  ResNet) has a gradient that is zero in exact arithmetic (BatchNorm subtracts the batch
  mean) and about 1e-9 from rounding, which Adam and RMSprop turn into steps of about the
  learning rate in a random direction. float32 puts a gelu before each BatchNorm, so that
  every parameter compared has a real gradient. (In float64 the noise, about 1e-17, is far
  below eps: such a bias moves less than 1e-10, and it is exempt only from the check that
  it moved.)
So made, torch's float32 stayed within 2e-5 of its float64 over 3200 runs (99% within
4e-6, median 4e-7); 1e-4 leaves a margin for a different summation order.
"""
import math

import numpy as np
import pytest

import portanet as pn
from conftest import get_backend

torch = pytest.importorskip("torch", reason="PyTorch (the oracle of these tests) is not "
                                            "installed: pip install torch")
F = torch.nn.functional

STEPS, BATCH = 20, 16
RTOL64, ATOL64 = 1e-5, 1e-9     # float64: elementwise; atol times the tensor's largest |x|
TOL32 = 1e-4                    # float32: ||ours - torch|| / ||torch|| per tensor
MOVED = 2 * TOL32               # torch moves every compared tensor by more than this
EPS32 = 1e-4                    # Adam's and RMSprop's eps in float32 (see the docstring)
CLASSES = 5

# (portanet/torch class, its arguments): every argument given, so that neither side's
# defaults are relied on
OPTIMIZERS = {
    "sgd-nesterov": ("SGD", dict(lr=0.02, momentum=0.9, nesterov=True, weight_decay=1e-3)),
    "adam": ("Adam", dict(lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-3)),
    "adamw": ("AdamW", dict(lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2)),
    "rmsprop-momentum": ("RMSprop", dict(lr=1e-3, alpha=0.99, eps=1e-8, weight_decay=1e-3,
                                         momentum=0.5, centered=False)),
    "rmsprop-centered": ("RMSprop", dict(lr=1e-3, alpha=0.99, eps=1e-8, weight_decay=0.0,
                                         momentum=0.0, centered=True)),
}


# -- the networks, written once for both libraries --------------------------------------
#
#   ("dense", units, activation)
#   ("conv", filters, kernel, stride, padding, activation)
#   ("maxpool", pool, stride)      ("avgpool", pool, stride)
#   ("gap",)                       ("flatten",)
#   ("bn", activation)             BatchNorm (momentum 0.1, eps 1e-5: torch's defaults)
#   ("res", [items], activation)   Residual; a 1x1 conv projection where shapes change
#
# pre: the activation of a layer feeding a BatchNorm (see the module's docstring)

def mlp(hidden):
    return lambda pre: [("dense", 16, "relu"), ("dense", 12, hidden),
                        ("dense", CLASSES, "softmax")]


def cnn(pre):
    return [("conv", 6, 3, 1, 0, "relu"), ("maxpool", 2, 2),
            ("conv", 8, 3, 2, 1, "elu"), ("flatten",), ("dense", CLASSES, "softmax")]


def bn_conv(pre):
    return [("conv", 6, 3, 1, 1, pre), ("bn", "relu"), ("gap",),
            ("dense", CLASSES, "softmax")]


def bn_dense(pre):
    return [("dense", 16, pre), ("bn", "sigmoid"), ("dense", CLASSES, "softmax")]


def res_identity(pre):
    block = [("conv", 4, 3, 1, 1, pre), ("bn", "relu"), ("conv", 4, 3, 1, 1, pre), ("bn", "linear")]
    return [("conv", 4, 3, 1, 1, "relu"), ("res", block, "relu"), ("gap",),
            ("dense", CLASSES, "softmax")]


def res_projection(pre):
    """Stride 2 and more filters in the block: the shortcut is a 1x1 convolution."""
    block = [("conv", 8, 3, 2, 1, pre), ("bn", "relu"), ("conv", 8, 3, 1, 1, pre), ("bn", "linear")]
    return [("conv", 4, 3, 1, 1, "leaky_relu"), ("res", block, "relu"), ("avgpool", 2, 2),
            ("flatten",), ("dense", CLASSES, "softmax")]


NETWORKS = {                    # name: (input shape, spec for a pre-BatchNorm activation)
    "mlp-tanh": ((10,), mlp("tanh")),
    "mlp-gelu": ((10,), mlp("gelu")),
    "mlp-silu": ((10,), mlp("silu")),
    "cnn": ((2, 10, 10), cnn),
    "bn-conv": ((2, 6, 6), bn_conv),
    "bn-dense": ((10,), bn_dense),
    "residual": ((3, 6, 6), res_identity),
    "residual-projection": ((3, 8, 8), res_projection),
}

KINKED = {"relu": "elu", "leaky_relu": "elu"}


def smooth(spec):
    """The spec for float32: elu for relu and leaky_relu, average for max pooling."""
    out = []
    for kind, *args in spec:
        if kind == "res":
            out.append((kind, smooth(args[0]), KINKED.get(args[1], args[1])))
        elif kind == "maxpool":
            out.append(("avgpool", *args))
        elif kind in ("dense", "conv", "bn"):
            out.append((kind, *args[:-1], KINKED.get(args[-1], args[-1])))
        else:
            out.append((kind, *args))
    return out


NEEDED = ("Adam", "AdamW", "RMSprop", "BatchNorm", "AvgPool2D", "GlobalAvgPool2D", "Residual")


def portanet_layers(spec):
    layers = []
    for kind, *args in spec:
        if kind == "dense":
            layers.append(pn.Dense(args[0], args[1]))
        elif kind == "conv":
            filters, k, stride, pad, act = args
            layers.append(pn.Conv2D(filters, k, stride=stride, padding=pad, activation=act))
        elif kind == "maxpool":
            layers.append(pn.MaxPool2D(*args))
        elif kind == "avgpool":
            layers.append(pn.AvgPool2D(*args))
        elif kind == "gap":
            layers.append(pn.GlobalAvgPool2D())
        elif kind == "flatten":
            layers.append(pn.Flatten())
        elif kind == "bn":
            layers.append(pn.BatchNorm(activation=args[0], momentum=0.1, eps=1e-5))
        elif kind == "res":
            layers.append(pn.Residual(portanet_layers(args[0]), activation=args[1]))
        else:
            raise ValueError(kind)
    return layers


# -- the torch twin ---------------------------------------------------------------------

ACTIVATIONS = {
    "linear": lambda x: x,
    "softmax": lambda x: x,     # the output layer gives logits: CrossEntropyLoss's input
    "relu": F.relu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "leaky_relu": lambda x: F.leaky_relu(x, 0.01),
    "elu": lambda x: F.elu(x, 1.0),
    "gelu": lambda x: F.gelu(x, approximate="none"),
    "silu": F.silu,
}


def out_size(n, k, stride, pad):
    return (n + 2 * pad - k) // stride + 1


class TorchNet(torch.nn.Module):
    """A spec as torch modules (float64, CPU) with its forward written out.

    tensors: portanet's name -> (module, attribute, portanet's shape) of every parameter
    and running statistic; decayed: the names weight decay applies to (Dense and Conv2D
    weights, the projection's too); gradient_free: biases that feed a BatchNorm directly,
    whose exact gradient is zero."""

    def __init__(self, spec, in_shape):
        super().__init__()
        self.mods = torch.nn.ModuleList()
        self.tensors, self.decayed, self.gradient_free = {}, set(), set()
        self.body, self.out_shape = self._build(spec, tuple(in_shape), "")

    def forward(self, x):
        return self.body(x)

    def _build(self, spec, shape, prefix):
        steps = []
        for i, (kind, *args) in enumerate(spec):
            step, shape = self._layer(kind, args, shape, f"{prefix}{i}.")
            steps.append(step)
            if kind == "bn" and i and spec[i - 1][0] in ("dense", "conv") \
                    and spec[i - 1][-1] == "linear":
                self.gradient_free.add(f"{prefix}{i - 1}.b")

        def body(x):
            for step in steps:
                x = step(x)
            return x
        return body, shape

    def _affine(self, module, name, w_shape):
        self.mods.append(module)
        self.tensors[name + "w"] = (module, "weight", w_shape)
        self.tensors[name + "b"] = (module, "bias", (w_shape[0],))
        self.decayed.add(name + "w")
        return module

    def _layer(self, kind, args, shape, name):
        f64 = torch.float64
        if kind == "dense":
            units, act = args
            n_in = math.prod(shape)
            linear = self._affine(torch.nn.Linear(n_in, units, dtype=f64), name, (units, n_in))
            return (lambda x: ACTIVATIONS[act](linear(x.flatten(1)))), (units,)
        if kind == "conv":
            filters, k, stride, pad, act = args
            c, h, w = shape
            conv = self._affine(torch.nn.Conv2d(c, filters, k, stride=stride, padding=pad,
                                                dtype=f64), name, (filters, c * k * k))
            return (lambda x: ACTIVATIONS[act](conv(x))), \
                (filters, out_size(h, k, stride, pad), out_size(w, k, stride, pad))
        if kind in ("maxpool", "avgpool"):
            pool, stride = args
            cls = torch.nn.MaxPool2d if kind == "maxpool" else torch.nn.AvgPool2d
            module = cls(pool, stride)
            c, h, w = shape
            return module, (c, out_size(h, pool, stride, 0), out_size(w, pool, stride, 0))
        if kind == "gap":
            return (lambda x: x.mean(dim=(2, 3))), (shape[0],)
        if kind == "flatten":
            return (lambda x: x.flatten(1)), (math.prod(shape),)
        if kind == "bn":
            (act,) = args
            cls = torch.nn.BatchNorm1d if len(shape) == 1 else torch.nn.BatchNorm2d
            bn = cls(shape[0], eps=1e-5, momentum=0.1, dtype=f64)
            self.mods.append(bn)
            for ours, theirs in (("gamma", "weight"), ("beta", "bias"),
                                 ("running_mean", "running_mean"), ("running_var", "running_var")):
                self.tensors[name + ours] = (bn, theirs, (shape[0],))
            return (lambda x: ACTIVATIONS[act](bn(x))), shape
        if kind == "res":
            layers, act = args
            inner, out = self._build(layers, shape, name)
            proj = None
            if out != shape and len(shape) == 1:
                proj = self._affine(torch.nn.Linear(shape[0], out[0], dtype=f64),
                                    name + "proj.", (out[0], shape[0]))
            elif out != shape:                  # the stride that makes the shapes agree
                stride = next(s for s in range(1, max(shape[1:]) + 1)
                              if (out_size(shape[1], 1, s, 0), out_size(shape[2], 1, s, 0)) == out[1:])
                proj = self._affine(torch.nn.Conv2d(shape[0], out[0], 1, stride=stride,
                                                    dtype=f64), name + "proj.", (out[0], shape[0]))
            return (lambda x: ACTIVATIONS[act](inner(x) + (proj(x) if proj else x))), out
        raise ValueError(kind)

    def load(self, weights):
        with torch.no_grad():
            for name, (module, attr, _) in self.tensors.items():
                target = getattr(module, attr)
                value = torch.from_numpy(np.asarray(weights[name], dtype=np.float64))
                target.copy_(value.reshape(target.shape))

    def weights(self):
        """{portanet name: float64 array in portanet's shape}."""
        return {name: getattr(module, attr).detach().numpy().reshape(shape).copy()
                for name, (module, attr, shape) in self.tensors.items()}

    def optimizer(self, cls, settings):
        """torch's optimizer with weight decay on the weights only (two groups)."""
        settings = dict(settings)
        decay = settings.pop("weight_decay")
        params = [(name, getattr(m, a)) for name, (m, a, _) in self.tensors.items()
                  if isinstance(getattr(m, a), torch.nn.Parameter)]
        assert len(params) == len(list(self.parameters())), "a torch parameter is not mapped"
        groups = [{"params": [p for n, p in params if n in self.decayed], "weight_decay": decay},
                  {"params": [p for n, p in params if n not in self.decayed], "weight_decay": 0.0}]
        return getattr(torch.optim, cls)(groups, **settings)

    def train_steps(self, optimizer, x, y):
        """STEPS steps on batches x[0:B], x[B:2B], ...; the mean of the batches' losses."""
        self.train()
        losses = []
        for i in range(STEPS):
            xb = torch.from_numpy(x[i * BATCH:(i + 1) * BATCH].astype(np.float64))
            yb = torch.from_numpy(y[i * BATCH:(i + 1) * BATCH].astype(np.int64))
            optimizer.zero_grad()
            loss = F.cross_entropy(self(xb), yb)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        return float(np.mean(losses))

    def infer(self, x, y):
        """(probabilities, mean loss) in eval mode."""
        self.eval()
        with torch.no_grad():
            logits = self(torch.from_numpy(x.astype(np.float64)))
            loss = F.cross_entropy(logits, torch.from_numpy(y.astype(np.int64))).item()
            return torch.softmax(logits, dim=1).numpy(), loss


# -- helpers --------------------------------------------------------------------------

def randomized(weights, rng):
    """Initial values with random biases, BatchNorm scale, shift and running statistics
    (portanet starts them at 0 or 1), weights as portanet drew them."""
    out = {}
    for name, value in weights.items():
        leaf = name.rpartition(".")[2]
        shape = np.shape(value)
        if leaf in ("b", "beta", "running_mean"):
            value = rng.uniform(-0.2, 0.2, shape)
        elif leaf == "gamma":
            value = rng.uniform(0.8, 1.2, shape)
        elif leaf == "running_var":
            value = rng.uniform(0.5, 1.5, shape)
        out[name] = np.asarray(value, dtype=np.float64)
    return out


def agree(ours, ref, dtype, what):
    """The module's tolerance for dtype; a message naming what and by how much if not."""
    ours, ref = np.asarray(ours, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    assert ours.shape == ref.shape, f"{what}: shape {ours.shape}, torch's {ref.shape}"
    assert np.all(np.isfinite(ours)), f"{what}: NaN or inf"
    if dtype == "float64":
        scale = float(np.max(np.abs(ref))) if ref.size else 0.0
        np.testing.assert_allclose(ours, ref, rtol=RTOL64, atol=ATOL64 * scale, err_msg=what)
    else:
        err = np.linalg.norm(ours - ref) / max(np.linalg.norm(ref), 1e-30)
        assert err < TOL32, f"{what}: relative error {err:.2e} >= {TOL32:g}"


def need_api():
    missing = [n for n in NEEDED if not hasattr(pn, n)]
    missing += [f"Sequential.{m}" for m in ("get_weights", "set_weights")
                if not hasattr(pn.Sequential, m)]
    if missing:
        pytest.skip(f"portanet has no {', '.join(missing)} yet")


# -- the test ---------------------------------------------------------------------------

@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
@pytest.mark.parametrize("net_name", list(NETWORKS))
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_trains_as_torch(device_name, dtype, net_name, opt_name, rng):
    need_api()
    get_backend(device_name, np.dtype(dtype))           # skips where the dtype is missing
    cls, settings = OPTIMIZERS[opt_name]
    in_shape, make = NETWORKS[net_name]
    if dtype == "float64":
        spec = make("linear")
    else:                                       # see the module's docstring
        spec = smooth(make("gelu"))
        settings = {**settings, "eps": EPS32} if "eps" in settings else settings

    net = pn.Sequential(portanet_layers(spec), in_shape, loss="softmax_cross_entropy",
                        device=device_name, dtype=dtype, seed=0)
    ref = TorchNet(spec, in_shape)
    drawn = net.get_weights()
    assert set(drawn) == set(ref.tensors), "portanet's and the test's names differ"
    start = randomized(drawn, rng)
    net.set_weights(start)
    start = net.get_weights()                   # as the network holds them (float32: cast)
    ref.load(start)

    x = rng.standard_normal((STEPS * BATCH, *in_shape)).astype(dtype)
    y = rng.integers(0, CLASSES, STEPS * BATCH)
    x_new = rng.standard_normal((40, *in_shape)).astype(dtype)
    y_new = rng.integers(0, CLASSES, 40)

    history = net.fit(x, y, epochs=1, batch_size=BATCH, shuffle=False,
                      optimizer=getattr(pn, cls)(**settings))
    torch_loss = ref.train_steps(ref.optimizer(cls, settings), x, y)

    ours, theirs = net.get_weights(), ref.weights()
    for name in theirs:
        if name not in ref.gradient_free:       # the test can fail: torch moved it enough
            moved = np.linalg.norm(theirs[name] - start[name]) / np.linalg.norm(theirs[name])
            assert moved > MOVED, f"{name} moved only {moved:.1e} in torch's {STEPS} steps"
        agree(ours[name], theirs[name], dtype, f"{net_name}/{opt_name} {dtype}: {name}")
    agree(history["loss"][0], torch_loss, dtype, "the epoch's mean training loss")

    probabilities, loss = ref.infer(x_new, y_new)
    agree(net.predict(x_new), probabilities, dtype, "predictions (eval mode)")
    agree(net.evaluate(x_new, y_new)[0], loss, dtype, "evaluate's loss (eval mode)")
