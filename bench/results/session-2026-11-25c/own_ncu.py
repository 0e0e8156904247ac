"""mlp-small's NT 500 x 1000 x 1000 product on cuda, once each way, for ncu to compare our
kernel with cuBLAS's (64 x 64 x 8 tiles, 3 stages, split K in 2): our 64 x 64 tiling of 8 x 4
per thread (128 threads, cuBLAS's shape) in 2 parts summed after, our 128 x 128 in 4 parts
summed after (routing's pick on OpenCL), then cuBLAS."""
import numpy as np
import portanet as pn
from portanet.backends import gpu

bk = pn.device("cuda")
rng = np.random.default_rng(0)
m, n, k = 500, 1000, 1000
a = bk.upload(rng.standard_normal((m, k), dtype=np.float32))
b = bk.upload(rng.standard_normal((n, k), dtype=np.float32))
c = bk.empty((m, n))
base = dict(gpu.GEMM_DEFAULTS, MICRO=2, PAD=4, VW=4, TSK=16, MIN_GROUPS=2)
for p, parts in ((dict(base, TSM=64, TSN=64, WPTM=8, WPTN=4), 2),
                 (dict(base, TSM=128, TSN=128, WPTM=8, WPTN=8), 4)):
    count, chunk = gpu.k_parts(k, parts, 16)
    bk._gemm_own(1.0, a, b, 0.0, c, False, True, m, n, k, tiling=(p, count, chunk, False))
bk._gemm_vendor_pieces(1.0, a, b, 0.0, c, False, True, m, n, k)
bk.synchronize()
