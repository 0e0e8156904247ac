"""Precisions (portanet/precision.py): the rounding the reference emulates, the backends
each precision gets, and every device's products in tf32, bf16 and fp16 against the
emulating reference.

Tolerances per precision (normwise, against a float64 product of the same inputs):
- fp32: F32 (conftest).
- tf32, bf16, fp16: F32 against the product of the inputs rounded to the precision (its
  products are exact in float32 and its sums run in float32). Every product of ours rounds
  its inputs as the reference does (to nearest, ties to even; fp16 to half's range too):
  mma.cu, our FFMA kernels and conv_direct through prelude.h's OPERAND, the 16-bit inputs
  of cuBLAS's bf16 and fp16 GEMMs and of wgmma.cu's through its half_bits. cuBLAS's TF32
  rounds so too (measured: docs/precision.md), but computes degenerate products (K = 1) in
  float32: its paths may match either product, and nothing in between. Four units of the
  precision's rounding bound how far the rounded product is from float32's.
"""
import math

import numpy as np
import pytest

import portanet as pn
from portanet import backends, precision
from portanet.errors import InputError, PrecisionError
from portanet.precision import UNIT_ROUNDOFF, round_to

from conftest import F32, gemm_scale, get_backend, precision_backend, rel_err

LOWER = ("tf32", "bf16", "fp16")        # the precisions below float32


@pytest.fixture(params=LOWER)
def lower(request):
    return request.param


# -- rounding -------------------------------------------------------------------------------

def test_round_to_tf32_goes_to_nearest_and_ties_to_even():
    u = 2.0 ** -10                                  # TF32's unit in the last place at 1
    x = np.array([1, 1 + u / 2, 1 + 3 * u / 2, 1 + u / 2 + 2 ** -20, -(1 + u / 2),
                  np.inf, -np.inf, np.finfo(np.float32).max, 0.0, -0.0], np.float32)
    want = np.array([1, 1, 1 + 2 * u, 1 + u, -1, np.inf, -np.inf, np.inf, 0.0, -0.0])
    with np.errstate(over="ignore"):
        got = round_to(x, "tf32")
    assert got.dtype == np.float32
    assert np.array_equal(got, want.astype(np.float32))
    assert np.signbit(got[-1])
    assert np.isnan(round_to(np.array([np.nan], np.float32), "tf32")[0])


@pytest.mark.parametrize("name", ["tf32", "bf16", "fp16"])
def test_round_to_is_within_half_a_unit_and_idempotent(name, rng):
    x = (rng.standard_normal(10000) * np.exp(rng.uniform(-4, 4, 10000))).astype(np.float32)
    x = x[np.abs(x) > 1e-3]                 # fp16's normal numbers (no subnormals)
    r = round_to(x, name)
    err = np.abs(r.astype(np.float64) - x) / np.abs(x)
    assert err.max() <= UNIT_ROUNDOFF[name] * (1 + 1e-6)
    assert err.max() > UNIT_ROUNDOFF[name] / 2           # it does round, to that precision
    assert np.array_equal(round_to(r, name), r)
    mantissa = precision.PRECISIONS[name].mantissa
    assert not (r.view(np.uint32) & np.uint32((1 << (23 - mantissa)) - 1)).any()


def test_round_to_refuses_what_it_would_round_twice():
    with pytest.raises(InputError, match="float32 arrays, not float64"):
        round_to(np.ones(3), "tf32")                # float64: rounded to float32 first
    with pytest.raises(InputError, match="unknown precision 'tf31'"):
        round_to(np.ones(3, np.float32), "tf31")


# -- choosing a precision -----------------------------------------------------------------

def test_a_backend_per_device_dtype_and_precision():
    fp32, tf32 = pn.device("cpu"), pn.device("cpu", precision="tf32")
    assert fp32.precision == "fp32" and tf32.precision == "tf32" and fp32 is not tf32
    assert pn.device("cpu", precision="TF32") is tf32
    assert pn.device("cpu", np.float64).precision == "fp64"
    assert pn.device(tf32) is tf32 and pn.device(tf32, precision="tf32") is tf32
    with pytest.raises(PrecisionError, match="made for tf32, not fp32"):
        pn.device(tf32, precision="fp32")


