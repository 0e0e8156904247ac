"""Convolution, pooling and dropout: kernels against the NumPy reference on odd shapes,
the reference against a direct convolution, gradients against finite differences."""
import contextlib

import numpy as np
import pytest

import portanet as pn
from portanet import inputs, training
from portanet.backends import conv as conv_paths
from portanet.backends.base import conv_out
from portanet.backends.numpy import NumpyBackend
from portanet.rng import dropout_mask, key_array
from conftest import F32, F64_GRAD, rel_err, simulated

REF = NumpyBackend("cpu", np.float64)
# (C, H, W, N, k, stride, pad): odd images, channels not a multiple of 4
CONV_SHAPES = [(3, 7, 9, 5, 3, 1, 0), (3, 7, 9, 5, 3, 2, 1), (5, 11, 6, 3, 2, 2, 0),
               (1, 5, 5, 2, 5, 1, 2), (6, 8, 8, 1, 1, 1, 0)]


def direct_conv(x, w, stride, pad):
    """x (C, H, W, N), w (F, C, k, k) -> (F, Ho, Wo, N), by the definition."""
    C, H, W, N = x.shape
    F, _, k, _ = w.shape
    xp = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    Ho, Wo = conv_out(H, k, stride, pad), conv_out(W, k, stride, pad)
    out = np.zeros((F, Ho, Wo, N))
    for oh in range(Ho):
        for ow in range(Wo):
            patch = xp[:, oh * stride:oh * stride + k, ow * stride:ow * stride + k, :]
            out[:, oh, ow, :] = np.einsum("fcij,cijn->fn", w, patch)
    return out


@pytest.mark.parametrize("shape", CONV_SHAPES)
def test_reference_im2col_gemm_is_convolution(rng, shape):
    C, H, W, N, k, s, p = shape
    Ho, Wo = conv_out(H, k, s, p), conv_out(W, k, s, p)
    x, w = rng.standard_normal((C, H, W, N)), rng.standard_normal((4, C, k, k))
    cols = np.empty((C * k * k, Ho * Wo * N))
    REF.im2col(cols, x, k, s, p)
    out = (w.reshape(4, -1) @ cols).reshape(4, Ho, Wo, N)
    assert rel_err(out, direct_conv(x, w, s, p)) < 1e-12
    # col2im is im2col's adjoint: <im2col(x), c> = <x, col2im(c)>
    c = rng.standard_normal(cols.shape)
    back = np.empty_like(x)
    REF.col2im(back, c, k, s, p)
    assert np.sum(cols * c) == pytest.approx(np.sum(x * back), rel=1e-12)


@pytest.mark.parametrize("shape", CONV_SHAPES)
def test_im2col_col2im(backend, rng, shape):
    C, H, W, N, k, s, p = shape
    Ho, Wo = conv_out(H, k, s, p), conv_out(W, k, s, p)
    x = rng.standard_normal((C, H, W, N))
    ref = np.empty((C * k * k, Ho * Wo * N))
    REF.im2col(ref, x, k, s, p)
    cols = backend.upload(np.full(ref.shape, np.nan))
    backend.im2col(cols, backend.upload(x), k, s, p)
    assert rel_err(backend.download(cols), ref) < F32
    c = rng.standard_normal(ref.shape)
    ref_x = np.empty_like(x)
    REF.col2im(ref_x, c, k, s, p)
    X = backend.upload(np.full(x.shape, np.nan))
    backend.col2im(X, backend.upload(c), k, s, p)
    assert rel_err(backend.download(X), ref_x) < F32


@pytest.mark.parametrize("C,H,W,N,pool,stride", [(3, 7, 9, 5, 2, 2), (5, 8, 7, 3, 3, 2),
                                                 (2, 6, 6, 4, 3, 3), (1, 5, 5, 1, 2, 1)])
