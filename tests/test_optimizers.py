"""Optimizers: each step of each one on every device against torch.optim's formulas
written out in NumPy (tests/test_torch_parity.py compares with torch itself where it is
installed), weight decay on the weights only, state kept across fits of the same kind,
no allocation after the first step, and their argument checks."""
import math

import numpy as np
import pytest

import portanet as pn
from conftest import rel_err

OPTIMIZERS = [pn.SGD(0.1), pn.SGD(0.05, momentum=0.9, weight_decay=0.01),
              pn.SGD(0.05, momentum=0.8, weight_decay=0.01, nesterov=True),
              pn.Adam(0.01, weight_decay=0.01), pn.AdamW(0.01, betas=(0.8, 0.99)),
              pn.RMSprop(0.01, weight_decay=0.01),
              pn.RMSprop(0.005, momentum=0.5, centered=True)]


def network(device, dtype="float32"):
    return pn.Sequential([pn.Conv2D(3, 3, activation="tanh"), pn.BatchNorm("relu"),
                          pn.Flatten(), pn.Dense(3, "softmax")], (2, 5, 5), device=device,
                         dtype=dtype, seed=7)


def gradient(weights, x, y):
    """dL/dparameter at `weights`, by one SGD step with lr 1 on the float64 reference."""
    net = network("cpu", "float64")
    net.set_weights(weights)
    net.train_batch(x, y, pn.SGD(1.0))
    after = net.get_weights()
    return {k: weights[k] - after[k] for k in weights}


class Reference:
    """torch.optim's update rules on host arrays, weight decay on the weights only."""

    def __init__(self, opt):
        self.opt, self.t, self.state = opt, 0, {}

    def step(self, w, g, decays):
        o, self.t = self.opt, self.t + 1
        out = {}
        for name in w:
            wd = getattr(o, "weight_decay", 0.0) if decays(name) else 0.0
            st = self.state.setdefault(name, {})
            p, d = w[name].astype(np.float64), g[name].astype(np.float64)
            if isinstance(o, pn.SGD):
                d = d + wd * p
                if not o.momentum:
                    out[name] = p - o.lr * d
                    continue
                buf = st["buf"] = o.momentum * st.get("buf", 0) + d
                out[name] = p - o.lr * (d + o.momentum * buf if o.nesterov else buf)
            elif isinstance(o, pn.Adam):
                b1, b2 = o.betas
                if isinstance(o, pn.AdamW):
                    p = p * (1 - o.lr * wd)
                else:
                    d = d + wd * p
                m = st["m"] = b1 * st.get("m", 0) + (1 - b1) * d
                v = st["v"] = b2 * st.get("v", 0) + (1 - b2) * d * d
                den = np.sqrt(v) / math.sqrt(1 - b2 ** self.t) + o.eps
                out[name] = p - o.lr / (1 - b1 ** self.t) * m / den
            else:
                d = d + wd * p
                v = st["v"] = o.alpha * st.get("v", 0) + (1 - o.alpha) * d * d
                if o.centered:
                    ga = st["ga"] = o.alpha * st.get("ga", 0) + (1 - o.alpha) * d
                    den = np.sqrt(v - ga * ga) + o.eps
                else:
                    den = np.sqrt(v) + o.eps
                if o.momentum:
                    buf = st["buf"] = o.momentum * st.get("buf", 0) + d / den
                    out[name] = p - o.lr * buf
                else:
                    out[name] = p - o.lr * d / den
        return out


