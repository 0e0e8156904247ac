"""16-bit storage in bf16 and fp16 (docs/storage16.md): the batch where
a Dense reads it first, and a Dense's z and a where another Dense reads them, are held in
16 bits (precision.STORAGE); the kernels that write them round as the reference's
to_storage, the products read them as they are.

Tolerances: what a kernel stores is the reference's bits where both compute the same float32
value (a copy, z + b); an activation and its derivative go through the device's own math
library, so a 16-bit value may be one unit of the precision off (2 UNIT_ROUNDOFF relative),
and a derivative a few float32 ulps where it crosses 0. Products of
16-bit operands: F32 against the product of the rounded values, as in test_precision.py.
"""
import contextlib

import numpy as np
import pytest

import portanet as pn
from portanet.backends.base import ACTIVATIONS, conv_out
from portanet.errors import ShapeError
from portanet.precision import STORAGE, UNIT_ROUNDOFF, from_storage, round_to, to_storage

from conftest import F32, precision_backend, rel_err
from test_conv import pinned_conv

HALVES = ("bf16", "fp16")


@pytest.fixture(params=HALVES)
def half(request):
    return request.param


def stored(bk, host):
    """host's values in a new 16-bit array of bk (written through bk.write, which rounds)."""
    x = bk.empty(host.shape, bk.storage_dtype)
    bk.write(x, host)
    return x


def values(bk, x):
    return from_storage(bk.download(x), bk.precision)


def close_values(got, want, half, scale):
    """16-bit values within one unit of the precision of the reference's (2 UNIT_ROUNDOFF
    relative: a float32 sum in another order may round the other way), or within float32's
    rounding of the terms they come from where they cancel to near 0."""
    return np.all(np.abs(got - want) <= 2 * UNIT_ROUNDOFF[half] * np.abs(want) + F32 * scale)


# -- the storage type ------------------------------------------------------------------------

def test_storage_is_the_rounded_value_in_16_bits(rng, half):
    x = np.concatenate([rng.standard_normal(5000) * 10.0 ** rng.uniform(-6, 4, 5000),
                        [0.0, -0.0, np.inf, -np.inf, 65504, 65520, 2 ** -24, 2 ** -26,
                         1 + 2 ** -8, 1 + 3 * 2 ** -8]]).astype(np.float32)
    with np.errstate(over="ignore"):
        s = to_storage(x, half)
    assert s.dtype == STORAGE[half] and s.dtype.itemsize == 2
    assert np.array_equal(from_storage(s, half), round_to(x, half))
    assert np.signbit(from_storage(s, half)[x.size - 9])            # -0.0 stays negative
    nan = to_storage(np.array([np.nan, -np.nan], np.float32), half)
    assert np.isnan(from_storage(nan, half)).all()
    assert np.array_equal(to_storage(from_storage(s, half), half).view(np.uint16),
                          s.view(np.uint16))                        # exact both ways


def test_a_16_bit_array_written_back_as_downloaded_is_unchanged(device_name, rng, half):
    """write takes values and rounds them, but an array of the storage's own dtype is stored
    values already (routing's trials put what they downloaded back so)."""
    bk = precision_backend(device_name, half)
    x = stored(bk, rng.standard_normal((3, 50)).astype(np.float32))
    bits = bk.download(x)
    bk.write(x, bits)
    assert np.array_equal(bk.download(x).view(np.uint16), bits.view(np.uint16))


def test_only_bf16_and_fp16_store_16_bits():
    assert pn.device("cpu").storage_dtype is None
    assert pn.device("cpu", precision="tf32").storage_dtype is None
    assert pn.device("cpu", precision="bf16").storage_dtype == np.uint16
    assert pn.device("cpu", precision="fp16").storage_dtype == np.float16


# -- the kernels that read and write it ------------------------------------------------------

def gemm_paths(bk):
    if bk.kind == "cpu":
        return ["reference"]
    return ["own", "auto"] + (["vendor"] if bk.vendor_gemm else [])


@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (33, 65, 17), (130, 257, 136), (7, 129, 1000)])
@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (False, True), (True, False),
                                             (True, True)])
@pytest.mark.parametrize("which", ["a", "b", "both"])
def test_gemm_reads_16_bit_operands(device_name, rng, half, m, n, k, trans_a, trans_b, which):
    """Every GEMM path with either operand, or both, in 16-bit storage: the product of the
    stored values, summed in float32."""
    bk = precision_backend(device_name, half)
    a = rng.standard_normal((k, m) if trans_a else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32)
    op_a, op_b = (a.T if trans_a else a), (b.T if trans_b else b)
    want = round_to(op_a, half).astype(np.float64) @ round_to(op_b, half)
    for path in gemm_paths(bk):
        with bk.pinned(gemm=path):
            A = stored(bk, a) if which in ("a", "both") else bk.upload(a)
            B = stored(bk, b) if which in ("b", "both") else bk.upload(b)
            C = bk.upload(np.full((m, n), np.nan, np.float32))
            bk.gemm(1.0, A, B, 0.0, C, trans_a, trans_b)
            assert rel_err(bk.download(C), want) < F32, path


VW4 = {"DB": 0, "MICRO": 0, "MIN_GROUPS": 1, "PAD": 4, "SUBGROUP": 0, "SWIZZLE": 1,
       "TSK": 16, "TSM": 64, "TSN": 64, "VW": 4, "WPTM": 8, "WPTN": 8}


@pytest.mark.parametrize("m,n,k,offsets", [(100, 130, 70, (3, 50001)),      # one by one
                                            (128, 192, 96, (4, 50008)),     # runs of 4
                                            (128, 128, 64, (2, 50002))])    # 4-byte aligned