def test_maxpool(backend, rng, C, H, W, N, pool, stride):
    x = rng.standard_normal((C, H, W, N))
    Ho, Wo = conv_out(H, pool, stride, 0), conv_out(W, pool, stride, 0)
    a_ref, idx_ref = np.empty((C, Ho, Wo, N)), np.empty((C, Ho, Wo, N), np.int32)
    REF.maxpool(a_ref, idx_ref, x, pool, stride)
    # by the definition
    for oh in range(Ho):
        for ow in range(Wo):
            win = x[:, oh * stride:oh * stride + pool, ow * stride:ow * stride + pool]
            assert np.array_equal(a_ref[:, oh, ow], win.max(axis=(1, 2)))
    assert np.array_equal(x.ravel()[idx_ref], a_ref)
    A, I = backend.upload(np.full(a_ref.shape, np.nan)), backend.empty(a_ref.shape, np.int32)
    backend.maxpool(A, I, backend.upload(x), pool, stride)
    assert rel_err(backend.download(A), a_ref) < F32
    assert np.array_equal(backend.download(I), idx_ref)
    da = rng.standard_normal(a_ref.shape)
    dx_ref = np.empty_like(x)
    REF.maxpool_grad(dx_ref, da, idx_ref, pool, stride)
    DX = backend.upload(np.full(x.shape, np.nan))
    backend.maxpool_grad(DX, backend.upload(da), backend.upload(idx_ref), pool, stride)
    assert rel_err(backend.download(DX), dx_ref) < F32


@pytest.mark.parametrize("rate", [0.0, 0.3, 0.75])
def test_dropout_same_mask_everywhere(backend, rng, rate):
    n, key = 10007, 0xDEADBEEF
    x = rng.standard_normal(n)
    out = backend.upload(np.full(n, np.nan))
    backend.dropout(out, backend.upload(x), backend.upload(key_array(key)), rate)
    mask = dropout_mask(n, key, rate)
    assert rel_err(backend.download(out), x * mask / (1 - rate)) < F32
    assert abs(mask.mean() - (1 - rate)) < 0.02
    assert not np.array_equal(dropout_mask(n, key + 1, rate), mask) or rate == 0


def small_cnn(dtype="float64", device="cpu", dropout=0.0):
    layers = [pn.Conv2D(4, 3, stride=2, padding=1, activation="tanh"),
              pn.MaxPool2D(3, stride=2),           # overlapping windows
              pn.Conv2D(5, 2, activation="relu"),
              pn.Flatten()]
    if dropout:
        layers.append(pn.Dropout(dropout, seed=3))
    layers.append(pn.Dense(3, "softmax"))
    return pn.Sequential(layers, (3, 11, 9), device=device, dtype=dtype, seed=2)


def training_loss(net, x, y, dropout_step=None):
    """The training-mode loss (dropout active with a fixed mask) of one batch."""
    plan = net.plan
    plan.upload(*inputs.check_data(net, x, y))
    for layer in net.layers:
        if isinstance(layer, pn.Dropout):
            layer.step = dropout_step
            layer.begin_step()                  # the key of step dropout_step + 1
    plan.reset_sums()
    net._forward(training=True)
    net.loss(net.backend, net.layers[-1], plan.loss_sum, plan.hit_sum, plan.y)
    return plan.read_sums(len(x))[0]


@pytest.mark.parametrize("dropout", [0.0, 0.4])
def test_cnn_gradients(rng, dropout):
    net = small_cnn(dropout=dropout)
    x, y = rng.standard_normal((4, 3, 11, 9)), rng.integers(0, 3, 4)
    for layer in net.layers:
        if layer.trainable:
            layer.b[...] = rng.standard_normal(layer.b.shape) * 0.3
    eps = 1e-6
    numeric = []
    for layer in filter(lambda l: l.trainable, net.layers):
        grads = []
        for param in (layer.w, layer.b):
            g = np.zeros_like(param)
            for i in np.ndindex(param.shape):
                old = param[i]
                param[i] = old + eps
                up = training_loss(net, x, y, 0)
                param[i] = old - eps
                down = training_loss(net, x, y, 0)
                param[i] = old
                g[i] = (up - down) / (2 * eps)
            grads.append(g)
        numeric.append(grads)
    training_loss(net, x, y, 0)         # the same mask's key on the device for the step
    before = [(l.w.copy(), l.b.copy()) for l in net.layers if l.trainable]
    training.prepare(net, pn.SGD(lr=1.0))
    training.step(net, pn.SGD(lr=1.0))
    for layer, (gw, gb), (w0, b0) in zip(filter(lambda l: l.trainable, net.layers), numeric,
                                         before):
        assert rel_err(w0 - layer.w, gw) < F64_GRAD, f"{layer} dL/dw"
        assert rel_err(b0 - layer.b, gb) < F64_GRAD, f"{layer} dL/db"


def test_cnn_same_results_on_every_device(device_name, rng):
    x = rng.standard_normal((37, 3, 11, 9)).astype(np.float32)
    y = rng.integers(0, 3, 37)
    nets = [small_cnn("float32", d, dropout=0.25) for d in ("cpu", device_name)]
    for net in nets:
        net.fit(x, y, epochs=2, batch_size=16, optimizer=pn.SGD(0.05, 0.9), seed=1)
    assert np.abs(nets[0].predict(x) - nets[1].predict(x)).max() < 1e-4


