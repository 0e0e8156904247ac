"""Memory is planned before it is allocated: the plan lists what the network allocates,
a network or batch that will not fit is refused with the numbers before any allocation,
and a failed call leaves the network as it was."""
import gc
import numpy as np
import pytest

import portanet as pn
from conftest import rel_err
from portanet.memory import elements


def small_cnn(device):
    return pn.from_description("conv(4, 3, relu) maxpool(2) flatten dense(3, softmax)",
                               (2, 9, 9), device=device)


def data(n=40, shape=(2, 9, 9), classes=3, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, *shape)).astype(np.float32), rng.integers(0, classes, n)


def test_plan_is_what_the_network_allocates(device_name):
    net = small_cnn(device_name)
    plan = net.memory_plan(16)
    kinds = plan.by_kind()
    assert set(kinds) == {"parameters", "optimizer state", "batch", "workspace"}
    # SGD with momentum: v, and the updates' skip flag (an int32; see OptimizerState)
    assert kinds["parameters"] == kinds["optimizer state"] - 4 == 4 * (4 * 2 * 9 + 4 + 3 * 36 + 3)
    x, y = data(16)
    net.train_batch(x, y)
    # the arrays the network made for the batch are the plan's, byte for byte (the backend's
    # own counter also moves with its GEMM workspace and with arrays others drop meanwhile)
    made = {(b.owner, b.name): x.nbytes for _, b, x in net.plan.batch}
    planned = {(b.owner, b.name): b.nbytes for b in plan.buffers
               if b.kind in ("batch", "workspace")}
    assert made == planned and sum(made.values()) == kinds["batch"] + kinds["workspace"]
    # and the buffers the plan names are the ones the layers hold
    conv = net.layers[0]
    names = {(b.owner, b.name): b.nbytes for b in plan.buffers}
    assert names[(repr(conv), "flat")] == (conv.w.size + conv.b.size) * 4     # w, b in one
    assert names[("network", "_workspace")] == 2 * 9 * 49 * 16 * 4     # C.k.k x Ho.Wo.N
    assert "batch 16" in str(plan) and "total" in str(plan)


def test_the_plan_has_room_for_the_transposed_copies_routing_may_make(device_name,
                                                                       monkeypatch):
    """Where routing may run a float32 product on a transposed copy of a (a kernel backend
    with a vendor GEMM, products of TRANSPOSED_FLOPS or more: here dense 1's three), the
    plan has room for the largest such a, w, and the copies training makes fit in it;
    elsewhere there is nothing to plan."""
    from portanet.backends.gemm import router as gemm_router
    monkeypatch.setattr(gemm_router, "TRANSPOSED_FLOPS", 2 * 200 * 96 * 300)
    bk = pn.device(device_name)
    net = pn.mlp((300,), 10, hidden=(200,), device=bk)
    plan = {(b.owner, b.name): b for b in net.memory_plan(96).buffers}
    copies = plan.get(("backend", "transposed operands"))
    if not (bk.kind != "cpu" and bk.vendor_gemm and bk.gemm_path == "auto"
            and bk.half_operands is None):
        assert copies is None
        return
    assert copies.nbytes == 200 * 300 * 4 and copies.kind == "workspace"
    monkeypatch.setattr(bk, "_transposed_ws", None, raising=False)     # grown anew
    x, y = data(96, (300,), 10)
    with bk.pinned():                                                   # routed anew
        net.fit(x, y, epochs=1, batch_size=96)
    (needed, held, dtype), = bk.operand_bytes(
        [p for _, layer in net.walk() for p in layer.products(96)]).values()
    assert needed == copies.nbytes and held == needed and dtype == np.float32


def test_a_network_too_big_is_refused_before_anything_is_allocated(device_name):
    bk = pn.device(device_name)
    count = bk.allocations
    with pytest.raises(pn.OutOfMemoryError, match=r"needs 7\.3 TiB|needs .* (T|G)iB") as e:
        pn.Sequential([pn.Dense(10**6, "relu"), pn.Dense(2, "softmax")], 10**6,
                      device=device_name)
    assert "Dense(units=1000000" in str(e.value) and "available" in str(e.value)
    assert bk.allocations == count


