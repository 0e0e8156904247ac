"""mma.cu's variants at 4096^3 (VEC, ROUND, MIN_BLOCKS), and how cuBLAS's TF32 rounds."""
import sys
import numpy as np
import portanet as pn
from portanet import bench
from portanet.backends import cuda

out = open(sys.argv[1], "w")
def say(*a):
    print(*a); print(*a, file=out); out.flush()

bkt = pn.device("cuda", precision="tf32")
rng = np.random.default_rng(0)
# how cuBLAS's TF32 rounds: A (512 x 512) of v, times the identity, is v as TF32
n = 512
for v, what in ((1 + 3 * 2.0 ** -12, "0.75 ulp above 1"), (1 + 2.0 ** -11, "a tie, half an ulp"),
                (1 + 2.0 ** -11 + 2.0 ** -20, "just above a tie")):
    a = bkt.upload(np.full((n, n), v, np.float32)); b = bkt.upload(np.eye(n, dtype=np.float32))
    c = bkt.zeros((n, n))
    bkt._gemm_vendor(1.0, a, b, 0.0, c, False, False, n, n, n, n)
    got = bkt.download(c)[0, 0]
    say(f"cuBLAS TF32 of {v!r} ({what}): {got!r} = 1 + {(got - 1) * 2**10:g} ulp")
    bkt._gemm_tensor(1.0, a, b, 0.0, c, False, False, n, n, n, "x")
    g = bkt.download(c)[0, 0]
    say(f"   mma.cu: 1 + {(g - 1) * 2**10:g} ulp")
for n, (ta, tb) in ((4096, (False, False)), (4096, (True, False)), (10000, (False, False))):
    m = k = n
    ha = rng.standard_normal((n, n), dtype=np.float32)
    hb = rng.standard_normal((n, n), dtype=np.float32)
    a, b, c = bkt.upload(ha), bkt.upload(hb), bkt.empty((n, n))
    ev = bench._cuda_events(bkt)
    say(f"{'T' if ta else 'N'}{'T' if tb else 'N'} {n}^3")
    def rate(fn):
        t = bench.measure(fn, bkt.synchronize, repeats=10, inner=3, events=ev)
        return 2 * n ** 3 / t["median_s"] / 1e12, t["median_s"] * 1e3
    for blocks in (1, 2):
        cuda.MMA_BLOCKS = blocks
        tf, ms = rate(lambda: bkt._gemm_tensor(1.0, a, b, 0.0, c, ta, tb, m, n, k, "x"))
        say(f"  mma VEC 1, MIN_BLOCKS {blocks}, cvt.rn: {tf:7.1f} TFLOP/s {ms:8.3f} ms")
    cuda.MMA_BLOCKS = 2
    tf, ms = rate(lambda: bkt._gemm_vendor(1.0, a, b, 0.0, c, ta, tb, m, n, k, n))
    say(f"  cuBLAS TF32: {tf:7.1f} TFLOP/s {ms:8.3f} ms")
    for x in (a, b, c):
        bkt.free(x)