@pytest.mark.parametrize("rate", [0.25, 0.6])
def test_dropout_layer_drops_in_training_with_the_mask_it_reuses_backward(device_name, rate):
    """The layer, not only its kernel: training zeroes about `rate` of the inputs and
    scales the rest, the backward passes gradients through the same mask, and every
    step draws a new mask (a Dropout that never drops passed every other test here)."""
    net = pn.from_description(f"dropout({rate}) dense(3, softmax)", (50,), device=device_name)
    drop = net.layers[0]
    x = np.random.default_rng(4).standard_normal((40, 50)).astype(np.float32) + 5.0
    y = np.random.default_rng(4).integers(0, 3, 40)
    net.plan.upload(*inputs.check_data(net, x, y))
    masks = []
    for _ in range(2):
        drop.begin_step()
        net._forward(training=True)
        a = net.backend.download(drop.a)                        # (50, 40)
        mask = dropout_mask(a.size, drop.key, rate).reshape(a.shape)
        assert np.allclose(a, np.where(mask, x.T / (1 - rate), 0), rtol=1e-6)
        assert abs((a == 0).mean() - rate) < 0.05
        masks.append(mask)
    assert not np.array_equal(*masks)
    # a training step through the layer is the step of the Dense alone on the masked,
    # scaled inputs (same initial weights: Dropout draws none)
    net2 = pn.from_description(f"dropout({rate}) dense(3, softmax)", (50,), device=device_name)
    plain = pn.from_description("dense(3, softmax)", (50,), device=device_name)
    before = plain.backend.download(plain.layers[0].w)
    net2.layers[0].step = drop.step - 1                           # the same mask as above
    net2.train_batch(x, y, pn.SGD(1.0))
    plain.train_batch((x * masks[-1].T / (1 - rate)).astype(np.float32), y, pn.SGD(1.0))
    after = plain.backend.download(plain.layers[0].w)
    assert not np.allclose(after, before)
    assert np.allclose(net2.backend.download(net2.layers[1].w), after, rtol=1e-5, atol=1e-6)


def test_dropout_is_identity_in_inference():
    net = pn.from_description("dropout(0.5) dense(2, softmax)", (6,), device="cpu")
    x = np.random.default_rng(0).standard_normal((5, 6)).astype(np.float32)
    assert np.array_equal(net.predict(x), net.predict(x))
    w = net.layers[1].w
    z = x @ w.T + net.layers[1].b
    e = np.exp(z - z.max(1, keepdims=True))
    assert np.allclose(net.predict(x), e / e.sum(1, keepdims=True), atol=1e-6)


def test_lenet_shapes_and_description():
    net = pn.lenet(device="cpu")
    assert [l.out_shape for l in net.layers] == [(16, 26, 26), (32, 24, 24), (32, 12, 12),
                                                 (4608,), (10,)]
    same = pn.from_description("conv(16, 3, relu) conv(32, 3, relu) maxpool(2) flatten "
                               "dense(10, softmax)", (1, 28, 28), device="cpu")
    assert same.architecture() == net.architecture()
    with pytest.raises(pn.InputError, match="unknown layer 'pool'"):
        pn.from_description("pool(2)", (1, 28, 28))
    with pytest.raises(pn.ShapeError, match="does not fit"):
        pn.from_description("conv(4, 9) flatten dense(2, softmax)", (1, 5, 5))


def test_cnn_training_allocates_nothing_after_the_first(device_name):
    bk = pn.device(device_name)
    net = small_cnn("float32", device_name, dropout=0.2)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((40, 3, 11, 9)).astype(np.float32), rng.integers(0, 3, 40)
    net.train_batch(x[:16], y[:16])
    count = bk.allocations
    net.fit(x, y, epochs=2, batch_size=16, data_on_device=False)  # a last batch of 8
    assert bk.allocations == count


def test_cnn_save_load_across_devices(device_name, tmp_path):
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal((20, 3, 11, 9)).astype(np.float32), rng.integers(0, 3, 20)
    net = small_cnn("float32", device_name, dropout=0.3)
    net.fit(x, y, epochs=1, batch_size=8)
    net.save(tmp_path / "cnn.safetensors")
    loaded = pn.load(tmp_path / "cnn.safetensors", device="cpu")
    assert np.abs(loaded.predict(x) - net.predict(x)).max() < 1e-5