def test_a_batch_too_big_is_refused_with_the_largest_that_fits(device_name, monkeypatch):
    net = small_cnn(device_name)
    x, y = data(8)
    net.fit(x, y, epochs=1, batch_size=8)
    # the room held still: the host's free memory moves while other programs run
    room = net.backend.memory_info()
    monkeypatch.setattr(net.backend, "memory_info", lambda: room)
    free, _ = room
    per_sample = net.memory_plan(2).total - net.memory_plan(1).total
    huge = int(free // per_sample) * 4 + 4
    before = (net.backend.allocations, net.plan.capacity)
    with pytest.raises(pn.OutOfMemoryError, match=r"largest batch that fits is (\d+)") as e:
        net.plan.bind(huge)
    largest = int(e.value.args[0].split("largest batch that fits is ")[1].split(":")[0])
    assert e.value.largest_batch == largest
    assert net.memory_plan(largest).fits and not net.memory_plan(largest + 1).fits
    from portanet.cli import cli_text         # the command line names its option
    assert cli_text(e.value).endswith(f"give --batch-size {largest} or less")
    assert (net.backend.allocations, net.plan.capacity) == before         # nothing was touched
    h = net.fit(x, y, epochs=1, batch_size=8)                          # and it still trains
    assert np.isfinite(h["loss"][0])


def test_a_failed_allocation_leaves_the_network_usable(device_name, monkeypatch):
    """The plan can be wrong (other programs use the device too): an allocation that fails
    half way through gives back what it made and restores the buffers that were there."""
    net = small_cnn(device_name)
    x, y = data(40)
    net.fit(x, y, epochs=1, batch_size=8)
    p = net.predict(x, batch_size=8)
    bk = net.backend
    gc.collect()        # other tests' networks that an exception's traceback kept: gone now
    live = bk.allocated_bytes
    real_empty = type(bk).empty
    calls = []

    def failing(self, shape, dtype=None, label="buffer"):
        calls.append(label)
        if len(calls) == 5:
            raise pn.OutOfMemoryError(f"cannot allocate {label} (simulated)")
        return real_empty(self, shape, dtype, label)

    monkeypatch.setattr(type(bk), "empty", failing)
    with pytest.raises(pn.OutOfMemoryError, match="simulated"):
        net.fit(x, y, epochs=1, batch_size=32)
    monkeypatch.undo()
    assert bk.allocated_bytes == live
    assert net.plan.capacity == 8
    assert np.array_equal(net.predict(x, batch_size=8), p)
    net.fit(x, y, epochs=1, batch_size=16)                 # grows normally afterwards


def test_default_inference_batch_follows_the_plan(monkeypatch):
    """predict without a batch size takes the largest chunks the device can hold."""
    net = pn.mlp((50,), classes=4, hidden=(30,), device="cpu")
    x = np.random.default_rng(1).standard_normal((3000, 50)).astype(np.float32)
    full = net.predict(x)
    fresh = pn.mlp((50,), classes=4, hidden=(30,), device="cpu")
    room = fresh.memory_plan(700).total - fresh.memory_plan(0).total    # 700 samples' buffers
    monkeypatch.setattr(type(fresh.backend), "memory_info", lambda self: (room, 10 * room))
    assert np.allclose(fresh.predict(x), full, rtol=1e-6, atol=1e-7)
    assert fresh.plan.capacity == 700


@pytest.mark.parametrize("cap", [10**5, 3 * 10**6, 320 * 2**20])
def test_the_default_inference_batch_is_the_largest_under_the_cap(monkeypatch, cap):
    """The batch that Plan.inference_batch works out from the buffers' bytes per sample is the
    one a search over plans finds: the largest whose batch buffers stay within the cap."""
    from portanet import memory, plan
    monkeypatch.setattr(plan, "INFERENCE_BYTES", cap)
    for net in (pn.lenet(device="cpu"), pn.resnet(device="cpu"),
                pn.Sequential([pn.Dense(9, "relu"), pn.BatchNorm("relu"), pn.Dropout(0.2),
                               pn.Dense(3, "softmax")], 5, device="cpu")):
        def fits(m):
            planned = net.plan.memory(m)
            return planned.fits and planned.by_kind().get("batch", 0) <= cap
        assert net.plan.inference_batch(None, 5000) == max(memory.largest_batch(fits, 5000), 1)


def test_batches_go_up_in_parts_and_predictions_come_back_in_slots(device_name, monkeypatch):
    """The staging buffer's cap cuts a batch into parts of whole samples, and predict's
    pinned slots fill and are read several times a call: the same outputs as the host's
    own layout and one slot per call, through evaluate, predict and fit; the staging
    buffer is in the plan, within its cap."""
    from portanet import network, plan
    x, y = data(45)
    net = small_cnn(device_name)
    p, score = net.predict(x, batch_size=45), net.evaluate(x, y, batch_size=45)
    monkeypatch.setattr(plan, "STAGING_BYTES", 2 * 648 * 3 + 4)     # halves of 3 samples
    monkeypatch.setattr(network, "PREDICTIONS_BYTES", 4 * 3 * 8 * 2)    # 2 batches of 8
    cut = small_cnn(device_name)
    staging = [b for b in cut.memory_plan(8).buffers if b.name == "_staging"]
    assert [b.nbytes for b in staging] == ([2 * 648 * 3] if cut.backend.stages_samples
                                           else [])
    assert np.allclose(cut.predict(x, batch_size=8), p, rtol=1e-5, atol=1e-6)
    assert np.allclose(cut.evaluate(x, y, batch_size=8), score, rtol=1e-5)
    h1 = net.fit(x, y, epochs=2, batch_size=8, seed=3)
    h2 = cut.fit(x, y, epochs=2, batch_size=8, seed=3)
    assert np.allclose(h1["loss"], h2["loss"], rtol=1e-5)
    assert np.allclose(cut.predict(x), net.predict(x), rtol=1e-5, atol=1e-6)


def test_nan_is_found_in_any_batch(device_name):
    """evaluate and predict check each batch as it goes up, naming the sample in x."""
    net = small_cnn(device_name)
    x, y = data(45)
    x[37, 1, 4, 4] = np.inf
    for call in (lambda: net.predict(x, batch_size=8), lambda: net.evaluate(x, y, 16)):
        with pytest.raises(pn.InputError, match="NaN or inf .first at sample 37"):
            call()
    big = x.astype(np.float64)
    big[37, 1, 4, 4], big[40, 0, 0, 0] = 0.0, 1e39     # finite, but not in float32
    with pytest.raises(pn.InputError, match="too large for float32.*sample 40"):
        net.predict(big, batch_size=8)
    big[40, 0, 0, 0] = 0.0
    assert net.predict(big, batch_size=8).shape == (45, 3)


@pytest.mark.parametrize("optimizer", [pn.SGD(0.01, 0.9), pn.Adam()], ids=["sgd", "adam"])
def test_dropped_networks_give_their_memory_back_at_once(device_name, optimizer):
    """A network holds no reference to itself (its buffer lists, its optimizer state):
    dropping it frees its memory at once, without waiting for the cycle collector."""
    import gc
    bk = pn.device(device_name)
    gc.collect()
    live = bk.allocated_bytes
    x, y = data(16)
    gc.disable()
    try:
        for _ in range(3):
            net = pn.from_description("conv(4, 3, pad=1) batchnorm(relu) residual(conv(4, 3, "
                                      "pad=1) batchnorm, relu) maxpool(2) flatten dropout(0.2) "
                                      "dense(3, softmax)", (2, 9, 9), device=device_name)
            net.fit(x, y, epochs=1, batch_size=8, optimizer=optimizer)
            del net
            assert bk.allocated_bytes <= live + bk_workspaces(bk)
    finally:
        gc.enable()


def bk_workspaces(bk):
    """Bytes the backend itself keeps between networks (the split-K GEMM workspace and its
    counts of parts done)."""
    kept = (getattr(bk, name, None) for name in ("_split_ws", "_split_done"))
    return sum(x.nbytes for x in kept if x is not None)


def test_summary_counts_parameters_and_bytes():
    net = pn.mlp((10,), classes=3, hidden=(5,), device="cpu")
    text = net.summary()
    assert "73 parameters" in text                     # 10*5 + 5 + 5*3 + 3
    # parameters, momentum and the updates' skip flag (an int32)
    assert f"{elements((73,)) * 2 * 4 + 4} B on the device" in text


@pytest.mark.parametrize("n", [7, 2**18 - 1, 2**18, 3 * 2**18 + 5])
def test_a_host_copy_split_over_threads_is_the_copy(n, monkeypatch):
    """The copy lanes' pinned copies (staging.copy_split): whole and in order, also in three
    pieces and for lengths that do not divide."""
    from portanet.backends import staging
    src = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    for threads in (2, 3):
        monkeypatch.setattr(staging, "COPY_THREADS", threads)
        dst = np.full(n, np.nan, np.float32)
        staging.copy_split(dst, src)
        assert np.array_equal(dst, src)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("activation", ["relu", "tanh", "linear"])
def test_a_batchnorm_keeps_its_output_alone(device_name, precision, activation):
    """BatchNorm's plan holds a (its output), its mean and 1/std, no z; a training step
    with it gives the gradients of one that keeps z (the reference's BatchNorm with z kept
    apart, as it was: activation_grad from z), on the same weights and batch."""
    from portanet.layers import blocks

    def make():
        return pn.Sequential([pn.Conv2D(4, 3, padding=1), pn.BatchNorm(activation),
                              pn.Flatten(), pn.Dense(3, "softmax")], input_shape=(2, 7, 7),
                             device=device_name, precision=precision, seed=3)
    try:
        net = make()
    except pn.PortanetError as e:
        pytest.skip(str(e))
    bn = net.layers[1]
    names = {b.name for b in net.memory_plan(16).buffers if b.owner == repr(bn)}
    assert {"_a", "_mean", "_inv_std"} <= names and "_z" not in names
    x, y = data(16, (2, 7, 7), 3)
    net.train_batch(x, y)
    after = net.get_weights()

    class KeepsZ(blocks.BatchNorm):           # z apart, its delta by activation_grad
        def batch_buffers(self, m):
            out = super().batch_buffers(m)
            return dict(out, _z=out["_a"])

        def bind(self, a_prev, m, shared):
            super().bind(a_prev, m, shared)
            self.z = self.backend.view(self._z, self.a.shape)
            self.da, self.delta = self.half_views(shared, self.a, self.z)

        def backward(self, train, first, delta_in_z=False):
            bk = self.backend
            if self.half_out:
                if self.activation != "linear" or self.half_slot != self.grad_slot:
                    bk.activation_grad(self.activation, self.z, self.da, self.delta)
            else:
                bk.activation_grad(self.activation, self.z, self.a)
            g, alpha, beta = train.gradient(self)
            dx = self.delta if self.half_out else self.a_prev
            bk.batchnorm_grad(None if first else dx, g["gamma"], g["beta"], self.delta,
                              self.a_prev, self.gamma, self.mean, self.inv_std, alpha, beta)
            train.update(self)

    other = make()
    other.layers[1].__class__ = KeepsZ
    other.train_batch(x, y)
    theirs = other.get_weights()
    assert after.keys() == theirs.keys()
    for name, w in after.items():
        assert rel_err(w, theirs[name], np.linalg.norm(theirs[name]) + 1) < 1e-5, name
    net.free()
    other.free()


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_linear_layer_keeps_one_buffer_for_its_sums_and_activations(device_name, precision):
    """a = z where the activation is linear (Dense and Conv2D, whose backwards read
    neither): the plan holds _z alone, a is a view of it, and the step trains as with two
    buffers (the reference's gradients, held by the other tests, are unchanged). BatchNorm
    keeps its output alone, whatever its activation."""
    try:
        net = pn.Sequential([pn.Conv2D(4, 3, padding=1), pn.BatchNorm(), pn.Dense(6, "linear"),
                             pn.Dense(3, "softmax")], input_shape=(2, 9, 9),
                            device=device_name, precision=precision)
    except pn.PortanetError as e:
        pytest.skip(str(e))
    names = [(b.owner, b.name) for b in net.memory_plan(16).buffers]
    for layer in net.layers[0], net.layers[2]:
        assert (repr(layer), "_z") in names and (repr(layer), "_a") not in names
    assert (repr(net.layers[1]), "_a") in names and (repr(net.layers[1]), "_z") not in names
    assert (repr(net.layers[3]), "_a") in names
    x, y = data(16)
    net.train_batch(x, y)
    conv = net.layers[0]
    if isinstance(conv.a, np.ndarray):                      # the reference's arrays
        assert np.shares_memory(conv.a, conv.z) and conv.a.ctypes.data == conv.z.ctypes.data
    else:
        assert conv.a.buf is conv.z.buf and conv.a.offset == conv.z.offset
    net.free()


# a ResNet's training plan at batch 512 with SGD's momentum (models.resnet, CIFAR-sized), in
# MiB: at most these (1959.5, 1149.9 and 1152.6 when every layer kept z and a apart, and
# BatchNorm both)
RESNET_512_MIB = {"fp32": 1139.0, "bf16": 581.0, "fp16": 584.0}


@pytest.mark.parametrize("precision", sorted(RESNET_512_MIB))
def test_a_resnets_plan_stays_within_its_bound(precision):
    """The plan is what a device allocates (the tests above), so this holds the memory a
    ResNet's step takes on any device in each precision."""
    net = pn.models.resnet(device="cpu", precision=precision)
    plan = net.memory_plan(512, pn.optim.SGD(0.1, momentum=0.9))
    assert plan.total / 2**20 <= RESNET_512_MIB[precision]
