"""Gradients of BatchNorm (training mode), LayerNorm, Embedding, MultiHeadAttention, the
pools, Residual blocks (identity and projection shortcuts, first in the network or not)
and the new activations, against central differences in float64 on the CPU reference.
One SGD step with lr = 1 and no momentum moves every parameter by -dL/dparameter."""
import numpy as np
import pytest

import portanet as pn
from portanet import inputs, saving
from conftest import F64_GRAD, rel_err

IMAGE = (2, 6, 5)

CASES = {
    "dense-batchnorm": ([pn.Dense(5, "tanh"), pn.BatchNorm("silu"), pn.Dense(3, "softmax")],
                        (4,)),
    "conv-batchnorm-avgpool": ([pn.Conv2D(3, 3, padding=1), pn.BatchNorm("tanh"),
                                pn.AvgPool2D(2, stride=1), pn.Flatten(),
                                pn.Dense(3, "softmax")], IMAGE),
    "avgpool-overlapping": ([pn.Conv2D(2, 2, activation="elu"), pn.AvgPool2D(3, stride=2),
                             pn.Flatten(), pn.Dense(3, "softmax")], (1, 8, 7)),
    "global-avgpool": ([pn.Conv2D(4, 3, activation="gelu"), pn.GlobalAvgPool2D(),
                        pn.Dense(3, "softmax")], IMAGE),
    "residual-identity": ([pn.Conv2D(3, 3, padding=1, activation="tanh"),
                           pn.Residual([pn.Conv2D(3, 3, padding=1), pn.BatchNorm("silu"),
                                        pn.Conv2D(3, 3, padding=1)], activation="elu"),
                           pn.Flatten(), pn.Dense(3, "softmax")], IMAGE),
    "residual-projection": ([pn.Conv2D(3, 3, padding=1, activation="tanh"),
                             pn.Residual([pn.Conv2D(4, 3, stride=2, padding=1,
                                                    activation="gelu"), pn.BatchNorm()],
                                         activation="silu"),
                             pn.GlobalAvgPool2D(), pn.Dense(3, "softmax")], IMAGE),
    "residual-first": ([pn.Residual([pn.Conv2D(2, 3, padding=1, activation="tanh")],
                                    activation="leaky_relu"),
                        pn.Residual([pn.Conv2D(3, 1, activation="elu"), pn.BatchNorm()]),
                        pn.Flatten(), pn.Dense(3, "softmax")], IMAGE),
    "residual-dense": ([pn.Dense(5, "tanh"),
                        pn.Residual([pn.Dense(5, "leaky_relu"), pn.Dense(6)], "tanh"),
                        pn.Dense(4, "gelu"), pn.Dense(3, "softmax")], (4,)),
    # a block's sum made over a BatchNorm that activates: the block reads the sum's
    # gradient after the BatchNorm's backward; and a linear block (one buffer for its sum
    # and output) ending in another block
    "residual-batchnorm-last": ([pn.Dense(5, "tanh"),
                                 pn.Residual([pn.Dense(5), pn.BatchNorm("relu")]),
                                 pn.Dense(3, "softmax")], (4,)),
    "residual-nested": ([pn.Dense(5, "tanh"),
                         pn.Residual([pn.Dense(5, "tanh"),
                                      pn.Residual([pn.Dense(5), pn.BatchNorm("tanh")])]),
                         pn.Dense(3, "softmax")], (4,)),
    # a BatchNorm's output, z and a one buffer, read by the loss that writes its delta there
    "batchnorm-sigmoid-out": ([pn.Dense(4, "tanh"), pn.Dense(2), pn.BatchNorm("sigmoid")],
                              (3,)),
    # LayerNorm over a sample's features, over a position's channels, first in the
    # network (no dL/dx), and as a block's last layer (its sum made over our output)
    "dense-layernorm": ([pn.Dense(5, "tanh"), pn.LayerNorm(eps=0.1), pn.Dense(3, "softmax")],
                        (4,)),
    "conv-layernorm": ([pn.Conv2D(3, 3, padding=1, activation="elu"), pn.LayerNorm(),
                        pn.Flatten(), pn.Dense(3, "softmax")], IMAGE),
    "layernorm-first": ([pn.LayerNorm(), pn.Dense(4, "gelu"), pn.Dense(3, "softmax")], (4,)),
    "residual-layernorm": ([pn.Dense(5, "tanh"),
                            pn.Residual([pn.Dense(5, "silu"), pn.LayerNorm()], "tanh"),
                            pn.Dense(3, "softmax")], (4,)),
    # sequences, (features, T) a sample: Dense a token at a time, LayerNorm per token,
    # BatchNorm per feature over the tokens too, blocks with and without a projection
    "sequence": ([pn.Dense(5, "tanh"), pn.LayerNorm(),
                  pn.Residual([pn.Dense(5, "gelu"), pn.Dense(5)], "tanh"),
                  pn.Residual([pn.Dense(4, "silu")]), pn.BatchNorm("elu"), pn.Flatten(),
                  pn.Dense(3, "softmax")], (3, 4)),
    # token ids through an Embedding with positions (ids repeat: its gradient sums them)
    "embedding": ([pn.Embedding(5, 4, positions=True), pn.LayerNorm(), pn.Dense(5, "tanh"),
                   pn.Residual([pn.Dense(5, "gelu"), pn.Dense(5)]), pn.Flatten(),
                   pn.Dense(3, "softmax")], (6,)),
    # a sequence output: a class per token, the loss the mean over every token
    "sequence-output": ([pn.Embedding(5, 4, positions=True), pn.LayerNorm(),
                         pn.Residual([pn.Dense(4, "gelu")]), pn.Dense(3, "softmax")], (6,)),
    # a GPT's blocks (pre-norm, causal attention, an MLP) to a class per token; and
    # attention over the whole sequence to one class a sample
    "transformer": ([pn.Embedding(5, 4, positions=True),
                     pn.Residual([pn.LayerNorm(), pn.MultiHeadAttention(2)]),
                     pn.Residual([pn.LayerNorm(), pn.Dense(6, "gelu"), pn.Dense(4)]),
                     pn.LayerNorm(), pn.Dense(3, "softmax")], (5,)),
    "attention-whole": ([pn.Embedding(5, 3), pn.MultiHeadAttention(1, causal=False),
                         pn.Flatten(), pn.Dense(3, "softmax")], (4,)),
    "activations": ([pn.Dense(6, "leaky_relu"), pn.Dense(5, "elu"), pn.Dense(5, "gelu"),
                     pn.Dense(4, "silu"), pn.Dense(2, "sigmoid")], (3,)),
}