# (C, H, W, N, k, stride, pad, F): channels 1, 3 and 17, kernels 1, 3 and 5, strides 1 and
# 2, padding 0, 1 and 2, batches 1, 7 and 64; the last has patches (C.k.k = 2500) and an
# input gradient's sum (F.k.k = 2250) longer than ACC_K, so K runs in pieces
CONV_CASES = [(1, 9, 8, 7, 3, 1, 0, 5), (3, 7, 9, 5, 3, 2, 1, 4), (17, 6, 7, 7, 5, 2, 2, 6),
              (3, 5, 5, 1, 1, 1, 0, 3), (1, 11, 10, 64, 5, 1, 2, 8), (17, 9, 9, 64, 3, 1, 1, 16),
              (3, 8, 7, 7, 1, 2, 0, 9), (100, 5, 5, 2, 5, 1, 2, 90)]
PATHS = ("implicit", "direct", "im2col")


def conv_operands(rng, C, H, W, N, k, s, p, F):
    Ho, Wo = conv_out(H, k, s, p), conv_out(W, k, s, p)
    return (rng.standard_normal((C, H, W, N)), rng.standard_normal((F, C * k * k)) / k,
            rng.standard_normal(F), rng.standard_normal((F, Ho, Wo, N)))


@contextlib.contextmanager
def pinned_conv(bk, path, monkeypatch):
    """A block in which a kernel backend's convolutions take `path` (bk.pinned), with
    chunks of any size allowed (MIN_CHUNK); yields the labels of its launches from then on
    (a new trace, bk.trace)."""
    from test_kernels import _Labels
    monkeypatch.setattr(conv_paths, "MIN_CHUNK", 1)
    monkeypatch.setattr(bk, "trace", _Labels())
    with bk.pinned(conv=path):
        yield bk.trace.labels


@pytest.fixture
def conv_path(backend, monkeypatch):
    """A function that pins the backend's convolutions to a path for the rest of the test
    (pinned_conv)."""
    if backend.kind == "cpu":
        pytest.skip("the reference backend has one path (chunked im2col, tested below)")
    with contextlib.ExitStack() as pins:
        yield lambda path: pins.enter_context(pinned_conv(backend, path, monkeypatch))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", CONV_CASES)
