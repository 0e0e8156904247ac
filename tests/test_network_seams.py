"""Where a network's features meet: a freed network, weights from every way in, validation
data for every loss, and inputs that are not arrays yet."""
import inspect

import numpy as np
import pytest

import portanet as pn
from portanet import checkpoint, saving
from portanet.network import Sequential


def bn_net(loss="softmax_cross_entropy", out="softmax", outputs=3, seed=0):
    return Sequential([pn.Dense(6, "relu"), pn.BatchNorm(), pn.Dense(outputs, out)], 4,
                      loss=loss, device="cpu", seed=seed)


def data(n=12, outputs=3, loss="softmax_cross_entropy", seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 4)).astype(np.float32)
    if loss == "softmax_cross_entropy":
        y = rng.integers(0, outputs, n)
    elif loss == "binary_cross_entropy":
        y = (rng.random((n, outputs)) > 0.5).astype(np.float32)
    else:
        y = rng.standard_normal((n, outputs)).astype(np.float32)
    return x, y


# -- a freed network -------------------------------------------------------------------------

def generating(net):
    """generate on a network that is no language model: refused for that, or for free()."""
    with pytest.raises(pn.InputError, match="takes a language model"):
        net.generate([0], 1)


def calls(tmp_path, weights, torch_state):
    """{what: call on a network} for every public method and property of Sequential."""
    x, y = data()
    saved = tmp_path / "saved.safetensors"
    return {
        "fit": lambda net: net.fit(x, y, epochs=1, batch_size=4),
        "train_batch": lambda net: net.train_batch(x, y),
        "predict": lambda net: net.predict(x),
        "predict_classes": lambda net: net.predict_classes(x),
        "evaluate": lambda net: net.evaluate(x, y),
        "save": lambda net: net.save(tmp_path / "after.safetensors"),
        "to_onnx": lambda net: net.to_onnx(tmp_path / "after.onnx"),
        "load_weights": lambda net: net.load_weights(saved),
        "summary": lambda net: net.summary(),
        "memory_plan": lambda net: net.memory_plan(4),
        "get_weights": lambda net: net.get_weights(),
        "set_weights": lambda net: net.set_weights(weights),
        "architecture": lambda net: net.architecture(),
        "walk": lambda net: net.walk(),
        "loss_scale": lambda net: net.loss_scale,
        "optimizer_state": lambda net: net.optimizer_state,
        "n_in": lambda net: net.n_in,
        "n_out": lambda net: net.n_out,
        "tokens": lambda net: net.tokens,
        "sequence_output": lambda net: net.sequence_output,
        "generate": generating,
        "load_torch_state": lambda net: pn.load_torch_state(net, torch_state),
    }


def test_a_freed_network_refuses_every_public_method(tmp_path):
    net = bn_net()
    net.save(tmp_path / "saved.safetensors")
    weights = net.get_weights()
    torch_state = {"0.weight": weights["0.w"], "0.bias": weights["0.b"],
                   "1.weight": weights["1.gamma"], "1.bias": weights["1.beta"],
                   "1.running_mean": weights["1.running_mean"],
                   "1.running_var": weights["1.running_var"],
                   "2.weight": weights["2.w"], "2.bias": weights["2.b"]}
    table = calls(tmp_path, weights, torch_state)
    public = {name for name, _ in inspect.getmembers(Sequential)
              if not name.startswith("_")} - {"free"}
    assert public <= set(table), f"no freed-network test for {sorted(public - set(table))}"
    for what, call in table.items():
        call(net)                       # each works before free()
    net.free()
    net.free()                          # a second free() has nothing left to give back
    for what, call in table.items():
        with pytest.raises(pn.PortanetError, match=r"free\(\)"):
            call(net)


def test_free_inside_a_call_of_the_network_is_refused():
    """free() from a callback of fit (the same thread, inside the network's call) would
    pull the buffers from under the epochs still to run: refused, and fit goes on."""
    net = bn_net()
    x, y = data()
    seen = []

    class Frees(pn.callbacks.Callback):
        def on_epoch_end(self, net, epoch, logs):
            with pytest.raises(pn.PortanetError, match=r"free\(\)"):
                net.free()
            seen.append(epoch)

    net.fit(x, y, epochs=2, batch_size=4, callbacks=[Frees()])
    assert seen == [0, 1]
    assert np.all(np.isfinite(net.predict(x)))


def test_callbacks_may_use_the_network_inside_fit():
    """The network's lock is re-entrant: a callback predicts and evaluates inside fit."""
    net = bn_net()
    x, y = data()
    got = []

    class Uses(pn.callbacks.Callback):
        def on_epoch_end(self, net, epoch, logs):
            got.append((net.predict(x[:3]), net.evaluate(x, y)))

    net.fit(x, y, epochs=2, batch_size=4, callbacks=[Uses()])
    assert len(got) == 2 and np.array_equal(got[-1][0], net.predict(x[:3]))


# -- weights: one rule on every way in ---------------------------------------------------------

