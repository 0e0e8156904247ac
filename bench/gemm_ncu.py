"""One 4096^3 SGEMM through portanet on a device, for a profiler to look at:
    ncu --kernel-name gemm --launch-skip 3 --launch-count 1 python bench/gemm_ncu.py cuda"""
import sys

import numpy as np

import portanet as pn

bk = pn.device(sys.argv[1] if len(sys.argv) > 1 else "cuda")
bk.gemm_path = "own"
n = int(sys.argv[2]) if len(sys.argv) > 2 else 4096
rng = np.random.default_rng(0)
a, b = (bk.upload(rng.standard_normal((n, n), dtype=np.float32)) for _ in range(2))
c = bk.empty((n, n))
for _ in range(5):
    bk.gemm(1.0, a, b, 0.0, c)
bk.synchronize()
print(bk.gemm_params)
