"""wgmma.cu on the H100: correctness of _gemm_wgmma on awkward shapes and every transpose
(against the float64 product of the inputs rounded as round_to rounds them, the output
poisoned with NaN where beta is 0), then the kernel's rate at 4096^3 and other sizes beside
cuBLAS's gemm_ex on the same 16-bit operands, the two library paths (copies included) and
torch's bf16 mm."""
import sys
import numpy as np
import portanet as pn
from portanet import bench
from portanet.precision import round_to
from portanet.backends import cuda

out = open(sys.argv[1], "w")
only_check = len(sys.argv) > 2 and sys.argv[2] == "check"


def say(*a):
    print(*a)
    print(*a, file=out)
    out.flush()


def rel(got, ref):
    return np.linalg.norm(got - ref) / np.linalg.norm(ref)


for prec in ("bf16", "fp16"):
    bk = pn.device("cuda", precision=prec)
    say(f"== {prec}: tensor_gemm {bk.tensor_gemm}")
    rng = np.random.default_rng(1)
    worst = 0.0
    for m, n, k in [(1, 1, 8), (130, 257, 136), (257, 130, 72), (128, 256, 64),
                    (1000, 37, 2048), (33, 700, 200), (384, 512, 1024)]:
        for ta in (False, True):
            for tb in (False, True):
                a = rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
                b = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
                c0 = rng.standard_normal((m, n)).astype(np.float32)
                op_a, op_b = (a.T if ta else a), (b.T if tb else b)
                prod = (round_to(np.ascontiguousarray(op_a), prec).astype(np.float64)
                        @ round_to(np.ascontiguousarray(op_b), prec))
                for alpha, beta in ((1.0, 0.0), (-0.7, 0.3)):
                    C = bk.upload(np.full((m, n), np.nan, np.float32) if beta == 0 else c0)
                    bk._gemm_wgmma(alpha, bk.upload(a), bk.upload(b), beta, C, ta, tb,
                                   m, n, k, "check")
                    got = bk.download(C)
                    err = rel(got, alpha * prod + beta * c0)
                    worst = max(worst, err) if np.isfinite(err) else np.inf
                    if not err < 2e-5:
                        say(f"  BAD {m}x{n}x{k} T{int(ta)}{int(tb)} alpha {alpha} beta {beta}: "
                            f"rel err {err:.2e}, NaN {np.isnan(got).sum()} of {got.size}")
    say(f"  worst rel err over the shapes: {worst:.2e}")
    if only_check:
        continue
    ev = bench._cuda_events(bk)
    for m, n, k in [(4096, 4096, 4096), (8192, 8192, 8192), (10000, 5000, 10000),
                    (5000, 10000, 10000), (2048, 2048, 2048)][:2 if prec == "fp16" else 5]:
        flops = 2 * m * n * k
        ha = rng.standard_normal((m, k), dtype=np.float32)
        hb = rng.standard_normal((k, n), dtype=np.float32)
        a, b, c = bk.upload(ha), bk.upload(hb), bk.empty((m, n))

        def rate(fn):
            t = bench.measure(fn, bk.synchronize, repeats=10, inner=5, events=ev)
            return flops / t["median_s"] / 1e12, t["median_s"] * 1e3
        a16, b16 = bk._kmajor16(a, b, False, False, m, n, k)
        bk.synchronize()
        rows = {"wgmma.cu kernel (K-major 16-bit in)": rate(
            lambda: bk._wgmma(1.0, a16, b16, 0.0, c))}
        kept = bk._wgmma_kernel()
        for g in (1, 8, 32):
            kern = bk._module("wgmma", [f"-DGROUP_M={g}"], "sm_90a").get_function("gemm_wgmma")
            kern.set_attribute(cuda.drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES,
                               cuda.WGMMA_SHARED)
            kern.prepare("PPPiiiiiff")
            bk._kernels["gemm_wgmma"] = kern
            rows[f"  the same, GROUP_M {g}"] = rate(lambda: bk._wgmma(1.0, a16, b16, 0.0, c))
        bk._kernels["gemm_wgmma"] = kept
        got = bk.download(c)[:64].astype(np.float64)
        ref = round_to(ha[:64], prec).astype(np.float64) @ round_to(hb, prec)
        check = rel(got, ref)
        rows["cuBLAS gemm_ex, same K-major operands (TN)"] = rate(
            lambda: bk._gemm_vendor(1.0, a16, b16, 0.0, c, False, True, m, n, k, n))
        r16, s16 = bk._operands16(a, b)
        rows["cuBLAS gemm_ex, row-major copies (NN)"] = rate(
            lambda: bk._gemm_vendor(1.0, r16, s16, 0.0, c, False, False, m, n, k, n))
        rows["path tensor: copies + wgmma, ACC_K pieces"] = rate(
            lambda: bk._gemm_tensor_pieces(1.0, a, b, 0.0, c, False, False, m, n, k))
        rows["path vendor: copies + cuBLAS, vendor_k pieces"] = rate(
            lambda: bk._gemm_vendor_pieces(1.0, a, b, 0.0, c, False, False, m, n, k))
        try:
            import torch
            dt = torch.bfloat16 if prec == "bf16" else torch.float16
            A = torch.randn(m, k, device="cuda", dtype=dt)
            B = torch.randn(k, n, device="cuda", dtype=dt)
            t = bench.measure(lambda: torch.mm(A, B), torch.cuda.synchronize, repeats=10,
                              inner=5)
            rows[f"torch.mm {prec} (16-bit out)"] = (flops / t["median_s"] / 1e12,
                                                     t["median_s"] * 1e3)
            del A, B
        except Exception as e:
            say("  torch:", e)
        say(f"  {m}x{n}x{k} (first 64 rows of wgmma's c against the rounded inputs' "
            f"product: {check:.2e})")
        ref_rate = rows["cuBLAS gemm_ex, same K-major operands (TN)"][0]
        for name, (tf, ms) in rows.items():
            say(f"    {name:48s} {tf:7.1f} TFLOP/s {ms:9.3f} ms  {100 * tf / ref_rate:5.1f}%")
        for x in (a, b, c):
            bk.free(x)