@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (True, True)])
@pytest.mark.parametrize("which", ["a", "b", "both"])
def test_gemm_reads_16_bit_views(device_name, rng, half, m, n, k, offsets, trans_a, trans_b,
                                 which):
    """Our GEMM with a 4-wide tiling on 16-bit operands at offsets inside one 16-bit buffer:
    runs that start at a whole 8 bytes load as one ushort4, others one by one (vec_a and
    vec_b), c float32 apart and nothing else written."""
    bk = precision_backend(device_name, half)
    if bk.kind == "cpu":
        pytest.skip("the reference has no tilings")
    host = rng.standard_normal(200000).astype(np.float32)
    big, plain = stored(bk, host), bk.upload(host)
    oa, ob = offsets
    sa, sb = ((k, m) if trans_a else (m, k)), ((n, k) if trans_b else (k, n))
    a = bk.view(big if which in ("a", "both") else plain, sa, oa)
    b = bk.view(big if which in ("b", "both") else plain, sb, ob)
    ha, hb = host[oa:oa + m * k].reshape(sa), host[ob:ob + k * n].reshape(sb)
    want = (round_to(ha.T if trans_a else ha, half).astype(np.float64)
            @ round_to(hb.T if trans_b else hb, half))
    c = bk.upload(np.full((m, n), np.nan, np.float32))
    bk._gemm_own(1.0, a, b, 0.0, c, trans_a, trans_b, m, n, k, tiling=(dict(VW4), 1, k))
    assert rel_err(bk.download(c), want) < F32
    assert np.array_equal(bk.download(big).view(np.uint16),
                          to_storage(host, half).view(np.uint16))


def test_gemm_reads_16_bit_specials_exactly(device_name, half):
    """Stored values times the identity come back as they are on every path: subnormals,
    the largest finite, ties rounded on the way in."""
    bk = precision_backend(device_name, half)
    top = 65504.0 if half == "fp16" else 3.0e38
    x = np.array([[0.0, 1.0, -2.5, top, -top, 2 ** -24, -(2 ** -20), 2 ** -14, 1 + 2 ** -8,
                   1 + 3 * 2 ** -11, -(1 + 2 ** -7)]], np.float32).repeat(8, axis=0)
    eye = np.eye(x.shape[1], dtype=np.float32)
    want = round_to(x, half)
    for path in gemm_paths(bk):
        with bk.pinned(gemm=path):
            c = bk.zeros(x.shape)
            bk.gemm(1.0, stored(bk, x), bk.upload(eye), 0.0, c)
            assert np.array_equal(bk.download(c), want), path


@pytest.mark.parametrize("kind", [k for k in ACTIVATIONS if k != "softmax"])
def test_bias_activation_stores_z_and_a_in_16_bits(device_name, rng, half, kind):
    bk, ref = precision_backend(device_name, half), pn.device("cpu", precision=half)
    rows, cols = 37, 203
    z = (rng.standard_normal((rows, cols)) * 3).astype(np.float32)
    b = rng.standard_normal(rows).astype(np.float32)
    want_z, want_a = (ref.empty((rows, cols), ref.storage_dtype) for _ in range(2))
    ref.bias_activation(kind, z.copy(), b, want_a, stored=want_z)
    Z = bk.upload(z)
    A, S = (bk.empty((rows, cols), bk.storage_dtype) for _ in range(2))
    bk.bias_activation(kind, Z, bk.upload(b), A, stored=S)
    assert np.array_equal(bk.download(S), want_z)                   # z + b, rounded
    assert np.array_equal(bk.download(Z), z)                        # the sum as it was
    got, want = values(bk, A), from_storage(want_a, half)
    assert np.all(np.abs(got - want) <= 2 * UNIT_ROUNDOFF[half] * np.abs(want) + 1e-30), kind


def test_bias_activation_refuses_mixed_storage(rng, half):
    bk = pn.device("cpu", precision=half)
    z = np.zeros((3, 4), np.float32)
    with pytest.raises(ShapeError, match="16-bit storage"):
        bk.bias_activation("relu", z, np.zeros(3, np.float32), np.zeros((3, 4), np.float32),
                           stored=bk.empty((3, 4), bk.storage_dtype))


@pytest.mark.parametrize("kind", ["linear", "relu", "tanh", "gelu"])
@pytest.mark.parametrize("rows,cols", [(5, 7), (3, 5000), (40, 257)])
def test_the_delta_of_a_16_bit_layer(device_name, rng, half, kind, rows, cols):
    """activation_bias_grad on a 16-bit z (whole rows and in pieces, where routing may take
    either): the delta f'(z) . da stored in 16 bits, the bias gradient summed before it
    rounds."""
    bk, ref = precision_backend(device_name, half), pn.device("cpu", precision=half)
    z = to_storage(rng.standard_normal((rows, cols)).astype(np.float32), half)
    da = rng.standard_normal((rows, cols)).astype(np.float32)
    gb = rng.standard_normal(rows).astype(np.float32)
    z_ref, gb_ref = z.copy(), gb.copy()
    ref.activation_bias_grad(kind, z_ref, da, 0.5, 0.25, gb_ref, np.ones(cols, np.float32))
    for way in ([None] if bk.kind == "cpu" else ["whole", "split", "routed"]):
        Z, GB = stored(bk, from_storage(z, half)), bk.upload(gb)
        # routed: timed here, each trial restoring z and gb
        pin = ({} if way is None else {"gemm": "auto"} if way == "routed" else
               {"routes": {("activation_bias_grad_stored", rows, cols): way}})
        with bk.pinned(**pin):
            bk.activation_bias_grad(kind, Z, bk.upload(da), 0.5, 0.25, GB,
                                    bk.upload(np.ones(cols, np.float32)))
        got, want = values(bk, Z), from_storage(z_ref, half)
        # f'(z) from the device's math library: a few float32 ulps of 1 apart where it
        # crosses 0 (gelu's at -0.75), which no relative bound holds
        assert np.all(np.abs(got - want) <= 2 * UNIT_ROUNDOFF[half] * np.abs(want)
                      + 1e-6 * np.abs(da)), way
        scale = 0.5 * np.abs(from_storage(z_ref, half)).sum(axis=1) + 0.25 * np.abs(gb)
        assert np.all(np.abs(bk.download(GB) - gb_ref) <= 4 * UNIT_ROUNDOFF[half] * scale), way


# -- convolutions, pooling, dropout ---------------------------------------------------------

# (C, H, W, N, k, stride, pad, F): a first layer (C = 1: direct's), batches of whole runs of 4
# (the gathers' vector loads) and not, strided and padded
CONV16 = [(1, 9, 8, 8, 3, 1, 1, 6), (3, 7, 9, 5, 3, 2, 0, 4), (6, 6, 5, 12, 3, 1, 1, 9),
          (4, 5, 5, 4, 1, 1, 0, 3)]