@pytest.mark.parametrize("precision_name,dtype,said", [
    ("fp8", np.float32, r"not one of fp32 \(the default\), tf32, bf16, fp16 \(or fp64, a "
                        r"float64 network's\)"),
    ("tf32", np.float64, "float64 networks compute in fp64 only"),
    ("fp64", np.float32, r"give dtype='float64' \(the command line trains float32 networks\)"),
    ("double", np.float32, "give dtype='float64'"),
])
def test_a_precision_that_is_not_one_is_refused(precision_name, dtype, said):
    with pytest.raises(InputError, match=said):
        pn.device("cpu", dtype, precision=precision_name)


def test_a_device_without_the_precision_says_what_it_has():
    for spec in ("opencl:pocl", "opencl:intel"):
        try:
            has = pn.device(spec).precisions
        except pn.DeviceError:
            continue
        for name in set(LOWER) - set(has):
            where = "OpenCL devices with half arithmetic" if name == "fp16" else "CUDA devices"
            with pytest.raises(PrecisionError, match=rf"OpenCL\) does not compute in {name}: "
                                                     rf"it has {', '.join(has)}; {name} runs on "
                                                     rf"{where}"):
                pn.device(spec, precision=name)


def test_opencl_devices_compute_in_fp16_where_they_have_half_arithmetic():
    """fp16 on OpenCL where the device reports cl_khr_fp16 (Intel's CPU runtime does, PoCL
    3 and Oclgrind do not), with our own kernels: CLBlast's HGEMM would sum in half."""
    from portanet.backends import opencl
    try:
        listed = opencl.enumerate_devices()
    except pn.DeviceError as e:
        pytest.skip(str(e))
    seen = 0
    for spec, _ in listed:
        try:
            bk = pn.device(spec)
        except pn.DeviceError:      # a device that cannot be opened here (its compiler
            continue                # builds nothing): not one whose precisions to check
        half = "cl_khr_fp16" in bk.device.extensions.split()
        assert ("fp16" in bk.precisions) == half
        assert "tf32" not in bk.precisions and "bf16" not in bk.precisions
        if half:
            assert not pn.device(spec, precision="fp16").vendor_gemm
            seen += 1
    if not seen:
        pytest.skip("no OpenCL device here has cl_khr_fp16")


def test_float64_networks_are_fp64_whatever_the_variable_says(monkeypatch, tmp_path):
    monkeypatch.setenv("PORTANET_PRECISION", "tf32")
    net = pn.mlp((4,), 3, hidden=(5,), device="cpu", dtype="float64")
    assert net.backend.precision == "fp64"
    net.save(tmp_path / "n.safetensors")
    assert pn.load(tmp_path / "n.safetensors", device="cpu",
                   dtype="float64").backend.precision == "fp64"
    with pytest.raises(InputError, match="float64 networks compute in fp64 only"):
        pn.mlp((4,), 3, device="cpu", dtype="float64", precision="tf32")


def test_networks_take_the_precision_or_the_variable(monkeypatch):
    net = pn.mlp((4,), 3, hidden=(5,), device="cpu", precision="tf32")
    assert net.backend.precision == "tf32" and "(float32, tf32)" in net.summary()
    monkeypatch.setenv("PORTANET_PRECISION", "tf32")
    assert pn.lenet(device="cpu").backend.precision == "tf32"
    assert pn.lenet(device="cpu", precision="fp32").backend.precision == "fp32"
    assert pn.lenet(device=pn.device("cpu")).backend.precision == "fp32"    # the backend's
    monkeypatch.setenv("PORTANET_PRECISION", "quarter")
    with pytest.raises(InputError, match="PORTANET_PRECISION='quarter': precision 'quarter' "
                                         "is not one of"):
        pn.mlp((4,), 3, device="cpu")
    monkeypatch.setenv("PORTANET_PRECISION", "half")           # PyTorch's name
    assert pn.mlp((4,), 3, device="cpu").backend.precision == "fp16"


@pytest.mark.parametrize("alias,name", [("half", "fp16"), ("float16", "fp16"),
                                        ("mixed_float16", "fp16"), ("bfloat16", "bf16"),
                                        ("mixed_bfloat16", "bf16"), ("float32", "fp32"),
                                        ("TensorFloat32", "tf32")])
def test_pytorch_and_keras_names_are_taken(alias, name):
    assert pn.mlp((4,), 3, hidden=(5,), device="cpu", precision=alias).backend.precision == name