def test_conv_paths(backend, conv_path, rng, case, path):
    """Each path of the three convolution products against the reference (float64): the
    forward with bias and relu, the weight gradient with alpha and beta, the input
    gradient; im2col in three chunks of a small workspace. The labels say the path ran."""
    C, H, W, N, k, s, p, F = case
    x, w, b, dz = conv_operands(rng, *case)
    rows, positions = C * k * k, dz[0].size
    simulated(backend, F * rows * positions)
    if path == "direct" and rows > conv_paths.DIRECT_ROWS:
        pytest.skip(f"direct is for patches of at most {conv_paths.DIRECT_ROWS} (this: {rows})")
    if path == "im2col" and not backend.vendor_gemm:
        pytest.skip("im2col goes with a vendor GEMM, which this device has not")
    conv_path(path)
    ws = backend.empty((rows * -(-positions // 3),))
    z_ref, a_ref = np.empty(dz.shape), np.empty(dz.shape)
    REF.conv("relu", w, x, b, z_ref, a_ref, k, s, p)
    Z, A = (backend.upload(np.full(dz.shape, np.nan)) for _ in range(2))
    X, Wt, DZ = backend.upload(x), backend.upload(w), backend.upload(dz)
    backend.conv("relu", Wt, X, backend.upload(b), Z, A, k, s, p, ws)
    assert rel_err(backend.download(Z), z_ref) < F32
    assert rel_err(backend.download(A), a_ref) < F32
    gw0 = rng.standard_normal(w.shape)
    gw_ref = gw0.copy()
    REF.conv_weight_grad(-0.3, dz, x, 0.9, gw_ref, k, s, p)
    GW = backend.upload(gw0)
    backend.conv_weight_grad(-0.3, DZ, X, 0.9, GW, k, s, p, ws)
    assert rel_err(backend.download(GW), gw_ref) < F32
    dx_ref = np.empty(x.shape)
    REF.conv_input_grad(dx_ref, w, dz, k, s, p)
    DX = backend.upload(np.full(x.shape, np.nan))
    backend.conv_input_grad(DX, Wt, DZ, k, s, p, ws)
    assert rel_err(backend.download(DX), dx_ref) < F32
    if path != "direct":                    # (direct is the forward's: dgrad goes elsewhere)
        dx0 = rng.standard_normal(x.shape)  # added to what dx holds (a block's projection)
        DX = backend.upload(dx0)
        backend.conv_input_grad(DX, Wt, DZ, k, s, p, ws, add=True)
        assert rel_err(backend.download(DX), dx0 + dx_ref) < F32
    ran = " ".join(backend.trace.labels)
    mark = {"implicit": "conv dgrad", "direct": "conv_direct", "im2col": "im2col"}[path]
    assert mark in ran, ran
    if path == "im2col":
        assert backend.trace.labels.count("im2col") == 2 * -(-positions // -(-positions // 3))
    # a workspace that holds the whole patch matrix: the forward says it left it there,
    # and the weight gradient takes it from there (patches=True) without another im2col
    whole = backend.empty((rows * positions,))
    backend.trace.labels.clear()
    left = backend.conv("relu", Wt, X, backend.upload(b), Z, A, k, s, p, whole)
    assert left == (path == "im2col")
    GW = backend.upload(gw0)
    backend.conv_weight_grad(-0.3, DZ, X, 0.9, GW, k, s, p, whole, patches=left)
    assert rel_err(backend.download(GW), gw_ref) < F32
    if path != "direct":                # (the weight gradient has no direct path: routed)
        assert backend.trace.labels.count("im2col") == (path == "im2col")


@pytest.mark.parametrize("case", CONV_CASES[:4] + CONV_CASES[6:7])
@pytest.mark.parametrize("room", [None, 1, 7, "2 rows"])
def test_reference_conv_in_chunks(rng, case, room):
    """The reference's convolution products by chunks of a workspace of `room` patch
    columns (None: its own; 2 rows: two rows of outputs, cut by slices), against the
    definition and its adjoints: <dz, conv(x)> = <x, input_grad(dz)> = <w, weight_grad(dz)>."""
    C, H, W, N, k, s, p, F = case
    x, w, b, dz = conv_operands(rng, *case)
    if room == "2 rows":
        room = 2 * dz.shape[2] * N
    ws = None if room is None else np.empty(C * k * k * room)
    z, a = np.empty(dz.shape), np.empty(dz.shape)
    REF.conv("tanh", w, x, b, z, a, k, s, p, ws)
    ref = direct_conv(x, w.reshape(F, C, k, k), s, p)
    assert rel_err(z, ref + b[:, None, None, None]) < 1e-12
    assert rel_err(a, np.tanh(z)) < 1e-12
    gw, dx = np.ones_like(w), np.full(x.shape, np.nan)
    REF.conv_weight_grad(0.5, dz, x, 2.0, gw, k, s, p, ws)
    REF.conv_input_grad(dx, w, dz, k, s, p, ws)
    inner = np.sum(dz * ref)
    assert np.sum(x * dx) == pytest.approx(inner, rel=1e-12)
    assert np.sum(w * (gw - 2.0) / 0.5) == pytest.approx(inner, rel=1e-12)
    dx0 = rng.standard_normal(x.shape)            # add: onto what dx holds
    more = dx0.copy()
    REF.conv_input_grad(more, w, dz, k, s, p, ws, add=True)
    assert rel_err(more, dx0 + dx) < 1e-12


def test_conv_output_may_be_its_activation(backend, rng):
    """conv with a = z (inference keeps only a): a <- f(w * x + b) on every path."""
    case = (3, 7, 9, 5, 3, 2, 1, 4)
    x, w, b, dz = conv_operands(rng, *case)
    z_ref, a_ref = np.empty(dz.shape), np.empty(dz.shape)
    REF.conv("sigmoid", w, x, b, z_ref, a_ref, 3, 2, 1)
    A = backend.upload(np.full(dz.shape, np.nan))
    backend.conv("sigmoid", backend.upload(w), backend.upload(x), backend.upload(b), A, A,
                 3, 2, 1)
    assert rel_err(backend.download(A), a_ref) < F32


@pytest.mark.parametrize("what", ["w", "b", "z", "window"])
def test_conv_shape_errors(backend, what):
    """A conv whose arrays do not fit raises a ShapeError naming the array and its shape."""
    x = backend.empty((3, 7, 9, 5))
    w, b = backend.empty((4, 27)), backend.empty((4,))
    z = backend.empty((4, 5, 7, 5))
    k = 3
    if what == "w":
        w = backend.empty((4, 26))
    elif what == "b":
        b = backend.empty((5,))
    elif what == "z":
        z = backend.empty((4, 5, 7, 4))
    else:
        k = 10
    with pytest.raises(pn.ShapeError, match="window" if what == "window" else f"{what} "):
        backend.conv("relu", w, x, b, z, z, k, 1, 0)
