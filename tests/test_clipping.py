"""Global-norm gradient clipping (fit's clip_norm, every optimizer's clip_norm keyword): before
each update the gradients of the whole network, as one vector, are scaled by
min(1, clip_norm / (norm + 1e-6)), torch.nn.utils.clip_grad_norm_'s factor.

Plain SGD moves the parameters by -lr g, so one step's move says what gradient the update
read: clipped, it must be the unclipped move scaled to the bound; with a bound above the
norm, the unclipped move itself. The kernel is tested against the reference in
test_kernels.py; a GPT's clipped AdamW steps against torch in test_gpt_parity.py.
"""
import numpy as np
import pytest

import portanet as pn
from portanet.errors import InputError

from conftest import F32, rel_err

LR = 0.1


def mlp(device, dtype="float32"):
    return pn.Sequential([pn.Dense(24, "relu"), pn.BatchNorm("tanh"), pn.Dense(3, "softmax")],
                         12, device=device, dtype=dtype, seed=4)


def data(rng, n=64):
    x = rng.standard_normal((n, 12))
    return x, (x[:, :3] * [1, -1, 2]).argmax(1)


def flat(weights):
    """The trainable parameters as one vector (not BatchNorm's running statistics)."""
    return np.concatenate([w.ravel() for name, w in sorted(weights.items())
                           if "running" not in name]).astype(np.float64)


def moved(device, x, y, optimizer, dtype="float32", **fit):
    """The parameters' move in one step of the whole batch, and their norm."""
    net = mlp(device, dtype)
    start = flat(net.get_weights())
    net.fit(x, y, batch_size=len(x), optimizer=optimizer, shuffle=False, verbose=0, **fit)
    return flat(net.get_weights()) - start, np.linalg.norm(start)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_clipped_step_reads_the_gradient_scaled_to_the_bound(device_name, rng, dtype):
    x, y = data(rng)
    free, size = moved(device_name, x, y, pn.SGD(LR), dtype)
    norm = np.linalg.norm(free) / LR
    # a move is a difference of parameters, which round in their own type
    tol, rounding = (1e-12, 0.0) if dtype == "float64" else (F32, 2 * 2.0 ** -24 * size)
    for bound in (norm / 3, norm / 50, 2 * norm):
        clipped, _ = moved(device_name, x, y, pn.SGD(LR), dtype, clip_norm=bound)
        want = free * min(1, bound / (norm + 1e-6))
        assert np.linalg.norm(clipped - want) < tol * np.linalg.norm(want) + rounding, \
            (bound, norm)
        keyword, _ = moved(device_name, x, y, pn.SGD(LR, clip_norm=bound), dtype)
        assert np.array_equal(keyword, clipped)


@pytest.mark.parametrize("optimizer", [pn.SGD(LR, 0.9), pn.SGD(LR, 0.9, nesterov=True),
                                       pn.Adam(0.01), pn.RMSprop(0.01)])
def test_a_bound_above_every_norm_trains_as_no_bound(device_name, rng, optimizer):
    """Three epochs of four steps: the clipped run's gradients gather in the workspace
    (SGD's velocity no longer gemm's beta), the results as unclipped within rounding; a
    bound below the norms gives another run."""
    x, y = data(rng)
    runs = {}
    for bound in (None, 1e9, 1e-3):
        net = mlp(device_name)
        net.fit(x, y, epochs=3, batch_size=16, optimizer=optimizer, clip_norm=bound,
                verbose=0)
        runs[bound] = flat(net.get_weights())
    assert rel_err(runs[1e9], runs[None]) < 10 * F32
    assert rel_err(runs[1e-3], runs[None]) > 1e-3


def test_a_clipped_run_resumes_where_it_stopped(tmp_path, rng):
    x, y = data(rng, 48)
    opt = pn.Adam(0.01)
    whole = mlp("cpu")
    whole.fit(x, y, epochs=2, batch_size=16, optimizer=opt, clip_norm=0.05, verbose=0)
    half = mlp("cpu")
    half.fit(x, y, epochs=1, batch_size=16, optimizer=opt, clip_norm=0.05, verbose=0,
             checkpoint=tmp_path / "run.ckpt")
    again = mlp("cpu")
    again.fit(x, y, epochs=2, batch_size=16, optimizer=opt, clip_norm=0.05, verbose=0,
              resume=tmp_path / "run.ckpt")
    assert np.array_equal(flat(again.get_weights()), flat(whole.get_weights()))
    other = mlp("cpu")
    with pytest.raises(Exception, match="clip_norm"):
        other.fit(x, y, epochs=2, batch_size=16, optimizer=opt, clip_norm=0.1, verbose=0,
                  resume=tmp_path / "run.ckpt")


@pytest.mark.parametrize("bound", [0, -1.0, float("inf"), float("nan"), "1", True])
def test_a_bound_that_is_not_a_positive_number_is_refused(bound):
    with pytest.raises(InputError, match="clip_norm must be a finite number"):
        pn.AdamW(clip_norm=bound)
    x, y = data(np.random.default_rng(0), 8)
    with pytest.raises(InputError, match="clip_norm must be a finite number"):
        mlp("cpu").fit(x, y, clip_norm=bound, verbose=0)


def test_two_bounds_are_refused():
    x, y = data(np.random.default_rng(0), 8)
    with pytest.raises(InputError, match="give it once"):
        mlp("cpu").fit(x, y, optimizer=pn.SGD(clip_norm=1.0), clip_norm=2.0, verbose=0)
    mlp("cpu").fit(x, y, optimizer=pn.SGD(clip_norm=1.0), clip_norm=1.0, verbose=0)


def test_the_optimizer_shows_its_bound():
    assert repr(pn.AdamW(clip_norm=1.0)).endswith("weight_decay=0.01, clip_norm=1.0)")
    assert "clip_norm" not in repr(pn.SGD(0.1))