@pytest.mark.parametrize("opt", OPTIMIZERS, ids=repr)
def test_steps_follow_the_formulas(device_name, opt, rng):
    net = network(device_name)
    ref = Reference(opt)
    decays = lambda name: name.endswith(".w")          # noqa: E731
    for step in range(4):
        x = rng.standard_normal((6, 2, 5, 5)).astype(np.float32)
        y = rng.integers(0, 3, 6)
        w = {k: v for k, v in net.get_weights().items() if "running" not in k}
        g = gradient(net.get_weights(), x, y)
        g = {k: g[k] for k in w}
        want = ref.step(w, g, decays)
        net.train_batch(x, y, opt)
        got = net.get_weights()
        for name in want:
            moved = want[name] - w[name]
            assert rel_err(got[name] - w[name], moved) < 2e-3, (step, name)


@pytest.mark.parametrize("opt", OPTIMIZERS, ids=repr)
def test_no_allocation_after_the_first_step(device_name, opt):
    net = network(device_name)
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((40, 2, 5, 5)).astype(np.float32), rng.integers(0, 3, 40)
    net.fit(x, y, epochs=1, batch_size=16, optimizer=opt)
    count = net.backend.allocations
    net.fit(x, y, epochs=2, batch_size=16, optimizer=opt, schedule="cosine(2)",
            validation_split=0.2, data_on_device=False)    # (the set up costs 2: test_graphs)
    assert net.backend.allocations == count


def test_state_is_kept_across_fits_and_replaced_for_another_kind():
    net = network("cpu")
    x = np.random.default_rng(0).standard_normal((8, 2, 5, 5)).astype(np.float32)
    y = np.arange(8) % 3
    net.fit(x, y, optimizer=pn.Adam(), batch_size=4)
    state = net.optimizer_state
    assert state.t == 2 and sorted(net.layers[0].state) == ["m", "v"]
    net.fit(x, y, optimizer=pn.Adam(0.01), batch_size=4)      # same kind: carries on
    assert net.optimizer_state is state and state.t == 4
    net.fit(x, y, optimizer=pn.SGD(0.1, 0.9), batch_size=4)
    assert net.optimizer_state.t == 2 and sorted(net.layers[0].state) == ["v"]
    plan = net.memory_plan(4, pn.RMSprop(momentum=0.9, centered=True)).by_kind()
    params = plan["parameters"] - 2 * 3 * 4            # less the running statistics
    assert plan["optimizer state"] == 3 * params + 4     # and the updates' skip flag
    assert "16 bytes per parameter" in net.summary(pn.RMSprop(momentum=0.9, centered=True))


def test_bytes_per_parameter():
    assert [o.bytes_per_parameter(4) for o in (pn.SGD(), pn.SGD(momentum=0.9), pn.Adam(),
                                               pn.AdamW(), pn.RMSprop())] == [4, 8, 12, 12, 8]
    assert not pn.SGD(momentum=0.9).uses_workspace and pn.Adam().uses_workspace


@pytest.mark.parametrize("make,match", [
    (lambda: pn.SGD(0), r"lr must be a finite number in \(0"),
    (lambda: pn.SGD(0.1, momentum=1), r"momentum must be .* \[0, 1\)"),
    (lambda: pn.SGD(0.1, nesterov=True), "nesterov=True needs a momentum"),
    (lambda: pn.SGD(0.1, 0.9, nesterov=1), "nesterov must be True or False"),
    (lambda: pn.Adam(betas=(0.9,)), "betas must be two numbers"),
    (lambda: pn.Adam(betas=(0.9, 1.0)), r"betas must be .* \[0, 1\)"),
    (lambda: pn.AdamW(eps=0), "eps must be"),
    (lambda: pn.RMSprop(alpha=float("nan")), "alpha must be a finite number"),
    (lambda: pn.RMSprop(weight_decay=-1), "weight_decay must be"),
])
def test_bad_arguments_say_what_is_wrong(make, match):
    with pytest.raises(pn.InputError, match=match):
        make()


def test_fit_refuses_what_is_not_an_optimizer():
    net = network("cpu")
    with pytest.raises(pn.InputError, match="optimizer must be an optimizer object"):
        net.fit(np.zeros((2, 2, 5, 5), np.float32), [0, 1], optimizer="adam")
