"""Recorded training steps (CUDA graphs; on OpenCL the list of bound launches):
replays give bit for bit what the eager steps give, through new batches, a partial last
batch, a rate that changes every epoch and Dropout's new mask at every step. The
reference records nothing and the same code runs eagerly."""
import contextlib

import numpy as np
import pytest

import portanet as pn
from portanet.plan import Replays

DESCRIPTIONS = ["dense(24, relu) dense(9, tanh) dense(5, softmax)",
                "conv(4, 3, relu) maxpool(2) flatten dense(5, softmax)"]


@contextlib.contextmanager
def freed_shapes(bk):
    """The shapes of the arrays bk frees inside the block (bk.free spied on, then put
    back: backends are shared)."""
    freed, free = [], bk.free
    bk.free = lambda array: (freed.append(tuple(array.shape)), free(array))
    try:
        yield freed
    finally:
        del bk.free


def train(description, device, monkeypatch, graphs):
    monkeypatch.setenv("PORTANET_GRAPHS", "on" if graphs else "off")
    shape = (20,) if description.startswith("dense") else (1, 10, 10)
    net = pn.from_description(description, shape, device=device, seed=4)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((150, *shape)).astype(np.float32)
    y = rng.integers(0, 5, 150)
    history = net.fit(x, y, epochs=3, batch_size=32, optimizer=pn.SGD(0.05, 0.9),
                      schedule="exponential(0.7)",          # 4 full batches and one of 22
                      data_on_device=False)                 # (its graphs are kept after fit)
    weights = [net.backend.download(l.w) for l in net.layers if l.trainable]
    return net, history, weights


@pytest.mark.parametrize("description", DESCRIPTIONS)
def test_replayed_steps_are_the_eager_steps(device_name, description, monkeypatch):
    recorded, h1, w1 = train(description, device_name, monkeypatch, graphs=True)
    eager, h2, w2 = train(description, device_name, monkeypatch, graphs=False)
    assert h1["loss"] == h2["loss"]
    assert all(np.array_equal(a, b) for a, b in zip(w1, w2))
    replays = [g for g in recorded.plan.replays.graphs.values() if g]
    if recorded.backend.kind in ("cuda", "opencl"):
        assert len(replays) == 3            # one per epoch's rate (the last batch of 22 runs
        #                                     once per rate: seen, never captured)
        # each batch was staged as it is and laid out by the step (staged_step)
        assert all(key[3] for key in recorded.plan.replays.graphs if len(key) == 4)
    else:
        assert not replays                  # the reference records nothing: all eager
    assert not eager.plan.replays.graphs or not any(eager.plan.replays.graphs.values())


def test_batches_too_large_to_stage_give_the_same_run(device_name, monkeypatch):
    """A batch of LANE_BYTES or more is not staged for the step to lay out: write_samples
    sends it through the copy lane before the step. The run is the staged one bit for
    bit."""
    from portanet.backends import gpu
    if pn.backends.device(device_name).simulator:
        pytest.skip("Oclgrind flags reads of what the copy lane wrote (test_write_samples)")
    _, h1, w1 = train(DESCRIPTIONS[1], device_name, monkeypatch, graphs=True)
    monkeypatch.setattr(gpu, "LANE_BYTES", 0)
    whole, h2, w2 = train(DESCRIPTIONS[1], device_name, monkeypatch, graphs=True)
    assert h1["loss"] == h2["loss"]
    assert all(np.array_equal(a, b) for a, b in zip(w1, w2))
    assert not any(key[3] for key in whole.plan.replays.graphs if len(key) == 4)


@pytest.mark.parametrize("on_device", [False, True])
def test_dropout_networks_are_recorded_and_draw_a_new_mask_each_replay(device_name, on_device,
                                                                       monkeypatch):
    """Dropout's key is written to the device before each step, where the kernel reads it:
    its networks are recorded too, batches sent or gathered on the device, and their
    replays are the eager steps bit for bit."""
    results, recorded = [], []
    for graphs in (True, False):
        monkeypatch.setenv("PORTANET_GRAPHS", "on" if graphs else "off")
        net = pn.from_description("dense(16, relu) dropout(0.3) dense(3, softmax)", (8,),
                                  device=device_name)
        if graphs:                              # the steps it records (the device's backend)
            capture = net.backend.capture
            monkeypatch.setattr(net.backend, "capture",
                                lambda work: recorded.append(capture(work)) or recorded[-1])
        rng = np.random.default_rng(1)
        history = net.fit(rng.standard_normal((64, 8)).astype(np.float32),
                          rng.integers(0, 3, 64), epochs=2, batch_size=16,
                          data_on_device=on_device)
        results.append((net, history["loss"], net.get_weights()))
    (net, loss1, w1), (_, loss2, w2) = results
    assert loss1 == loss2 and all(np.array_equal(w1[k], w2[k]) for k in w1)
    assert any(recorded) == (net.backend.kind in ("cuda", "opencl"))
    assert net.layers[1].step == 8                            # a key per step, replays too