@pytest.mark.parametrize("name, value, match", [
    ("0.w", np.nan, r"0\.w.*NaN"),
    ("2.b", np.inf, r"2\.b.*inf"),
    ("0.b", 1e39, r"0\.b.*float32"),
    ("1.running_var", -1.0, r"1\.running_var.*negative"),
])
def test_set_weights_refuses_implausible_values_and_changes_nothing(name, value, match):
    net = bn_net()
    before = net.get_weights()
    bad = {k: v.astype(np.float64) + 0.5 for k, v in before.items()}    # all else changed
    bad[name].flat[1] = value
    with pytest.raises(pn.InputError, match=match):
        net.set_weights(bad)
    after = net.get_weights()
    assert all(np.array_equal(before[k], after[k]) for k in before)


def test_set_weights_takes_zero_variance():
    net = bn_net()
    weights = net.get_weights()
    weights["1.running_var"][:] = 0.0
    net.set_weights(weights)
    assert np.all(net.get_weights()["1.running_var"] == 0)


def test_load_torch_state_refuses_negative_running_variance():
    net = bn_net()
    w = net.get_weights()
    state = {"0.weight": w["0.w"], "0.bias": w["0.b"], "1.weight": w["1.gamma"],
             "1.bias": w["1.beta"], "1.running_mean": w["1.running_mean"],
             "1.running_var": -np.ones_like(w["1.running_var"]),
             "2.weight": w["2.w"], "2.bias": w["2.b"]}
    with pytest.raises(pn.InputError, match=r"load_torch_state: 1\.running_var.*negative"):
        pn.load_torch_state(net, state)
    assert np.array_equal(net.get_weights()["1.running_var"], w["1.running_var"])


def written(tmp_path, net, name, value):
    """A file as net.save writes it, with tensor `name`'s second value set to `value`."""
    tensors = net.get_weights()
    tensors[name].flat[1] = value
    path = tmp_path / "edited.safetensors"
    checkpoint.write(path, saving.architecture(net), tensors)
    return path


def test_files_with_negative_running_variance_are_refused(tmp_path):
    net = bn_net()
    path = written(tmp_path, net, "1.running_var", -2.0)
    with pytest.raises(pn.ModelFileError, match=r"1\.running_var.*negative"):
        pn.load(path, device="cpu")
    before = net.get_weights()
    with pytest.raises(pn.ModelFileError, match=r"1\.running_var"):
        net.load_weights(path)
    assert all(np.array_equal(before[k], v) for k, v in net.get_weights().items())


def test_files_with_values_beyond_the_dtype_are_refused(tmp_path):
    """A float64 file's 1e39 is finite there, inf in float32."""
    net = bn_net()
    tensors = {k: v.astype(np.float64) for k, v in net.get_weights().items()}
    tensors["2.w"].flat[0] = 1e39
    path = tmp_path / "wide.safetensors"
    checkpoint.write(path, saving.architecture(net), tensors)
    with pytest.raises(pn.ModelFileError, match=r"2\.w.*float32"):
        net.load_weights(path)


# -- validation data, every loss -------------------------------------------------------------

LOSSES = [("softmax_cross_entropy", "softmax", 3), ("binary_cross_entropy", "sigmoid", 1),
          ("binary_cross_entropy", "sigmoid", 2), ("mse", "linear", 1), ("mse", "linear", 2)]


@pytest.mark.parametrize("loss, out, outputs", LOSSES)
def test_validation_data_equals_evaluate_for_every_loss(loss, out, outputs):
    net = bn_net(loss, out, outputs)
    x, y = data(16, outputs, loss)
    x_val, y_val = data(10, outputs, loss, seed=1)
    history = net.fit(x, y, epochs=2, batch_size=4, validation_data=(x_val, y_val))
    assert (history["val_loss"][-1], history["val_accuracy"][-1]) == net.evaluate(x_val, y_val)


@pytest.mark.parametrize("loss, out, outputs", LOSSES)
def test_validation_split_equals_evaluate_for_every_loss(loss, out, outputs):
    net = bn_net(loss, out, outputs)
    x, y = data(20, outputs, loss)
    history = net.fit(x, y, epochs=2, batch_size=4, validation_split=0.25)
    assert (history["val_loss"][-1], history["val_accuracy"][-1]) == \
        net.evaluate(x[15:], y[15:])


# -- inputs that are not arrays yet ----------------------------------------------------------

def test_ragged_lists_are_an_input_error():
    net = Sequential([pn.Dense(1, "sigmoid")], 2, loss="binary_cross_entropy", device="cpu")
    with pytest.raises(pn.InputError, match=r"x .*ragged.*\(2,\).*\(1,\)"):
        net.predict([[1.0, 2.0], [3.0]])
    with pytest.raises(pn.InputError, match=r"x .*ragged"):
        net.fit([[1.0, 2.0], [3.0]], [1.0, 0.0])
    with pytest.raises(pn.InputError, match=r"y .*ragged.*\(1,\).*\(2,\)"):
        net.evaluate([[1.0, 2.0], [3.0, 4.0]], [[1.0], [0.0, 1.0]])
    # lists that are not ragged are taken as before
    assert net.predict([[1.0, 2.0], [3.0, 4.0]]).shape == (2, 1)
    assert len(net.evaluate([[1.0, 2.0], [3.0, 4.0]], [1.0, 0.0])) == 2