def test_a_device_without_the_variables_precision_names_the_variable(monkeypatch):
    """Where PORTANET_PRECISION chose the precision a device refuses, the error says so;
    where the caller gave it, the variable is not to blame."""
    try:
        pn.device("opencl:pocl")
    except pn.DeviceError as e:
        pytest.skip(str(e))
    monkeypatch.setenv("PORTANET_PRECISION", "bfloat16")
    with pytest.raises(PrecisionError, match=r"does not compute in bf16.*\(PORTANET_PRECISION="
                                             r"'bfloat16' asked for it: unset it"):
        pn.mlp((4,), 3, device="opencl:pocl")
    with pytest.raises(PrecisionError, match=r"does not compute in bf16") as refused:
        pn.mlp((4,), 3, device="opencl:pocl", precision="bf16")
    assert "PORTANET_PRECISION" not in str(refused.value)


def test_export_computes_nothing_and_takes_no_precision(monkeypatch, tmp_path):
    pytest.importorskip("onnx")
    from click.testing import CliRunner
    from portanet.cli import main
    pn.mlp((4,), 3, hidden=(5,), device="cpu").save(tmp_path / "n.safetensors")
    monkeypatch.setenv("PORTANET_PRECISION", "bf16")
    monkeypatch.setenv("PORTANET_DEVICE", "opencl:pocl")        # which has no bf16
    result = CliRunner().invoke(main, ["export", str(tmp_path / "n.safetensors"),
                                       str(tmp_path / "n.onnx")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "n.onnx").exists()


@pytest.mark.parametrize("first", ["dense", "flatten-dense", "conv", "dropout", "maxpool",
                                   "avgpool", "residual", "residual-projection", "batchnorm",
                                   "residual-batchnorm"])
def test_fp16_refuses_inputs_beyond_half_where_a_product_takes_them(first, rng):
    """In fp16 the first product rounds the input to half: 65520 and above would be inf and
    every output NaN. fit, predict, evaluate and train_batch refuse such inputs where they
    reach a product with their magnitude (through Flatten, Dropout, pooling, into a Residual
    block or past it, through its identity shortcut), naming the range; 65504, half's
    largest, is taken; BatchNorm first takes any.
    NaN is still the finite check's to name."""
    head = {"dense": [], "flatten-dense": [pn.Flatten()], "conv": [pn.Conv2D(2, 3)],
            "dropout": [pn.Dropout(0.2)], "maxpool": [pn.MaxPool2D(2)],
            "avgpool": [pn.AvgPool2D(2)],
            "residual": [pn.Residual([pn.Conv2D(1, 3, padding=1)])],
            "residual-projection": [pn.Residual([pn.BatchNorm(), pn.Conv2D(2, 3, padding=1)])],
            "batchnorm": [pn.BatchNorm()],
            "residual-batchnorm": [pn.Residual([pn.BatchNorm()])]}[first]
    net = pn.Sequential(head + [pn.Flatten(), pn.Dense(3, "softmax")], (1, 4, 4),
                        device="cpu", precision="fp16")
    x, y = rng.standard_normal((6, 1, 4, 4)).astype(np.float32), rng.integers(0, 3, 6)
    x[2, 0, 1, 1] = 65504.0
    net.predict(x)
    nan = x.copy()
    nan[1, 0, 0, 0] = np.nan
    with pytest.raises(InputError, match=r"NaN or inf \(first at sample 1\)"):
        net.evaluate(nan, y)
    x[4, 0, 2, 2:] = -7e4
    if first == "batchnorm":
        # training normalizes with the batch's statistics before any product (the batch
        # stays float32 there); inference's running ones may not describe such data yet
        history = net.fit(x, y, epochs=1, batch_size=6, optimizer=pn.SGD(0.01))
        assert np.isfinite(history["loss"][0])
        assert all(np.all(np.isfinite(w)) for w in net.get_weights().values())
        return
    before = net.get_weights()
    for call in (lambda: net.predict(x), lambda: net.evaluate(x, y),
                 lambda: net.fit(x, y, epochs=1, batch_size=3),
                 lambda: net.train_batch(x, y)):
        with pytest.raises(InputError, match=r"magnitude up to 7e\+04 \(first at sample 4\), "
                                             r"beyond fp16's range.*compute in bf16 or fp32"):
            call()
    assert all(np.array_equal(before[k], w) for k, w in net.get_weights().items())
    net.fit(x / 4, y, epochs=1, batch_size=3)


def test_the_loss_scale_is_seen_without_fit(rng):
    """train_batch's user reads the scale and the steps skipped as GradScaler's get_scale
    gives them: what fit's history says after the same steps; None where the network does
    not scale."""
    assert pn.mlp((4,), 3, hidden=(5,), device="cpu").loss_scale is None
    x, y = rng.standard_normal((8, 4)).astype(np.float32) * 300, rng.integers(0, 3, 8)
    nets = [pn.mlp((4,), 3, hidden=(5,), device="cpu", precision="fp16",
                   loss_scale=pn.LossScale(2.0 ** 24, growth_interval=2)) for _ in range(2)]
    assert nets[0].loss_scale == (2.0 ** 24, 0)
    for _ in range(6):
        nets[0].train_batch(x, y, pn.SGD(0.01))
    history = nets[1].fit(x, y, epochs=6, batch_size=8, optimizer=pn.SGD(0.01), shuffle=False)
    assert sum(history["skipped_steps"]) > 0
    assert nets[0].loss_scale == nets[1].loss_scale == \
        (history["loss_scale"][-1], sum(history["skipped_steps"]))


def test_devices_list_their_precisions():
    found, _ = backends.list_devices()
    assert all("precisions fp32" in description for _, description in found)
    assert "precisions fp32, tf32, bf16, fp16 (emulated)" in dict(found)["cpu"]


def test_a_saved_network_loads_in_another_precision(tmp_path, rng):
    net = pn.mlp((6,), 3, hidden=(5,), device="cpu", precision="tf32")
    net.save(tmp_path / "n.safetensors")
    back = pn.load(tmp_path / "n.safetensors", device="cpu")
    assert back.backend.precision == "fp32"
    for name, w in net.get_weights().items():
        assert np.array_equal(back.get_weights()[name], w)


# -- the reference's emulation ----------------------------------------------------------------

def test_the_reference_rounds_each_products_inputs(rng, lower):
    """cpu in a lower precision: a product of the inputs rounded to it, summed in float32;
    not float32's."""
    m, n, k = 40, 30, 500
    a, b = (rng.standard_normal(s).astype(np.float32) for s in ((m, k), (k, n)))
    exact = a.astype(np.float64) @ b
    rounded = round_to(a, lower).astype(np.float64) @ round_to(b, lower)
    unit = UNIT_ROUNDOFF[lower]
    for trans_a, trans_b in ((False, False), (True, True)):
        bk = pn.device("cpu", precision=lower)
        c = bk.zeros((m, n))
        bk.gemm(1.0, a.T.copy() if trans_a else a, b.T.copy() if trans_b else b, 0.0, c,
                trans_a, trans_b)
        assert rel_err(c, rounded) < F32
        assert unit / 10 < rel_err(c, exact) < 4 * unit    # the precision's error


# -- the kernels' rounding -------------------------------------------------------------------

@pytest.mark.parametrize("name", ["bf16", "fp16"])
def test_the_kernels_16_bit_inputs_are_the_references_bits(device_name, rng, name):
    """prelude.h's half_bits (through operand(), our kernels' rounding), on any device that
    builds our kernels in whatever precision it computes: the bits of round_to's value as
    bfloat16 or IEEE half, for random bit patterns, numbers of every size, ties, half's
    subnormals and its overflow to inf; NaN stays NaN."""
    bk = get_backend(device_name)
    if bk.kind == "cpu" or bk.dtype != np.float32:
        pytest.skip("the reference has no kernels")
    from portanet.backends.gpu import operand_options
    special = np.array([0.0, 1.0, 65504, 65519.99, 65520, 65536, 1e30, 3.4028235e38, np.inf,
                        np.nan, 2 ** -14, 2 ** -14 * (1 - 2 ** -12), 2 ** -24, 2 ** -25,
                        2 ** -25 * 1.0001, 3 * 2 ** -25, 1 + 2 ** -8, 1 + 3 * 2 ** -8,
                        1 + 2 ** -11, 1 + 3 * 2 ** -11, 1.4e-45], np.float32)
    bits = rng.integers(0, 2 ** 32, 20000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    sizes = rng.standard_normal(20000) * 10.0 ** rng.uniform(-9, 6, 20000)
    x = np.concatenate([special, -special, bits, sizes.astype(np.float32)])
    kernel = bk._build("elementwise", "half_operands", operand_options(name))
    out = bk.empty((x.size,), np.uint16)
    bk._run(kernel, (x.size,), out, bk.upload(x), x.size)
    got = bk.download(out)
    if name == "fp16":
        value = got.view(np.float16).astype(np.float32)
        want = round_to(x, "fp16").astype(np.float16).view(np.uint16)
    else:
        value = (got.astype(np.uint32) << 16).view(np.float32)
        want = (round_to(x, "bf16").view(np.uint32) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    assert np.isnan(value[nan]).all()
    assert np.array_equal(got[~nan], want[~nan])


# -- the devices' products in each precision ----------------------------------------------------

GEMM_SHAPES = [(1, 1, 1), (7, 129, 1000), (129, 7, 1), (33, 65, 17), (130, 257, 129),
               (300, 260, 4500), (130, 257, 136)]     # K a multiple of 8: wgmma.cu takes it


def gemm_paths(bk):
    """Each of the backend's GEMM paths in its precision (own: on CUDA our tensor-core
    kernel in tf32, and in bf16 and fp16 on Hopper where K is a multiple of 8; auto may
    take our FFMA tilings, which round their inputs too), and
    whether it may compute a product in float32 instead: cuBLAS's TF32 does for degenerate
    shapes (K = 1, measured on an H100), and auto may route to it; its bf16 and fp16
    GEMMs take inputs we rounded."""
    if bk.kind == "cpu":
        return [("reference", False)]
    tf32 = bk.precision == "tf32"
    return [("own", False)] + ([("vendor", tf32), ("auto", tf32)] if bk.vendor_gemm else [])


@pytest.mark.parametrize("m,n,k", GEMM_SHAPES)
@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (False, True), (True, False),
                                             (True, True)])
def test_gemm_in_lower_precisions(device_name, rng, lower, m, n, k, trans_a, trans_b):
    bk = precision_backend(device_name, lower)
    a = rng.standard_normal((k, m) if trans_a else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32)
    c = rng.standard_normal((m, n)).astype(np.float32)
    op_a, op_b = (a.T if trans_a else a), (b.T if trans_b else b)
    rounded = round_to(op_a, lower).astype(np.float64) @ round_to(op_b, lower)
    exact = op_a.astype(np.float64) @ op_b
    for alpha, beta in ((1.0, 0.0), (-0.7, 0.3)):
        scale = gemm_scale(alpha, op_a, op_b, beta, c)
        for path, or_float32 in gemm_paths(bk):
            with bk.pinned(gemm=path):
                C = bk.upload(c)
                if beta == 0:
                    bk.write(C, np.full((m, n), np.nan, np.float32))   # beta 0 does not read c
                bk.gemm(alpha, bk.upload(a), bk.upload(b), beta, C, trans_a, trans_b)
                got = bk.download(C)
                err = rel_err(got, alpha * rounded + beta * c, scale)
                if or_float32:
                    err = min(err, rel_err(got, alpha * exact + beta * c, scale))
                assert err < F32, path


@pytest.mark.parametrize("m,n,k,offsets", [(37, 41, 53, (3, 5001, 2999)),
                                            (36, 44, 52, (4, 5004, 3000)),    # 16-byte copies
                                            (36, 44, 56, (5, 5003, 3000))])   # wgmma.cu
def test_gemm_in_lower_precisions_on_views(device_name, rng, lower, m, n, k, offsets):
    """Operands at offsets inside one buffer, c between them: nothing else written."""
    bk = precision_backend(device_name, lower)
    host = rng.standard_normal(10000).astype(np.float32)
    big = bk.upload(host)
    (oa, ob, oc) = offsets
    a, b, c = bk.view(big, (m, k), oa), bk.view(big, (k, n), ob), bk.view(big, (m, n), oc)
    ref = (round_to(host[oa:oa + m * k], lower).astype(np.float64).reshape(m, k)
           @ round_to(host[ob:ob + k * n], lower).reshape(k, n))
    for path, _ in gemm_paths(bk):
        with bk.pinned(gemm=path):
            bk.gemm(1.0, a, b, 0.0, c)
            assert rel_err(bk.download(c), ref) < F32, path
    rest = bk.download(big)
    rest[oc:oc + m * n] = host[oc:oc + m * n]
    assert np.array_equal(rest, host), "gemm wrote outside its view"


@pytest.mark.parametrize("lower16", ["bf16", "fp16"])
def test_hopper_computes_16_bit_products_on_our_tensor_core_gemm(device_name, rng, lower16,
                                                                  monkeypatch):
    """On compute capability 9.0, bf16 and fp16 products whose K is a multiple of 8 can run
    on wgmma.cu (PORTANET_GEMM=own's GEMM, and one of auto's paths), every tile of c
    written, partial ones too; the others on our FFMA kernel, which rounds alike."""
    bk = precision_backend(device_name, lower16)
    if bk.kind != "cuda" or bk.cc != (9, 0):
        pytest.skip("wgmma.cu runs on Hopper GPUs (compute capability 9.0)")
    assert bk.tensor_gemm
    launched = []
    wgmma = bk._wgmma
    monkeypatch.setattr(bk, "_wgmma", lambda *a, **kw: launched.append(a) or wgmma(*a, **kw))
    with bk.pinned(gemm="own"):
        for (m, n, k), takes in (((300, 520, 264), True), ((129, 257, 4104), True),
                                 ((40, 30, 20), False)):
            a = rng.standard_normal((m, k)).astype(np.float32)
            b = rng.standard_normal((n, k)).astype(np.float32)
            ref = round_to(a, lower16).astype(np.float64) @ round_to(b, lower16).T
            c = bk.upload(np.full((m, n), np.nan, np.float32))
            launched.clear()
            bk.gemm(1.0, bk.upload(a), bk.upload(b), 0.0, c, False, True)
            assert bool(launched) == takes, (m, n, k)
            assert rel_err(bk.download(c), ref) < F32, (m, n, k)


@pytest.mark.parametrize("trans_a", [False, True])
def test_every_path_rounds_ties_to_even(device_name, rng, lower, trans_a):
    """a times the identity is a rounded to the precision, exactly: values half a unit and a
    little more or less above its grid (ties go to the even neighbour), on every path; in
    fp16 half's subnormals too (a multiple of 2^-24, from 2^-14 down)."""
    bk = precision_backend(device_name, lower)
    n = 256
    grid = 2 ** precision.PRECISIONS[lower].mantissa
    units = grid + rng.integers(0, grid, (n, n))          # the grid: mantissa + 1 bits
    nudge = rng.choice([0.5, 0.5, 0.25, 0.75, 0.5 + 2 ** -12, 0.5 - 2 ** -12], (n, n))
    low = -36 if lower == "fp16" else -18                 # fp16: 2^-36 * 2^11 is subnormal
    scale = 2.0 ** rng.integers(low, -2, (n, n)) * rng.choice([-1, 1], (n, n))
    a = ((units + nudge) * scale).astype(np.float32)      # exact: at most 24 significant bits
    want = round_to(a, lower)
    eye = np.eye(n, dtype=np.float32)
    for path, _ in gemm_paths(bk):
        with bk.pinned(gemm=path):
            c = bk.zeros((n, n))
            bk.gemm(1.0, bk.upload(a.T.copy() if trans_a else a), bk.upload(eye), 0.0, c, trans_a)
            assert np.array_equal(bk.download(c), want), path


@pytest.mark.parametrize("kind", ["relu", "sigmoid", "softmax"])
def test_dense_in_lower_precisions(device_name, rng, lower, kind):
    bk, ref_bk = precision_backend(device_name, lower), pn.device("cpu", precision=lower)
    m, n, k = 70, 300, 1100
    w, x = (rng.standard_normal(s).astype(np.float32) / math.sqrt(k) for s in ((m, k), (k, n)))
    b = rng.standard_normal(m).astype(np.float32)
    z_ref, a_ref = np.zeros((m, n), np.float32), np.zeros((m, n), np.float32)
    ref_bk.dense(kind, w, x, b, z_ref, a_ref)
    for path, _ in gemm_paths(bk):
        with bk.pinned(gemm=path):
            Z, A = bk.zeros((m, n)), bk.zeros((m, n))
            bk.dense(kind, bk.upload(w), bk.upload(x), bk.upload(b), Z, A)
            assert rel_err(bk.download(Z), z_ref) < 2 * F32, path
            assert rel_err(bk.download(A), a_ref) < 2 * F32, path


@pytest.mark.parametrize("path", ["implicit", "direct", "im2col"])
def test_convolution_in_lower_precisions(device_name, rng, lower, path):
    """A convolution's three products on each of its paths, against the reference's."""
    bk, ref_bk = precision_backend(device_name, lower), pn.device("cpu", precision=lower)
    C, H, W, N, F, k = 3, 11, 9, 6, 10, 3
    x = rng.standard_normal((C, H, W, N)).astype(np.float32)
    w = rng.standard_normal((F, C * k * k)).astype(np.float32)
    b = rng.standard_normal(F).astype(np.float32)
    dz = rng.standard_normal((F, H, W, N)).astype(np.float32)
    ref = {"z": np.zeros((F, H, W, N), np.float32), "a": np.zeros((F, H, W, N), np.float32),
           "gw": np.zeros_like(w), "dx": np.zeros_like(x)}
    ref_bk.conv("relu", w, x, b, ref["z"], ref["a"], k, 1, 1)
    ref_bk.conv_weight_grad(1.0, dz, x, 0.0, ref["gw"], k, 1, 1)
    ref_bk.conv_input_grad(ref["dx"], w, dz, k, 1, 1)
    with bk.pinned(conv=None if bk.kind == "cpu" else path):
        ws = bk.zeros(C * k * k * H * W * N)
        got = {name: bk.zeros(r.shape) for name, r in ref.items()}
        X, Wt, DZ = bk.upload(x), bk.upload(w), bk.upload(dz)
        bk.conv("relu", Wt, X, bk.upload(b), got["z"], got["a"], k, 1, 1, ws)
        bk.conv_weight_grad(1.0, DZ, X, 0.0, got["gw"], k, 1, 1, ws)
        bk.conv_input_grad(got["dx"], Wt, DZ, k, 1, 1, ws)
        for name, r in ref.items():
            assert rel_err(bk.download(got[name]), r) < 2 * F32, (path, name)


def test_training_in_lower_precisions_follows_fp32_closely(device_name, rng, lower):
    """Same seed, same batches: the losses stay near fp32's, and are not fp32's."""
    bk = precision_backend(device_name, lower)
    x = rng.standard_normal((512, 30)).astype(np.float32)
    y = (x[:, :10] @ rng.standard_normal((10, 4))).argmax(1)
    histories = {}
    for where in (bk, pn.device(device_name)):
        net = pn.mlp((30,), 4, hidden=(64, 32), device=where)
        histories[where.precision] = net.fit(x, y, epochs=3, batch_size=64,
                                             optimizer=pn.SGD(0.05, 0.9))["loss"]
    fp32, low = np.array(histories["fp32"]), np.array(histories[lower])
    assert np.all(np.abs(low - fp32) < 20 * UNIT_ROUNDOFF[lower] * fp32)
    assert not np.array_equal(low, fp32)            # every product rounds, whatever its path


def test_the_memory_plan_counts_the_16_bit_copies(device_name, rng, lower, monkeypatch):
    """Where a vendor GEMM takes 16-bit copies of its inputs (CUDA's bf16 and fp16), the
    plan has room for the largest pair of a training step's products (here dense 1's
    forward: w and the batch), and the copies a step makes fit in it; where nothing is
    copied, there is nothing to plan."""
    bk = precision_backend(device_name, lower)
    net = pn.mlp((300,), 10, hidden=(200,), device=bk)
    plan = {(b.owner, b.name): b for b in net.memory_plan(96).buffers}
    copies = plan.get(("backend", "16-bit operands"))
    if getattr(bk, "half_operands", None) is None:
        assert copies is None
        return
    kept = [10 * 96]        # the last Dense's delta: the batch, z and a are 16-bit already
    assert copies.nbytes == (200 * 300 + 300 * 96 + sum(kept)) * 2
    monkeypatch.setattr(bk, "_half_ws", None, raising=False)   # grown anew
    x, y = rng.standard_normal((96, 300)).astype(np.float32), rng.integers(0, 10, 96)
    with bk.pinned(gemm="vendor"):                      # every product copied
        net.fit(x, y, epochs=1, batch_size=96)
    needed, held, _ = bk.operand_bytes(
        [p for _, layer in net.walk() for p in layer.products(96)], kept)["16-bit operands"]
    assert needed == copies.nbytes and 0 < held <= needed


def test_copies_kept_from_the_forward_serve_the_backward(device_name, rng, lower,
                                                          monkeypatch):
    """Dense keeps its input's 16-bit copy from the forward product for the weight
    gradient, and the delta's from the weight gradient for the input gradient
    (Backend.keep_operands); the kernels that write a hidden layer's output and delta
    write their copies beside them. In 16-bit storage (bf16, fp16) the batch and the hidden
    layers' z and a are 16-bit already, so a step of a 3-layer MLP copies the weights for
    each product and the delta the loss writes (kept for both its products): 6 operands, 7
    without keeping. It computes the same bits either way, steps recorded and replayed
    after it included."""
    bk = precision_backend(device_name, lower)
    if getattr(bk, "half_operands", None) is None:
        pytest.skip(f"{bk.name} copies no operands in {lower}")
    x, y = rng.standard_normal((96, 300)).astype(np.float32), rng.integers(0, 10, 96)
    run, copies, weights = bk._run, [], {}

    def counted(kernel, *args, label=None, **kw):
        copies.append(label == f"{lower} operands")
        return run(kernel, *args, label=label, **kw)
    with bk.pinned(gemm="vendor"):                      # every product copied
        for keep in (True, False):
            if not keep:
                monkeypatch.setattr(bk, "keep_operands", lambda *arrays: None)
            net = pn.mlp((300,), 10, hidden=(200, 100), device=bk, seed=0)
            optimizer = pn.SGD(0.05, 0.9)
            net.train_batch(x, y, optimizer)        # builds and grows first, uncounted
            copies.clear()
            monkeypatch.setattr(bk, "_run", counted)
            net.train_batch(x, y, optimizer)
            monkeypatch.setattr(bk, "_run", run)
            assert sum(copies) == (6 if keep else 7)
            for _ in range(3):                      # recorded, then replayed
                net.train_batch(x, y, optimizer)
            weights[keep] = net.get_weights()
            net.free()
    for name, kept in weights[True].items():
        assert np.array_equal(kept, weights[False][name]), name


def test_a_step_stopped_midway_leaves_no_kept_copy_behind(device_name, rng, lower):
    """A training forward keeps the batch's 16-bit copy until its backward; one stopped
    before it (an interrupt, an error) leaves no word behind: the next step copies its own
    batch again instead of reading the old one's copy (Backend.drop_all_operands)."""
    bk = precision_backend(device_name, lower)
    if getattr(bk, "half_operands", None) is None:
        pytest.skip(f"{bk.name} keeps no copies in {lower}")
    x1, x2 = (rng.standard_normal((96, 300)).astype(np.float32) for _ in range(2))
    y = rng.integers(0, 10, 96)
    weights = []
    for stopped in (False, True):
        net = pn.mlp((300,), 10, hidden=(200, 100), device=bk, seed=0)
        optimizer = pn.SGD(0.05, 0.9)
        net.train_batch(x1, y, optimizer)
        if stopped:
            net._forward(training=True)         # keeps x1's copy; no backward drops it
        net.train_batch(x2, y, optimizer)
        weights.append(net.get_weights())
        net.free()
    for name, w in weights[0].items():
        assert np.array_equal(w, weights[1][name]), name


# -- the command line and the bench ---------------------------------------------------------

def test_train_and_plan_on_the_command_line(tmp_path):
    from click.testing import CliRunner
    from portanet.cli import main
    result = CliRunner().invoke(main, ["train", "--dataset", "coordinates", "--epochs", "1",
                                       "--device", "cpu", "--precision", "tf32", "--plan"])
    assert result.exit_code == 0, result.output
    assert "memory plan on cpu (tf32)" in result.output
    result = CliRunner().invoke(main, ["train", "--dataset", "coordinates", "--epochs", "1",
                                       "--device", "cpu", "--precision", "tf32", "--json"])
    assert result.exit_code == 0, result.output
    assert '"precision": "tf32"' in result.output.splitlines()[-1]
    result = CliRunner().invoke(main, ["train", "--dataset", "coordinates", "--device", "cpu",
                                       "--precision", "fp8"])
    assert result.exit_code != 0 and "precision 'fp8' is not one of" in result.output


def test_bench_rows_say_their_precision():
    from portanet import bench
    report = bench.run(["cpu", "opencl:pocl"], ["mlp-small"], peer=False,
                       progress=lambda line: None, precisions=["fp32", "tf32"])
    rows = {(r["device"], r["precision"]): r for r in report["results"]}
    assert rows["cpu", "fp32"]["status"] == rows["cpu", "tf32"]["status"] == "ok"
    assert "tf32" in report["devices"]["cpu"]["precisions"]
    if report["devices"]["opencl:pocl"]["status"] == "ok":
        assert rows["opencl:pocl", "fp32"]["status"] == "ok"
        assert "PrecisionError" in rows["opencl:pocl", "tf32"]["error"]
    assert "tf32 mlp-small" in bench.table(report)


def test_bench_runs_a_precision_once_and_fails_when_nothing_ran():
    from click.testing import CliRunner
    from portanet import bench
    from portanet.cli import main
    report = bench.run(["cpu"], ["mlp-small"], peer=False, progress=lambda line: None,
                       precisions=["fp16", "FP16", "half"])
    assert [r["precision"] for r in report["results"]] == ["fp16"]
    result = CliRunner().invoke(main, ["bench", "--device", "opencl:pocl", "--workload",
                                       "mlp-small", "--precision", "bf16", "--no-torch"])
    if "no OpenCL" in result.output or "not available" in result.output:
        pytest.skip("no PoCL here")
    assert result.exit_code != 0, result.output
    assert "nothing ran" in result.output
    assert "it has fp32; bf16 runs on CUDA devices" in result.output     # not cut short