@pytest.mark.parametrize("path", ["implicit", "implicit-vw4", "direct", "im2col"])
@pytest.mark.parametrize("storage", ["16-bit", "images", "outputs"])
@pytest.mark.parametrize("case", CONV16)
def test_convolutions_read_and_store_16_bits(device_name, rng, half, case, storage, path,
                                             monkeypatch):
    """Each path of a convolution's three products, with its images and delta in 16 bits
    (storage "16-bit": a conv between two 16-bit layers; "images": one whose output a real
    layer reads; "outputs": one after a real layer), against the reference in the same
    precision: the forward's stored z + b and f(z + b) within one unit of the precision
    (the sums' order differs), the float32 gradients within F32 of the same products.
    implicit-vw4: a 4-wide tiling, whose gathers load a pixel of 4 samples as one ushort4
    where the batch is a multiple of 4."""
    C, H, W, N, k, st, pad, F = case
    bk = precision_backend(device_name, half)
    if bk.kind == "cpu" and path != "implicit":
        pytest.skip("the reference has one path")
    if path == "implicit-vw4":
        monkeypatch.setattr(bk, "_tiling", lambda m, n, k, conv=None: (dict(VW4), 1, k))
    if path == "direct" and (C * k * k > 32 or storage != "16-bit"):
        pytest.skip("direct: short patches, images and outputs stored alike")
    ref = pn.device("cpu", precision=half)
    Ho, Wo = conv_out(H, k, st, pad), conv_out(W, k, st, pad)
    x = rng.standard_normal((C, H, W, N)).astype(np.float32)
    w = (rng.standard_normal((F, C * k * k)) / k).astype(np.float32)
    b = rng.standard_normal(F).astype(np.float32)
    dz = rng.standard_normal((F, Ho, Wo, N)).astype(np.float32)
    half_in, half_out = storage in ("16-bit", "images"), storage in ("16-bit", "outputs")
    with (contextlib.nullcontext() if bk.kind == "cpu"      # (the reference has one path)
          else pinned_conv(bk, path.split("-")[0], monkeypatch)) as labels:
        got, want = {}, {}
        for where, out in ((bk, got), (ref, want)):
            up = lambda host, half16: stored(where, host) if half16 else where.upload(host)
            X, DZ, Wt = up(x, half_in), up(dz, True), where.upload(w)
            ws = where.empty((C * k * k * Ho * Wo * N,))
            Z = where.upload(np.full(dz.shape, np.nan, np.float32))
            A, S = (up(np.full(dz.shape, np.nan, np.float32), half_out) for _ in range(2))
            where.conv("tanh", Wt, X, where.upload(b), Z, A, k, st, pad, ws,
                       stored=S if half_out else None)
            out["a"] = values(where, A) if half_out else where.download(A)
            out["z"] = values(where, S) if half_out else where.download(Z)
            GW = where.upload(np.ones(w.shape, np.float32))
            where.conv_weight_grad(-0.5, DZ, X, 0.25, GW, k, st, pad, ws)
            DX = where.upload(np.full(x.shape, np.nan, np.float32))
            where.conv_input_grad(DX, Wt, DZ, k, st, pad, ws)
            out["gw"], out["dx"] = where.download(GW), where.download(DX)
    for name in ("z", "a"):
        assert rel_err(got[name], want[name]) < 2 * UNIT_ROUNDOFF[half], name
    for name in ("gw", "dx"):
        assert rel_err(got[name], want[name]) < F32, name
    if labels is not None:
        mark = {"implicit": "conv dgrad", "direct": "conv_direct",
                "im2col": "im2col"}[path.split("-")[0]]
        assert mark in " ".join(labels), labels


