"""4096^3 (and a few other sizes) on the H100: mma.cu's TF32 kernel (MIN_BLOCKS 1, 2; one
launch, and as gemm runs it, in ACC_K pieces), cuBLAS TF32 and SGEMM, PyTorch TF32 / bf16."""
import sys
import numpy as np
import portanet as pn
from portanet import bench
from portanet.backends import cuda

out = open(sys.argv[1], "w")
def say(*a):
    print(*a); print(*a, file=out); out.flush()

bk32, bkt = pn.device("cuda"), pn.device("cuda", precision="tf32")
rng = np.random.default_rng(0)
for n, trans in ((4096, (False, False)), (4096, (True, False)), (4096, (False, True)),
                 (10000, (False, False)), (1000, (False, True))):
    m = k = n
    ha = rng.standard_normal((n, n), dtype=np.float32)
    hb = rng.standard_normal((n, n), dtype=np.float32)
    a, b, c = bkt.upload(ha), bkt.upload(hb), bkt.empty((n, n))
    ev = bench._cuda_events(bkt)
    flops = 2 * n ** 3
    def rate(fn):
        t = bench.measure(fn, bkt.synchronize, repeats=10, inner=3, events=ev)
        return flops / t["median_s"] / 1e12, t["median_s"] * 1e3
    ta, tb = trans
    rows = {}
    for blocks in (1, 2):
        cuda.MMA_BLOCKS = blocks
        rows[f"mma one launch, MIN_BLOCKS {blocks}"] = rate(
            lambda: bkt._gemm_tensor(1.0, a, b, 0.0, c, ta, tb, m, n, k, "x"))
    cuda.MMA_BLOCKS = 1
    rows["mma in ACC_K pieces (gemm path own)"] = rate(
        lambda: bkt._gemm_tensor_pieces(1.0, a, b, 0.0, c, ta, tb, m, n, k))
    got = bkt.download(c).astype(np.float64)
    rows["cuBLAS TF32 (one call)"] = rate(
        lambda: bkt._gemm_vendor(1.0, a, b, 0.0, c, ta, tb, m, n, k, n))
    # (timed on the tf32 backend's stream, while bk32 runs on its own: this row is void)
    rows["cuBLAS SGEMM fp32 (one call)"] = rate(
        lambda: bk32._gemm_vendor(1.0, a, b, 0.0, c, ta, tb, m, n, k, n))
    try:
        import torch
        A, B = torch.from_numpy(ha).cuda(), torch.from_numpy(hb).cuda()
        A, B = (A.T if ta else A), (B.T if tb else B)
        sync = torch.cuda.synchronize
        for name, tf32, dt in (("torch fp32 TF32 allowed", True, torch.float32),
                               ("torch bf16", False, torch.bfloat16)):
            torch.backends.cuda.matmul.allow_tf32 = tf32
            X, Y = A.to(dt), B.to(dt)
            t = bench.measure(lambda: torch.mm(X, Y), sync, repeats=10, inner=3)
            rows[name] = (flops / t["median_s"] / 1e12, t["median_s"] * 1e3)
    except Exception as e:
        say("torch:", e)
    say(f"{'NT'[ta] if ta else 'N'}{'T' if tb else 'N'} {n}^3")
    for name, (tf, ms) in rows.items():
        say(f"  {name:40s} {tf:8.1f} TFLOP/s {ms:9.3f} ms")
    if n <= 4096:
        ra, rb = (ha.T if ta else ha), (hb.T if tb else hb)
        from portanet.precision import round_to
        ref = (round_to(np.ascontiguousarray(ra), "tf32").astype(np.float64)
               @ round_to(np.ascontiguousarray(rb), "tf32"))
        err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        say(f"  mma pieces vs rounded-input product: rel err {err:.2e}")
    for x in (a, b, c):
        bkt.free(x)