def trained(net):
    """{name: array view} of the trained parameters (not the running statistics)."""
    return {name: x for name, x in saving._parameters(net).items()
            if not name.rsplit(".", 1)[1].startswith("running")}


def training_loss(net, x, y):
    plan = net.plan
    plan.upload(*inputs.check_data(net, x, y))
    plan.reset_sums()
    net._forward(training=True)
    net.loss(net.backend, net.layers[-1], plan.loss_sum, plan.hit_sum, plan.y)
    return plan.read_sums(len(x))[0]


@pytest.mark.parametrize("case", sorted(CASES))
def test_gradients(case, rng):
    layers, shape = CASES[case]
    sigmoid = layers[-1].activation == "sigmoid"
    net = pn.Sequential(layers, shape, "binary_cross_entropy" if sigmoid else
                        "softmax_cross_entropy", device="cpu", dtype="float64", seed=4)
    params = trained(net)
    for name, p in params.items():          # biases, scales and shifts away from 0 and 1
        if not name.endswith(".w"):
            p[...] += rng.standard_normal(p.shape) * 0.3
    m = 7
    first = layers[0]
    x = rng.integers(0, first.vocab, (m, *shape)) if first.takes_ids else \
        rng.standard_normal((m, *shape))
    y = (rng.random((m, 2)) > 0.5).astype(float) if sigmoid else \
        rng.integers(0, 3, (m, net.tokens) if net.tokens > 1 else m)
    eps = 1e-6
    numeric = {}
    for name, p in params.items():
        g = np.zeros_like(p)
        for i in np.ndindex(p.shape):
            old = p[i]
            p[i] = old + eps
            up = training_loss(net, x, y)
            p[i] = old - eps
            down = training_loss(net, x, y)
            p[i] = old
            g[i] = (up - down) / (2 * eps)
        numeric[name] = g
    before = {name: p.copy() for name, p in params.items()}
    net.train_batch(x, y, pn.SGD(lr=1.0))
    for name, p in params.items():
        analytic = before[name] - p
        if np.abs(numeric[name]).max() < 1e-9:  # a bias before BatchNorm: exactly no effect
            assert np.abs(analytic).max() < 1e-12, name
        else:
            assert rel_err(analytic, numeric[name]) < F64_GRAD, name


