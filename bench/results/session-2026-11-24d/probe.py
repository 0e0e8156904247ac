"""cuBLAS's FAST_16BF / FAST_16F compute types on float32 matrices: how they round the
inputs, what fp16 does at overflow and underflow, and how fast they run, beside bf16
storage, TF32 and torch."""
import ctypes, time
import numpy as np, torch
from nvmath.bindings import cublas

R32F, R16F, R16BF = 0, 2, 14
CT = cublas.ComputeType
h = cublas.create()
cublas.set_stream(h, torch.cuda.current_stream().cuda_stream)
scal = np.array([1.0, 0.0], np.float32)


def gemm(a, b, c, ct, t=R32F, ct_type=R32F, alpha=1.0, beta=0.0):
    # row-major c (m, n) = a (m, k) b (k, n): column-major c^T = b^T a^T
    m, k = a.shape; n = b.shape[1]
    scal[:] = alpha, beta
    p = scal.ctypes.data
    cublas.gemm_ex(h, 0, 0, n, m, k, p, b.data_ptr(), t, n, a.data_ptr(), t, k, p + 4,
                   c.data_ptr(), ct_type, n, ct, -1)


def product(av, bv, ct, K=16):
    a = torch.zeros(1, K, device="cuda"); b = torch.zeros(K, 1, device="cuda")
    j = min(3, K - 1); a[0, j] = av; b[j, 0] = bv
    c = torch.zeros(1, 1, device="cuda")
    gemm(a, b, c, ct); torch.cuda.synchronize()
    return c.item()


for name, ct, bits in (("FAST_16BF", CT.COMPUTE_32F_FAST_16BF, 7),
                       ("FAST_16F", CT.COMPUTE_32F_FAST_16F, 10)):
    u = 2.0 ** -bits
    print(f"== {name}: unit {u}")
    for label, v in (("0.75 unit", 1 + 0.75 * u), ("tie to even (down)", 1 + 0.5 * u),
                     ("tie to even (up)", 1 + 1.5 * u), ("just above tie", 1 + (0.5 + 2 ** -6) * u),
                     ("0.25 unit", 1 + 0.25 * u)):
        for K in (1, 16, 256):
            print(f"  {label:20s} K={K:3d} x={v!r:24} x*1 = {product(v, 1.0, ct, K)!r}")
    for v in (70000.0, 65504.0, 65520.0, 1e-8, 3e-8, 1e-5, -70000.0, float("nan"), 1e30):
        print(f"  x={v!r:10} x*1 = {product(v, 1.0, ct)!r}")

# a random product against each rounding
rng = np.random.default_rng(0)
m, n, k = 257, 131, 515
A = rng.standard_normal((m, k), dtype=np.float32); B = rng.standard_normal((k, n), dtype=np.float32)
a, b = torch.tensor(A, device="cuda"), torch.tensor(B, device="cuda")
c = torch.zeros(m, n, device="cuda")
for name, ct, dt in (("FAST_16BF", CT.COMPUTE_32F_FAST_16BF, torch.bfloat16),
                     ("FAST_16F", CT.COMPUTE_32F_FAST_16F, torch.float16)):
    gemm(a, b, c, ct); torch.cuda.synchronize()
    got = c.cpu().double().numpy()
    rne = (a.to(dt).double() @ b.to(dt).double()).cpu().numpy()
    trunc_a = (a.view(torch.int32) & ~0xFFFF).view(torch.float32).double()
    trunc_b = (b.view(torch.int32) & ~0xFFFF).view(torch.float32).double()
    trunc = (trunc_a @ trunc_b).cpu().numpy()
    exact = A.astype(np.float64) @ B.astype(np.float64)
    print(f"{name}: |got-rne| {np.abs(got-rne).max():.3g}  |got-trunc(bf16)| "
          f"{np.abs(got-trunc).max():.3g}  |got-fp64| {np.abs(got-exact).max():.3g}")


def timeit(f, reps=20):
    f(); torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(reps):
        s.record(); f(); e.record(); e.synchronize(); ts.append(s.elapsed_time(e))
    return float(np.median(ts))


for (m, n, k) in ((4096, 4096, 4096), (5000, 10000, 10000), (10000, 10000, 5000),
                  (5000, 10000, 10000)):
    fl = 2 * m * n * k
    a = torch.randn(m, k, device="cuda"); b = torch.randn(k, n, device="cuda")
    c = torch.empty(m, n, device="cuda")
    ab, bb = a.bfloat16(), b.bfloat16(); ah, bh = a.half(), b.half()
    rows = [("sgemm fp32", lambda: gemm(a, b, c, CT.COMPUTE_32F)),
            ("FAST_TF32", lambda: gemm(a, b, c, CT.COMPUTE_32F_FAST_TF32)),
            ("FAST_16BF fp32 io", lambda: gemm(a, b, c, CT.COMPUTE_32F_FAST_16BF)),
            ("FAST_16F fp32 io", lambda: gemm(a, b, c, CT.COMPUTE_32F_FAST_16F)),
            ("bf16 in, fp32 out", lambda: gemm(ab, bb, c, CT.COMPUTE_32F, R16BF, R32F)),
            ("fp16 in, fp32 out", lambda: gemm(ah, bh, c, CT.COMPUTE_32F, R16F, R32F)),
            ("torch bf16 matmul", lambda: torch.matmul(ab, bb)),
            ("cast a,b to bf16 + bf16 gemm",
             lambda: (ab.copy_(a), bb.copy_(b), gemm(ab, bb, c, CT.COMPUTE_32F, R16BF, R32F)))]
    for name, f in rows:
        t = timeit(f)
        print(f"{m}x{n}x{k} {name:30s} {t:8.3f} ms {fl / t / 1e9:8.1f} TFLOP/s")
