"""Analytic gradients of every layer, activation and loss against central finite
differences, in float64 on the CPU reference. One SGD step with lr = 1 and momentum 0
moves every parameter by -dL/dparameter (the layer protocol fuses the update into
backward)."""
import numpy as np
import pytest

import portanet as pn
from conftest import F64_GRAD, rel_err

CASES = [  # hidden activations, output activation, loss, outputs
    (["relu", "tanh"], "softmax", "softmax_cross_entropy", 5),
    (["sigmoid"], "sigmoid", "binary_cross_entropy", 3),
    (["tanh", "linear"], "linear", "mse", 4),
    (["relu"], "sigmoid", "mse", 1),
    (["linear"], "tanh", "mse", 2),
    (["sigmoid"], "relu", "mse", 3),
]


def make_case(hidden, out_act, loss, n_out, rng, weight_decay=0.0):
    n_in, m = 6, 11
    layers = [pn.Dense(7 + i, act) for i, act in enumerate(hidden)] + [pn.Dense(n_out, out_act)]
    net = pn.Sequential(layers, n_in, loss, device="cpu", dtype="float64", seed=3)
    for layer in net.layers:                      # nonzero biases, so their gradients matter
        layer.b[...] = rng.standard_normal(layer.b.shape) * 0.3
    x = rng.standard_normal((m, n_in))
    if loss == "softmax_cross_entropy":
        y = rng.integers(0, n_out, m)
    elif loss == "binary_cross_entropy":
        y = (rng.random((m, n_out)) > 0.5).astype(float)
    else:
        y = rng.standard_normal((m, n_out))
    return net, x, y


def objective(net, x, y, weight_decay):
    loss, _ = net.evaluate(x, y)
    return loss + 0.5 * weight_decay * sum(np.sum(l.w ** 2) for l in net.layers if l.trainable)


def numeric_grad(net, x, y, param, weight_decay, eps=1e-6):
    g = np.zeros_like(param)
    for i in np.ndindex(param.shape):
        old = param[i]
        param[i] = old + eps
        up = objective(net, x, y, weight_decay)
        param[i] = old - eps
        down = objective(net, x, y, weight_decay)
        param[i] = old
        g[i] = (up - down) / (2 * eps)
    return g


@pytest.mark.parametrize("hidden,out_act,loss,n_out", CASES)
@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_dense_gradients(rng, hidden, out_act, loss, n_out, weight_decay):
    net, x, y = make_case(hidden, out_act, loss, n_out, rng)
    numeric = [(numeric_grad(net, x, y, l.w, weight_decay), numeric_grad(net, x, y, l.b, 0))
               for l in net.layers]
    before = [(l.w.copy(), l.b.copy()) for l in net.layers]
    net.train_batch(x, y, pn.SGD(lr=1.0, momentum=0.0, weight_decay=weight_decay))
    for layer, (gw, gb), (w0, b0) in zip(net.layers, numeric, before):
        assert rel_err(w0 - layer.w, gw) < F64_GRAD, f"{layer} dL/dw"
        assert rel_err(b0 - layer.b, gb) < F64_GRAD, f"{layer} dL/db"


def test_momentum_accumulates(rng):
    """Second step: v <- mu v - eta dL/dw, evaluated at the weights after the first; the
    weights move by v."""
    net, x, y = make_case(["tanh"], "softmax", "softmax_cross_entropy", 4, rng)
    opt = pn.SGD(lr=0.1, momentum=0.8)
    w0 = [l.w.copy() for l in net.layers]
    net.train_batch(x, y, opt)
    v1 = [l.w - w for l, w in zip(net.layers, w0)]
    w1 = [l.w.copy() for l in net.layers]
    grads = [numeric_grad(net, x, y, l.w, 0.0) for l in net.layers]
    net.train_batch(x, y, opt)
    for layer, v, w, g in zip(net.layers, v1, w1, grads):
        assert rel_err(layer.w - w, 0.8 * v - 0.1 * g) < F64_GRAD


def test_flatten_is_a_view(rng):
    """Flatten before Dense: same gradients as Dense on the flat input, no copy."""
    x = rng.standard_normal((4, 2, 3, 3))
    y = rng.integers(0, 3, 4)
    net = pn.Sequential([pn.Flatten(), pn.Dense(3, "softmax")], (2, 3, 3), device="cpu",
                        dtype="float64")
    g = numeric_grad(net, x, y, net.layers[1].w, 0.0)
    w0 = net.layers[1].w.copy()
    net.train_batch(x, y, pn.SGD(lr=1.0))
    assert rel_err(w0 - net.layers[1].w, g) < F64_GRAD
    assert np.shares_memory(net.layers[0].a, net.plan.x)