def test_the_switch_is_checked(monkeypatch):
    monkeypatch.setenv("PORTANET_GRAPHS", "sometimes")
    with pytest.raises(pn.PortanetError, match="PORTANET_GRAPHS='sometimes'"):
        pn.mlp((4,), classes=2, hidden=(3,), device="cpu")


def test_a_recorded_step_is_recorded_again_when_its_workspace_moves(device_name, monkeypatch):
    """The split-K workspace is the backend's, shared by every network: when another
    product grows it, a step recorded with the old one must not replay (it would read
    freed memory); it is recorded again and stays bit for bit the eager step."""
    results = []
    for graphs in (True, False):
        monkeypatch.setenv("PORTANET_GRAPHS", "on" if graphs else "off")
        net = pn.from_description(DESCRIPTIONS[1], (1, 10, 10), device=device_name, seed=4)
        bk = net.backend
        rng = np.random.default_rng(5)
        x, y = rng.standard_normal((96, 1, 10, 10)).astype(np.float32), rng.integers(0, 5, 96)
        net.fit(x, y, epochs=1, batch_size=32, optimizer=pn.SGD(0.05, 0.9))
        if bk.kind != "cpu":                  # as another network's long product would
            before, ws = bk.generation, getattr(bk, "_split_ws", None)
            size = 2 * (ws.size if ws is not None else 1000)
            bk._split_workspace(size)
            bk._split_workspace(2 * size)     # grown at least once: the old one freed
            assert bk.generation > before
        net.fit(x, y, epochs=1, batch_size=32, optimizer=pn.SGD(0.05, 0.9))
        results.append([bk.download(l.w) for l in net.layers if l.trainable])
    assert all(np.array_equal(a, b) for a, b in zip(*results))


def test_a_step_that_moved_a_workspace_is_recorded_only_after_one_that_did_not():
    """A step whose first run grew a workspace mid-step (a later product needing more)
    runs eagerly once more before it is recorded: recorded at once, its earlier products
    would have made their CUDA tensor maps for the new workspace inside the recording,
    which cannot copy them to the device (met on an H100 in fp16: a CNN whose im2col
    products grow the 16-bit operand workspace after its first Dense made its maps). A
    recorded step gone stale runs eagerly before it is recorded again."""
    class Graph:
        current = True

        def __init__(self, work):
            self.work = work

        def __call__(self):
            self.work()

    class Backend:
        generation = 0
        recorded = 0

        def capture(self, work):
            self.recorded += 1
            return Graph(work)

        def prebuild(self, *works):         # a first step's builds: none here
            return 0

    replays = Replays(Backend(), capturable=True)
    runs = []

    def work():
        runs.append(replays.backend.recorded)
        if len(runs) == 1:
            replays.backend.generation += 1     # the first step grows a workspace
    for _ in range(2):
        replays("k", work)
    assert replays.backend.recorded == 0        # both eager: the first moved a workspace
    replays("k", work)
    assert replays.backend.recorded == 1 and replays.graphs["k"]
    replays.graphs["k"].current = False         # freed since: eager, then recorded again
    replays("k", work)
    assert replays.backend.recorded == 1
    replays("k", work)
    assert replays.backend.recorded == 2 and len(runs) == 5


@pytest.mark.parametrize("description", DESCRIPTIONS)
def test_training_set_on_the_device_gives_the_same_run(device_name, description):
    """fit(data_on_device=True) uploads the set once and gathers each shuffled batch on the
    device (recorded steps included); the run is bit for bit the one that sends batches."""
    shape = (20,) if description.startswith("dense") else (1, 10, 10)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((150, *shape)).astype(np.float32)
    y = rng.integers(0, 5, 150)
    runs = []
    for on_device in (True, False):
        net = pn.from_description(description, shape, device=device_name, seed=4)
        bk = net.backend
        with freed_shapes(bk) as freed:
            h = net.fit(x, y, epochs=3, batch_size=32, optimizer=pn.SGD(0.05, 0.9),
                        schedule="exponential(0.7)", data_on_device=on_device)
        runs.append((h["loss"], [bk.download(l.w) for l in net.layers if l.trainable]))
        # the set is given back when fit returns
        assert ((150, int(np.prod(shape))) in freed and (150,) in freed) == on_device
    assert runs[0][0] == runs[1][0]
    assert all(np.array_equal(a, b) for a, b in zip(runs[0][1], runs[1][1]))


@pytest.mark.parametrize("gpu, epochs, resumed, kept", [
    (True, 2, 0, True), (True, 1, 0, False), (True, 3, 2, False), (False, 4, 0, False)])