def test_batchnorm_running_statistics_and_inference(rng):
    """Training keeps PyTorch's running averages (unbiased variance); inference
    normalizes with them."""
    net = pn.Sequential([pn.Dense(3), pn.BatchNorm(momentum=0.25), pn.Dense(2, "softmax")],
                        (4,), device="cpu", dtype="float64")
    x, y = rng.standard_normal((9, 4)), rng.integers(0, 2, 9)
    dense, bn = net.layers[0], net.layers[1]
    w, b = dense.w.copy(), dense.b.copy()
    net.train_batch(x, y, pn.SGD(0.1))
    h = x @ w.T + b
    assert np.allclose(bn.running_mean, 0.25 * h.mean(axis=0))
    assert np.allclose(bn.running_var, 0.75 + 0.25 * h.var(axis=0, ddof=1))
    hidden = x @ dense.w.T + dense.b
    normal = (hidden - bn.running_mean) / np.sqrt(bn.running_var + bn.eps) * bn.gamma + bn.beta
    logits = normal @ net.layers[2].w.T + net.layers[2].b
    want = np.exp(logits - logits.max(axis=1, keepdims=True))
    assert np.allclose(net.predict(x), want / want.sum(axis=1, keepdims=True))


def test_residual_shapes_and_errors():
    with pytest.raises(pn.ShapeError, match="no 1x1 convolution"):
        pn.Sequential([pn.Residual([pn.Conv2D(2, 3)]), pn.Flatten(), pn.Dense(2, "softmax")],
                      (1, 6, 6))                  # 6x6 -> 4x4: no stride gives it
    with pytest.raises(pn.InputError, match="only Flatten"):
        pn.Residual([pn.Flatten()])
    with pytest.raises(pn.InputError, match="activation must be one of"):
        pn.Residual([pn.Dense(2)], activation="softmax")
    with pytest.raises(pn.InputError, match="non-empty list of layers"):
        pn.Residual([])
    net = pn.Sequential([pn.Residual([pn.Conv2D(4, 3, stride=2, padding=1)]),
                         pn.GlobalAvgPool2D(), pn.Dense(2, "softmax")], (3, 9, 9), device="cpu")
    proj = net.layers[0].projection
    assert (proj.units, proj.k, proj.stride) == (4, 1, 2)
    assert sorted(net.get_weights()) == ["0.0.b", "0.0.w", "0.proj.b", "0.proj.w", "2.b", "2.w"]


def test_every_layer_on_every_device_as_on_the_reference(device_name, rng):
    """Steps of a network with every new layer, on each device, against the reference.
    (No linear convolution feeds a BatchNorm: its bias would have no gradient but rounding
    noise, which Adam turns into steps of lr in any direction.)"""
    layers = lambda: [pn.Conv2D(4, 3, padding=1, activation="tanh"),            # noqa: E731
                      pn.BatchNorm("relu"),
                      pn.Residual([pn.Conv2D(4, 3, padding=1, activation="gelu"),
                                   pn.BatchNorm("silu"),
                                   pn.Conv2D(4, 3, padding=1, activation="elu"),
                                   pn.BatchNorm()], "elu"),
                      pn.Residual([pn.Conv2D(6, 3, stride=2, padding=1, activation="tanh"),
                                   pn.BatchNorm("leaky_relu")], "relu"),
                      pn.AvgPool2D(2, stride=1), pn.GlobalAvgPool2D(), pn.Dense(3, "softmax")]
    x = rng.standard_normal((11, 2, 7, 9)).astype(np.float32)
    y = rng.integers(0, 3, 11)
    ref = pn.Sequential(layers(), (2, 7, 9), device="cpu", seed=1)
    net = pn.Sequential(layers(), (2, 7, 9), device=device_name, seed=1)
    for n in (ref, net):
        n.fit(x, y, epochs=2, batch_size=4, optimizer=pn.Adam(0.01), shuffle=False)
    want, got = ref.get_weights(), net.get_weights()
    for name in want:
        assert rel_err(got[name], want[name]) < 1e-4, name
    assert rel_err(net.predict(x), ref.predict(x)) < 1e-4
