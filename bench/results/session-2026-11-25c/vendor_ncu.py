"""cuBLAS on mlp-small's two 500 x 1000 x 1000 products (NN, NT), three calls each, for
ncu to name its kernels, their grids and times."""
import numpy as np
import portanet as pn

bk = pn.device("cuda")
rng = np.random.default_rng(0)
a = bk.upload(rng.standard_normal((500, 1000), dtype=np.float32))
b = bk.upload(rng.standard_normal((1000, 1000), dtype=np.float32))
c = bk.empty((500, 1000))
for trans_b in (False, True, False, True, False, True):
    bk._gemm_vendor_pieces(1.0, a, b, 0.0, c, False, trans_b, 500, 1000, 1000)
bk.synchronize()