def test_auto_keeps_the_set_on_a_gpu_for_two_epochs_or_more(tmp_path, monkeypatch, gpu,
                                                            epochs, resumed, kept):
    """fit's default, data_on_device="auto": the set goes up where the device is a GPU and
    the call runs two epochs or more (a resumed run counts the epochs left), else the
    batches go from the host; the run is the same either way."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal((60, 20)).astype(np.float32)
    y = rng.integers(0, 5, 60)
    runs = []
    for as_gpu in (gpu, False):
        net = pn.from_description(DESCRIPTIONS[0], (20,), device="cpu", seed=4)
        bk = net.backend
        monkeypatch.setattr(bk, "is_gpu", as_gpu)   # the shared cpu backend's, put back after
        checkpoint = tmp_path / f"run{as_gpu}.npz"
        if resumed:
            net.fit(x, y, epochs=resumed, batch_size=16, checkpoint=checkpoint,
                    data_on_device=False)
        with freed_shapes(bk) as freed:
            h = net.fit(x, y, epochs=epochs, batch_size=16,
                        resume=checkpoint if resumed else None)
        assert ((60, 20) in freed) == (kept and as_gpu)
        runs.append((h["loss"], bk.download(net.layers[0].w)))
    assert runs[0][0] == runs[1][0] and np.array_equal(runs[0][1], runs[1][1])


def test_real_targets_are_gathered_too(device_name):
    net = pn.from_description("dense(6, tanh) dense(3, linear)", (4,), loss="mse",
                              device=device_name)
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((50, 4)).astype(np.float32), rng.standard_normal((50, 3))
    a = net.fit(x, y, epochs=2, batch_size=16, data_on_device=True)["loss"]
    net2 = pn.from_description("dense(6, tanh) dense(3, linear)", (4,), loss="mse",
                               device=device_name)
    assert a == net2.fit(x, y, epochs=2, batch_size=16, data_on_device=False)["loss"]


def test_with_the_set_on_the_device_steps_allocate_nothing(device_name):
    """Keeping the set on the device costs its two arrays per fit, whatever the epochs."""
    net = pn.from_description(DESCRIPTIONS[1], (1, 10, 10), device=device_name)
    bk = net.backend
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((70, 1, 10, 10)).astype(np.float32), rng.integers(0, 5, 70)
    net.fit(x, y, epochs=1, batch_size=16, data_on_device=True)     # sizes everything
    counts = []
    for epochs in (1, 4):
        before = bk.allocations
        net.fit(x, y, epochs=epochs, batch_size=16, data_on_device=True)
        counts.append(bk.allocations - before)
    assert counts == [2, 2]


def test_opencl_replays_enqueue_each_launch_without_pyopencl(device_name, monkeypatch):
    """An OpenCL replay calls clEnqueueNDRangeKernel itself, its arguments converted to C
    once and no event made per launch; what it computes is the eager launches'."""
    bk = pn.device(device_name)
    if bk.kind != "opencl":
        pytest.skip("replays through clEnqueueNDRangeKernel are the OpenCL backend's")
    from portanet.backends import opencl
    assert opencl._enqueue_api(typed=False) is not None     # pyopencl's library, on Linux
    x = bk.upload(np.arange(10.0))
    y = bk.upload(np.ones(10))
    bk.axpy(1.0, x, y)                                  # built, as before a step is recorded
    replay = bk.capture(lambda: (bk.axpy(1.0, x, y), bk.scal(0.5, y)))

    def refused(*args, **kwargs):
        raise AssertionError("a replay enqueued through pyopencl")
    monkeypatch.setattr(opencl.cl, "enqueue_nd_range_kernel", refused)
    replay()
    replay()
    monkeypatch.undo()
    want = np.arange(10.0) + 1
    for _ in range(2):
        want = (want + np.arange(10.0)) * 0.5
    assert np.array_equal(bk.download(y), want.astype(bk.dtype))
    assert opencl._status_name(-5) == "CL_OUT_OF_RESOURCES (-5)"


@pytest.mark.parametrize("description", DESCRIPTIONS)
def test_predict_and_evaluate_replay_their_forward_pass(device_name, description,
                                                        monkeypatch):
    """predict and evaluate record a batch size's forward pass (and loss) the second time
    they run it and replay it after: the outputs and sums are the eager ones bit for bit,
    through a partial last batch."""
    results = []
    for graphs in (True, False):
        net, _, _ = train(description, device_name, monkeypatch, graphs)
        rng = np.random.default_rng(9)
        x = rng.standard_normal((70, *net.input_shape)).astype(np.float32)
        y = rng.integers(0, 5, 70)
        runs = [(net.predict(x, batch_size=16), net.evaluate(x, y, batch_size=16))
                for _ in range(3)]
        results.append((net, runs))
    (recorded, replays), (_, eager) = results
    for (p1, s1), (p2, s2) in zip(replays, eager):
        assert np.array_equal(p1, p2) and s1 == s2
    kinds = {key[0] for key, graph in recorded.plan.replays.graphs.items() if graph} - {32}   # fit's
    assert kinds == ({"predict", "evaluate"} if recorded.backend.kind in ("cuda", "opencl")
                     else set())