def test_a_chunks_16_bit_copies_stay_in_their_array(device_name, rng, half, monkeypatch):
    """A convolution's im2col path in chunks on the vendor's GEMM, images and delta float32
    (a conv that BatchNorm reads): each chunk's 16-bit copy of the wide operand (its columns
    from j0 on, at another offset, the leading dimension kept) reads no further than the
    array's end. Reading the view's whole shape read j0 elements past it: an illegal memory
    access on an H100 where that crossed an allocation."""
    bk = precision_backend(device_name, half)
    if getattr(bk, "half_operands", None) is None:
        pytest.skip("only a vendor GEMM of 16-bit inputs (CUDA's) copies the operands")
    C, H, W, N, k, F = 3, 9, 8, 6, 3, 5
    x = rng.standard_normal((C, H, W, N)).astype(np.float32)
    w = rng.standard_normal((F, C * k * k)).astype(np.float32)
    dz = rng.standard_normal((F, H - 2, W - 2, N)).astype(np.float32)
    positions = dz[0].size
    copies, run = [], bk._run

    def spy(kernel, global_size, *args, label=None, **kw):
        if label == f"{half} operands":
            copies.append(args)                     # (y, x, n)
        return run(kernel, global_size, *args, label=label, **kw)
    monkeypatch.setattr(bk, "_run", spy)
    ref = pn.device("cpu", precision=half)
    out = {}
    with pinned_conv(bk, "im2col", monkeypatch) as labels:
        for where in (bk, ref):
            ws = where.empty((C * k * k * -(-positions // 3),))      # three chunks
            DZ, X, Wt = where.upload(dz), where.upload(x), where.upload(w)
            GW = where.upload(np.zeros(w.shape, np.float32))
            where.conv_weight_grad(1.0, DZ, X, 0.0, GW, k, 1, 0, ws)
            DX = where.upload(np.full(x.shape, np.nan, np.float32))
            where.conv_input_grad(DX, Wt, DZ, k, 1, 0, ws)
            out[where] = where.download(GW), where.download(DX)
    assert labels.count("im2col") == 3 and copies
    for y, src, n in copies:
        owner = src if src.base is None else src.base
        assert src.offset + n <= owner.offset + owner.size, (src, n, owner)
    for got, want in zip(out[bk], out[ref]):
        assert rel_err(got, want) < F32


def test_a_convolution_refuses_mixed_outputs(rng, half):
    """A 16-bit a without a 16-bit z to store: refused, naming the call, before the sums
    are written."""
    bk = pn.device("cpu", precision=half)
    x = bk.upload(rng.standard_normal((1, 5, 5, 2)).astype(np.float32))
    w, b = bk.upload(np.ones((2, 9), np.float32)), bk.upload(np.zeros(2, np.float32))
    z = bk.upload(np.full((2, 3, 3, 2), 7.0, np.float32))
    with pytest.raises(ShapeError, match="conv into 16-bit storage"):
        bk.conv("relu", w, x, b, z, stored(bk, np.zeros((2, 3, 3, 2), np.float32)), 3, 1, 0)
    assert np.all(bk.download(z) == 7.0)


@pytest.mark.parametrize("C,H,W,N,pool,stride", [(3, 7, 6, 5, 2, 2), (2, 9, 9, 8, 3, 2),
                                                 (4, 4, 4, 3, 4, 4)])
def test_pools_read_and_store_16_bits(device_name, rng, half, C, H, W, N, pool, stride):
    """maxpool keeps the bits of the maximum it chose (and its index), avgpool rounds the
    same float32 mean as the reference: both the reference's bits; their gradients are
    float32 and unchanged."""
    bk = precision_backend(device_name, half)
    ref = pn.device("cpu", precision=half)
    x = rng.standard_normal((C, H, W, N)).astype(np.float32) * 100
    x.flat[::7] = x.flat[1::7]          # ties: the first maximum wins
    Ho, Wo = conv_out(H, pool, stride, 0), conv_out(W, pool, stride, 0)
    out = {}
    for where in (bk, ref):
        X = stored(where, x)
        A, M = (stored(where, np.zeros((C, Ho, Wo, N), np.float32)) for _ in range(2))
        idx = where.upload(np.zeros((C, Ho, Wo, N), np.int32))
        where.maxpool(A, idx, X, pool, stride)
        where.avgpool(M, X, pool, stride)
        out[where] = where.download(A), where.download(idx), where.download(M)
    for name, got, want in zip(("max", "idx", "mean"), out[bk], out[ref]):
        assert np.array_equal(got, want), name
    assert np.array_equal(from_storage(out[bk][0], half),
                          from_storage(bk.download(stored(bk, x)), half).reshape(-1)[
                              out[bk][1]])
    with pytest.raises(ShapeError, match="stored alike"):
        bk.avgpool(bk.upload(np.zeros((C, Ho, Wo, N), np.float32)), stored(bk, x), pool,
                   stride)


@pytest.mark.parametrize("rate", [0.0, 0.3])
def test_dropout_and_copy_keep_16_bits(device_name, rng, half, rate):
    """Dropout of 16-bit inputs stores each kept one scaled and rounded (the reference's
    within one unit where its float32 product rounds otherwise: it divides where the kernels
    multiply by the scale), dropped ones as zeros; copy keeps the bits."""
    bk = precision_backend(device_name, half)
    ref = pn.device("cpu", precision=half)
    x = rng.standard_normal(3001).astype(np.float32)
    key = np.array([12345], np.int32)
    out = {}
    for where in (bk, ref):
        X, Y, C = (stored(where, v) for v in (x, np.zeros_like(x), np.zeros_like(x)))
        where.dropout(Y, X, where.upload(key), rate)
        where.copy(X, C)
        out[where] = values(where, Y), where.download(C), where.download(X)
    (y, c, xs), (y_ref, _, _) = out[bk], out[ref]
    assert np.array_equal(c, xs)
    assert np.array_equal(y == 0, y_ref == 0)
    assert close_values(y, y_ref, half, 0)
    if rate == 0:
        assert np.array_equal(y, from_storage(xs, half))


# -- BatchNorm and Residual blocks ----------------------------------------------------------

@pytest.mark.parametrize("kind", ["linear", "relu", "tanh"])
@pytest.mark.parametrize("rows,n", [(1, 2), (3, 333), (17, 2049)])
def test_batchnorm_reads_and_stores_16_bits(device_name, rng, half, kind, rows, n):
    """batchnorm_train and batchnorm_infer with x, z and a in 16 bits: the statistics from
    x's values in float32 (F32 of the reference's), z and f(z) rounded as they are stored;
    batchnorm_grad reads the 16-bit x and writes float32 gradients, into a new dx, over dz
    and without dx."""
    from test_batchnorm import grad_scales
    bk, ref = precision_backend(device_name, half), pn.device("cpu", precision=half)
    x = (3 * rng.standard_normal((rows, n)) + 1).astype(np.float32)
    gamma, beta = (1 + 0.5 * rng.standard_normal(rows)).astype(np.float32), \
        rng.standard_normal(rows).astype(np.float32)
    running = [rng.standard_normal(rows).astype(np.float32),
               (0.5 + rng.random(rows)).astype(np.float32)]
    dz = rng.standard_normal((rows, n)).astype(np.float32)
    out = {}
    for where in (bk, ref):
        X, Z, A, Zi, Ai = (stored(where, v) for v in (x,) + (np.zeros_like(x),) * 4)
        M, S = where.zeros(rows), where.zeros(rows)
        RM, RV = where.upload(running[0]), where.upload(running[1])
        G, B = where.upload(gamma), where.upload(beta)
        where.batchnorm_train(kind, Z, A, M, S, X, G, B, RM, RV, 1e-5, 0.1)
        where.batchnorm_infer(kind, Zi, Ai, X, G, B, RM, RV, 1e-5)
        grads = []
        for dx in ("new", "dz", None):
            DZ, DG, DB = where.upload(dz), where.zeros(rows), where.zeros(rows)
            DX = {"new": where.zeros((rows, n)), "dz": DZ, None: None}[dx]
            where.batchnorm_grad(DX, DG, DB, DZ, X, G, M, S, 0.5, 0.0)
            grads.append([None if DX is None else where.download(DX), where.download(DG),
                          where.download(DB)])
        out[where] = ([values(where, v) for v in (Z, A, Zi, Ai)],
                      [where.download(v) for v in (M, S, RM, RV)], grads)
    (outs, stats, grads), (outs_ref, stats_ref, grads_ref) = out[bk], out[ref]
    for name, got, want in zip(("mean", "inv_std", "running_mean", "running_var"), stats,
                               stats_ref):
        assert rel_err(got, want, np.linalg.norm(want) + 1) < F32, name
    xs = values(bk, stored(bk, x))
    terms = np.abs(gamma * stats_ref[1])[:, None] * (np.abs(xs) + np.abs(stats_ref[0])[:, None]) \
        + np.abs(beta)[:, None]
    for name, got, want in zip(("z", "a", "z infer", "a infer"), outs, outs_ref):
        assert close_values(got, want, half, terms), name
    scales = grad_scales(dz.astype(np.float64), xs.astype(np.float64), gamma, stats_ref[0],
                         stats_ref[1], 0.5, 0.0, (0, 0))
    for way, got, want in zip(("new", "dz", None), grads, grads_ref):
        for name, g, w, scale in zip(("dx", "dgamma", "dbeta"), got, want, scales):
            if w is None:
                assert g is None
            else:
                assert rel_err(g, w, scale) < F32, (way, name)


@pytest.mark.parametrize("kind", ["linear", "relu", "tanh", "gelu"])
def test_batchnorm_delta_reads_16_bits(device_name, rng, half, kind):
    """batchnorm_delta from a 16-bit x (z made again in float32 from its values) and a
    float32 dL/da into a float32 delta, apart and over dL/da."""
    bk, ref = precision_backend(device_name, half), pn.device("cpu", precision=half)
    rows, n = 5, 301
    x = (3 * rng.standard_normal((rows, n)) + 1).astype(np.float32)
    gamma, beta, mean = (rng.standard_normal(rows).astype(np.float32) for _ in range(3))
    inv_std = (0.5 + rng.random(rows)).astype(np.float32)
    da = rng.standard_normal((rows, n)).astype(np.float32)
    out = {}
    for where in (bk, ref):
        X, DA = stored(where, x), where.upload(da)
        params = [where.upload(v) for v in (gamma, beta, mean, inv_std)]
        D = where.zeros((rows, n))
        where.batchnorm_delta(kind, D, DA, X, *params)
        where.batchnorm_delta(kind, DA, DA, X, *params)
        out[where] = where.download(D), where.download(DA)
    for got, want in zip(out[bk], out[ref]):
        assert rel_err(got, want, np.linalg.norm(da)) < F32


@pytest.mark.parametrize("kind", ["linear", "relu", "tanh", "gelu"])
def test_a_residual_sum_in_16_bits(device_name, rng, half, kind):
    """add_activation on 16-bit z, x and a: z + x and f(z + x) from the float32 sum, each
    rounded as it is stored; activation_grad from a 16-bit z into a float32 delta, over da
    and apart, z unchanged."""
    bk, ref = precision_backend(device_name, half), pn.device("cpu", precision=half)
    z, x = (rng.standard_normal((7, 301)).astype(np.float32) for _ in range(2))
    da = rng.standard_normal((7, 301)).astype(np.float32)
    out = {}
    for where in (bk, ref):
        Z, X, A = stored(where, z), stored(where, x), stored(where, np.zeros_like(z))
        where.add_activation(kind, Z, X, A)
        DA, D = where.upload(da), where.zeros(da.shape)
        where.activation_grad(kind, Z, DA, D)
        stored_z = where.download(Z)
        where.activation_grad(kind, Z, DA, DA)
        assert np.array_equal(where.download(Z), stored_z)
        out[where] = values(where, Z), values(where, A), where.download(D), where.download(DA)
    (zs, a, d, d_over), (zs_ref, a_ref, d_ref, _) = out[bk], out[ref]
    assert close_values(zs, zs_ref, half, 0)            # the same float32 sum, rounded
    assert close_values(a, a_ref, half, 1e-6 / F32)
    assert np.array_equal(d, d_over)
    # f' from the device's math library, at the same stored z where both stored it alike
    same = zs == zs_ref
    assert np.all(np.abs(d - d_ref)[same] <= 1e-6 * np.abs(da)[same] + F32 * np.abs(d_ref)[same])


def test_16_bit_batchnorm_and_sums_refuse_mixed_storage(rng, half):
    bk = pn.device("cpu", precision=half)
    half16, real = bk.empty((3, 4), bk.storage_dtype), np.zeros((3, 4), np.float32)
    rows = [np.ones(3, np.float32) for _ in range(6)]
    with pytest.raises(ShapeError, match="stored alike"):
        bk.batchnorm_train("relu", half16, half16, *rows[:2], real, *rows[2:], 1e-5, 0.1)
    with pytest.raises(ShapeError, match="stored alike"):
        bk.batchnorm_infer("relu", real, half16, half16, *rows[:4], 1e-5)
    with pytest.raises(ShapeError, match="stored alike"):
        bk.add_activation("relu", half16, real, half16)
    with pytest.raises(ShapeError, match="gradients are float32"):
        bk.batchnorm_grad(None, rows[0], rows[1], half16, half16, *rows[2:5], 1.0, 0.0)
    with pytest.raises(ShapeError, match="gradients are float32"):
        bk.activation_grad("relu", half16, real, half16)


# -- networks --------------------------------------------------------------------------------

def layout(net):
    """(half_in, half_out, half_grad) of each layer, and where the layers' sums and
    gradients go: (half_slot, grad_slot) of each 16-bit layer (half_out or half_grad)."""
    flags = [(l.half_in, l.half_out, l.half_grad) for l in net.layers]
    slots = [(l.half_slot if l.half_out else None, l.grad_slot if l.half_grad else None)
             for l in net.layers]
    return flags, slots


def test_which_arrays_a_network_stores_in_16_bits():
    """The batch where a Dense, Conv2D, BatchNorm or Residual block reads it first, and each
    one's outputs where another reads them, looking through the layers that store their
    output as their input is (Flatten, the pools, Dropout); not what the loss or a block
    with other layers inside reads; nothing in fp32."""
    T, F = True, False
    mlp = pn.Sequential([pn.Dense(8, "relu"), pn.Dense(6, "relu"), pn.Dropout(0.5),
                         pn.Dense(5, "relu"), pn.Dense(3, "softmax")], (10,),
                        device="cpu", precision="bf16")
    assert mlp.plan.half_x
    assert layout(mlp) == ([(T, T, F), (T, T, T), (T, T, T), (T, T, T), (T, F, T)],
                           [(0, None), (0, 0), (0, 0), (0, 0), (None, 0)])
    # a pool reads dL/da from one products buffer while it writes dL/da_prev into the other
    cnn = pn.from_description("conv(4, 3, relu) maxpool(2) conv(6, 3, tanh, pad=1) avgpool(2)"
                              " flatten dense(16, relu) dense(10, softmax)", (1, 14, 14),
                              device="cpu", precision="fp16")
    assert cnn.plan.half_x
    assert layout(cnn) == ([(T, T, F), (T, T, T), (T, T, T), (T, T, T), (T, T, T),
                            (T, T, T), (T, F, T)],
                           [(0, None), (1, 0), (1, 1), (0, 1), (0, 0), (0, 0), (None, 0)])
    # BatchNorm and a Residual block of Dense, Conv2D and BatchNorm layers read and store
    # alike: 16 bits between 16-bit layers, every layer inside the block too (one taken from
    # another network included); the sum's gradient stays in the block's buffer while its
    # layers' gradients run in the other, where the shortcut's part joins them
    reused = mlp.layers[1]
    normed = pn.Sequential([pn.Conv2D(4, 3), pn.BatchNorm("relu"), pn.MaxPool2D(2),
                            pn.Flatten(), pn.Residual([reused, pn.Dense(6)], "relu"),
                            pn.Dense(3, "softmax")], (1, 12, 12), device="cpu",
                           precision="bf16")
    assert normed.plan.half_x
    assert layout(normed) == ([(T, T, F)] + [(T, T, T)] * 4 + [(T, F, T)],
                              [(0, None), (0, 0), (1, 0), (1, 1), (0, 1), (None, 0)])
    block = normed.layers[4]
    assert [(l.half_in, l.half_out, l.half_grad, l.half_slot, l.grad_slot)
            for l in block.layers] == [(T, T, T, 1, 1), (T, T, T, 0, 1)]
    # a block with a pool inside is real, and so is what reads it alike (BatchNorm), what
    # the layer before it stores and everything inside it; a block as the last layer is real
    pooled = pn.Sequential([pn.Conv2D(4, 3, activation="relu"),
                            pn.Residual([pn.Conv2D(4, 3, padding=1), pn.MaxPool2D(2)], "relu"),
                            pn.BatchNorm("relu"), pn.Flatten(), pn.Dense(3, "softmax")],
                           (1, 10, 10), device="cpu", precision="fp16")
    assert layout(pooled)[0] == [(T, F, F), (F, F, F), (F, F, F), (F, F, F), (F, F, F)]
    assert not any(l.half_in or l.half_out for _, l in list(pooled.walk())[1:])
    last = pn.Sequential([pn.Dense(8, "relu"), pn.Residual([pn.Dense(8)], "sigmoid")], (5,),
                         loss="binary_cross_entropy", device="cpu", precision="bf16")
    assert last.plan.half_x and layout(last)[0] == [(T, F, F), (F, F, F)]
    nested = pn.Sequential([pn.Dense(6, "relu"), pn.Residual([pn.Residual([pn.Dense(6)])]),
                            pn.Dense(3, "softmax")], (5,), device="cpu", precision="bf16")
    assert layout(nested)[0] == [(T, F, F), (F, F, F), (F, F, F)]
    fp32 = pn.from_description("conv(4, 3, relu) maxpool(2) flatten dense(8, relu) "
                               "dense(3, softmax)", (1, 12, 12), device="cpu")
    assert not fp32.plan.half_x and layout(fp32)[0] == [(F, F, F)] * 5
    # a view of the input (Flatten) is stored as its input is, and looked through
    flat = pn.Sequential([pn.Flatten(), pn.Dense(8, "relu"), pn.Flatten(), pn.Dense(6, "relu"),
                          pn.Dense(3, "softmax")], (2, 5, 1), device="cpu", precision="bf16")
    assert flat.plan.half_x
    assert layout(flat)[0] == [(T, T, F), (T, T, F), (T, T, T), (T, T, T), (T, F, T)]
    # layers taken into another network take that network's places
    again = pn.Sequential(mlp.layers[4:], (5,), device="cpu", precision="fp16")
    assert layout(again)[0] == [(T, F, F)]
    again.fit(np.zeros((8, 5), np.float32), np.zeros(8, np.int64), epochs=1, batch_size=4)


def test_batchnorm_or_a_block_first_reads_the_batch_as_it_came():
    """BatchNorm put first normalizes raw features, which 16 bits would round away (bf16
    steps by 4 near 1000): there the batch stays float32, and so do BatchNorm and a block
    that read it; the layers after them store 16 bits as ever. Its batch statistics are
    then fp32's."""
    T, F = True, False
    rng = np.random.default_rng(5)
    x = (1000 + rng.standard_normal((64, 6))).astype(np.float32)
    y = rng.integers(0, 3, 64)
    means = {}
    for precision in ("bf16", "fp32"):
        net = pn.Sequential([pn.BatchNorm(), pn.Dense(8, "relu"), pn.Dense(3, "softmax")], (6,),
                            device="cpu", precision=precision, loss_scale=None)
        net.train_batch(x, y, pn.SGD(0.01))
        means[precision] = net.get_weights()["0.running_mean"]
        if precision == "bf16":
            assert not net.plan.half_x
            assert layout(net)[0] == [(F, F, F), (F, T, F), (T, F, T)]
    np.testing.assert_allclose(means["bf16"], means["fp32"], rtol=1e-6)
    block = pn.Sequential([pn.Residual([pn.Conv2D(2, 3, padding=1)], "relu"),
                           pn.Conv2D(3, 3, activation="relu"), pn.Flatten(),
                           pn.Dense(3, "softmax")], (2, 6, 6), device="cpu", precision="fp16")
    assert not block.plan.half_x
    assert layout(block)[0] == [(F, F, F), (F, T, F), (T, T, T), (T, F, T)]


def test_the_plan_counts_16_bit_storage():
    """A wide MLP's batch buffers in bf16 take under three quarters of fp32's: the batch and
    the hidden layers' one buffer each (relu: a over z) in 2 bytes, the output's z and a in
    4, and the float32 products buffer (the largest hidden layer's sums, which grows with
    the batch as they do) in 4."""
    m, plans, texts = 256, {}, {}
    for name in ("fp32", "bf16"):
        net = pn.mlp((1000,), 10, hidden=(500, 100), device="cpu", precision=name)
        plan = net.memory_plan(m)
        plans[name] = {(b.owner, b.name): b for b in plan.buffers}
        texts[name] = {line.split()[1]: line.split()[-3] for line in str(plan).splitlines()
                       if line.split()[1:2] in (["_x"], ["_products"])}
    assert texts == {"fp32": {"_x": "f32"}, "bf16": {"_x": "bf16", "_products": "f32"}}
    bf16, fp32 = plans["bf16"], plans["fp32"]
    assert bf16["network", "_x"].nbytes == 1000 * m * 2 == fp32["network", "_x"].nbytes // 2
    assert bf16["network", "_products"].nbytes == 500 * m * 4
    assert ("network", "_products") not in fp32
    hidden = [key for key in bf16 if key[1] in ("_z", "_a")]
    assert sum(bf16[k].nbytes for k in hidden) == (500 + 100 + 2 * 10 * 2) * m * 2
    batch = lambda plan: sum(b.nbytes for b in plan.values() if b.kind == "batch")
    assert bf16["network", "_products"].kind == "batch"
    assert batch(bf16) < 0.75 * batch(fp32)


def test_a_cnns_plan_counts_16_bit_activations():
    """LeNet in bf16: the batch, both convolutions' one buffer each (relu: a over z) and
    the pool's output in 2 bytes (half fp32's), the pool's indices as they were, and the two float32 products buffers,
    each as large as the largest dL/da it takes: the pool's output (buffer 0, where the
    Dense writes dL/da_prev) and conv2's (buffer 1, where the pool writes dL/dx, and conv2
    dL/da_prev for conv1)."""
    m, plans = 64, {}
    for name in ("fp32", "bf16"):
        plan = pn.models.lenet(device="cpu", precision=name).memory_plan(m)
        plans[name] = {(b.owner, b.name): b for b in plan.buffers}
    bf16, fp32 = plans["bf16"], plans["fp32"]
    halved = [key for key in fp32 if key[1] in ("_x", "_z", "_a")
              and not key[0].startswith("Dense")]
    assert len(halved) == 1 + 2 * 2 + 1
    assert [key[0] for key in halved if key not in bf16] == \
        [key[0] for key in halved if key[1] == "_a" and key[0].startswith("Conv2D")]
    for key in (key for key in halved if key in bf16):
        assert bf16[key].dtype == np.uint16 and 2 * bf16[key].nbytes == fp32[key].nbytes, key
    kept = [key for key in fp32 if key[1] == "_idx"
            or key[0].startswith("Dense") and key[1] in ("_z", "_a")]
    assert len(kept) == 3 and all(bf16[key].nbytes == fp32[key].nbytes for key in kept)
    assert bf16["network", "_products"].nbytes == 32 * 12 * 12 * m * 4
    assert bf16["network", "_products1"].nbytes == 32 * 24 * 24 * m * 4
    assert not any(key[1].startswith("_products") for key in fp32)
    batch = lambda plan: sum(b.nbytes for b in plan.values() if b.kind == "batch")
    assert batch(bf16) < 0.9 * batch(fp32)


def test_the_batch_is_laid_out_in_16_bits(device_name, rng, half):
    """Every way a batch reaches the device (a plain write, the staging lane, the gather of
    a training set held on the device) stores it rounded."""
    bk = precision_backend(device_name, half)
    net = pn.Sequential([pn.Dense(7, "relu"), pn.Dense(3, "softmax")], (45,), device=bk)
    for m in (5, 300):
        x = rng.standard_normal((m, 45)).astype(np.float32) * 100
        net.plan.upload(x, wait=True)
        assert np.array_equal(values(bk, net.plan.x), round_to(x.T.copy(), half)), m
    x = rng.standard_normal((40, 45)).astype(np.float32)
    y = rng.integers(0, 3, 40).astype(np.int32)
    net.plan.bind(16)
    idx = rng.permutation(40)[:16].astype(np.int32)
    bk.gather_batch(net.plan.x, bk.upload(x), net.plan.y, bk.upload(y), bk.upload(idx))
    assert np.array_equal(values(bk, net.plan.x), round_to(x[idx].T.copy(), half))
    # float targets (MSE, binary cross-entropy) gather apart: the inputs by gather
    out = bk.empty((45 * 20,), bk.storage_dtype)
    bk.write(out, np.zeros(45 * 20, np.float32))
    bk.gather(bk.view(out, (45, 16)), bk.upload(x), bk.upload(idx))
    got = values(bk, out)
    assert np.array_equal(got[:45 * 16].reshape(45, 16), round_to(x[idx].T.copy(), half))
    assert not got[45 * 16:].any(), "gather wrote past its output"


@pytest.mark.parametrize("kind", ["conv", "dense"])
def test_a_16_bit_resnets_step_is_fp32s_within_its_rounding(half, kind):
    """One step of a ResNet (identity and projection blocks, BatchNorm with and without an
    activation; of convolutions, or of Dense layers over features) on the reference, its
    input already 16-bit: each parameter's update within 10 units of the precision of fp32's
    (the activations round where they are stored: 3 units measured), relative to its size
    plus a hundredth of the whole update's. This holds the backward's logic, which every
    backend shares, to fp32's: a block that drops its shortcut's gradient, or a BatchNorm
    that forgets f', is 100 to 1000 times off."""
    rng = np.random.default_rng(0)
    if kind == "conv":
        shape, layers = (1, 12, 12), lambda: pn.models.parse(
            "conv(8, 3, pad=1) batchnorm(tanh) residual(conv(8, 3, pad=1) batchnorm(tanh) "
            "conv(8, 3, pad=1) batchnorm, tanh) residual(conv(12, 3, stride=2, pad=1) "
            "batchnorm(tanh) conv(12, 3, pad=1) batchnorm, tanh) globalavgpool "
            "dense(4, softmax)")
    else:
        shape, layers = (20,), lambda: [
            pn.Dense(16, "tanh"), pn.BatchNorm("tanh"),
            pn.Residual([pn.Dense(16, "tanh"), pn.BatchNorm(), pn.Dense(16)], "tanh"),
            pn.Residual([pn.Dense(12, "tanh"), pn.BatchNorm("tanh")]), pn.Dense(4, "softmax")]
    x = round_to(rng.standard_normal((64, *shape)).astype(np.float32), half)
    y = rng.integers(0, 4, 64)
    steps = {}
    for precision in (half, "fp32"):
        net = pn.Sequential(layers(), shape, device="cpu", precision=precision, seed=3,
                            loss_scale=None)
        assert all(l.half_out for _, l in list(net.walk())[:-1]) == (precision == half)
        before = net.get_weights()
        net.train_batch(x, y, pn.SGD(0.1))
        steps[precision] = {k: w - before[k] for k, w in net.get_weights().items()
                            if "running" not in k}
    whole = np.sqrt(sum(np.sum(d * d) for d in steps["fp32"].values()))
    for name, want in steps["fp32"].items():
        err = np.linalg.norm(steps[half][name] - want) / (np.linalg.norm(want) + 0.01 * whole)
        assert err < 10 * UNIT_ROUNDOFF[half], name


CNN16 = ("conv(4, 3, relu, pad=1) maxpool(2) conv(6, 3, tanh) avgpool(2) dropout(0.25) "
         "flatten dense(16, relu) dense(4, softmax)")
# BatchNorm, a block with the identity shortcut and one with a projection
RESNET16 = ("conv(8, 3, pad=1) batchnorm(relu) residual(conv(8, 3, pad=1) batchnorm(relu) "
            "conv(8, 3, pad=1) batchnorm, relu) residual(conv(12, 3, stride=2, pad=1) "
            "batchnorm(tanh) conv(12, 3, pad=1) batchnorm, relu) globalavgpool "
            "dense(4, softmax)")


@pytest.mark.parametrize("activation", ["relu", "tanh", "flatten", "cnn", "resnet"])
def test_a_16_bit_network_trains_as_the_reference_does(device_name, rng, half, activation):
    """Same seed, same batches: a device's losses and weights stay the reference's in the
    same precision (where a sum's order differs, a stored value may round the other way,
    which the tolerance allows), and near fp32's without being them. tanh's f' is taken at
    the stored z, relu's at a value that rounding does not change. The CNN stores every
    activation in 16 bits, through both products buffers, and so does the ResNet, its
    BatchNorm layers and Residual blocks included."""
    bk = precision_backend(device_name, half)
    images = activation in ("cnn", "resnet")
    x = rng.standard_normal((256, 144 if images else 30)).astype(np.float32)
    y = (x[:, :10] @ rng.standard_normal((10, 4))).argmax(1)
    if activation == "flatten":
        x = x.reshape(256, 3, 5, 2)
    if images:
        x = x.reshape(256, 1, 12, 12)
    runs = []
    for where in (bk, pn.device("cpu", precision=half), pn.device(device_name)):
        if activation == "flatten":         # Keras's way: images flattened first
            net = pn.from_description("flatten dense(48, tanh) flatten dense(24, relu) "
                                      "dense(4, softmax)", (3, 5, 2), device=where, seed=3)
        elif images:
            net = pn.from_description(CNN16 if activation == "cnn" else RESNET16,
                                      (1, 12, 12), device=where, seed=3)
            assert all(l.half_out for _, l in list(net.walk())[:-1]) == \
                (where.precision == half)
        else:
            net = pn.mlp((30,), 4, hidden=(48, 24), activation=activation, device=where,
                         seed=3)
        assert net.plan.half_x == (where.precision == half)
        # (BatchNorm spreads a rounding that went the other way over its whole channel:
        # after 8 steps a ResNet's smallest parameters differ between the reference and a
        # device by half of what fp16 and fp32 do, after 2 by a tenth)
        loss = net.fit(x, y, epochs=1 if activation == "resnet" else 2,
                       batch_size=128 if activation == "resnet" else 64, shuffle=False,
                       optimizer=pn.SGD(0.05, 0.9))["loss"]
        runs.append((np.array(loss), net.get_weights()))
    (got, w_got), (want, w_want), (fp32, _) = runs
    assert np.all(np.abs(got - want) <= 1e-3 * want)
    for name, w in w_want.items():      # (a bias before BatchNorm stays near 0: its noise)
        assert rel_err(w_got[name], w, max(np.linalg.norm(w), 1e-4 * np.sqrt(w.size))) \
            < 1e-2, name
    assert np.all(np.abs(got - fp32) < 20 * UNIT_ROUNDOFF[half] * fp32)
    assert not np.array_equal(got, fp32)


def test_sign_only_activations_keep_one_buffer_in_16_bits(device_name, half, monkeypatch):
    """In 16-bit storage a relu layer's z and a are one buffer (f' from the sign a keeps),
    so is a relu Residual block's output and its sum, but not the block's last inner layer,
    over whose output the sum is made; a step trains as with two buffers each, to the bit
    on the reference."""
    from portanet.layers import Dense, Residual

    def make():
        return pn.Sequential([
            pn.Conv2D(4, 1, activation="relu"),         # (each layer's repr its own)
            pn.Residual([pn.Conv2D(5, 3, activation="relu", padding=1),
                         pn.Conv2D(4, 3, activation="relu", padding=1)], activation="relu"),
            pn.Flatten(), pn.Dense(8, "relu"), pn.Dense(3, "softmax")],
            input_shape=(1, 6, 6), device=device_name, precision=half, seed=5, loss_scale=None)
    precision_backend(device_name, half)       # a skip where the device lacks it
    net = make()
    names = {}
    for b in net.memory_plan(8).buffers:
        names.setdefault(b.owner, set()).add(b.name)
    conv, block, _, dense, out = net.layers
    assert "_a" not in names[repr(conv)] and "_a" not in names[repr(dense)]
    assert "_a" not in names.get(repr(block), ()) and "_a" not in names[repr(block.layers[0])]
    assert {"_z", "_a"} <= names[repr(block.layers[1])] and {"_z", "_a"} <= names[repr(out)]
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 1, 6, 6)).astype(np.float32), np.arange(8) % 3
    net.train_batch(x, y)
    ours = net.get_weights()
    linear_only = property(lambda self: self.activation == "linear")
    monkeypatch.setattr(Dense, "one_buffer", linear_only)
    monkeypatch.setattr(Residual, "one_buffer", linear_only)
    twin = make()
    assert "_a" in {b.name for b in twin.memory_plan(8).buffers if b.owner == repr(conv)}
    twin.train_batch(x, y)
    theirs = twin.get_weights()
    for name, w in ours.items():
        if device_name == "cpu":
            assert np.array_equal(w, theirs[name]), name
        else:
            assert rel_err(w, theirs[name], np.linalg.norm(theirs[name]) + 1) < 1e-6, name
