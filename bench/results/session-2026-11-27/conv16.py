"""LeNet's second convolution (16 -> 32 channels, 3x3, 26x26 images, batch 2048) on cuda in
bf16 or fp16, each product on the implicit path with its images and delta in float32 and in
16-bit storage: the median of 20 calls, and (NCU=1) one call each for a profiler.
python3 conv16.py PRECISION"""
import os
import sys
import time

import numpy as np

import portanet as pn

bk = pn.device("cuda", precision=sys.argv[1])
bk.conv_path = "implicit"
C, H, W, N, k, F = 16, 26, 26, 2048, 3, 32
rng = np.random.default_rng(0)
x = rng.standard_normal((C, H, W, N)).astype(np.float32)
dz = rng.standard_normal((F, H - 2, W - 2, N)).astype(np.float32)
w = bk.upload(rng.standard_normal((F, C * k * k)).astype(np.float32))
b = bk.upload(np.zeros(F, np.float32))


def put(host, half):
    out = bk.empty(host.shape, bk.storage_dtype if half else None)
    bk.write(out, host)
    return out


for half in (False, True):
    X, DZ = put(x, half), put(dz, half)
    Z, A = bk.empty(dz.shape), bk.empty(dz.shape)
    GW, DX = bk.empty((F, C * k * k)), bk.empty(x.shape)
    calls = {"forward": lambda: bk.conv("relu", w, X, b, Z, A, k, 1, 0),
             "wgrad": lambda: bk.conv_weight_grad(1.0, DZ, X, 0.0, GW, k, 1, 0),
             "dgrad": lambda: bk.conv_input_grad(DX, w, DZ, k, 1, 0)}
    for name, call in calls.items():
        call()
        bk.synchronize()
        if os.environ.get("NCU") == "1":
            continue
        times = []
        for _ in range(20):
            start = time.perf_counter()
            call()
            bk.synchronize()
            times.append(time.perf_counter() - start)
        print(f"{sys.argv[1]} {'16-bit' if half else 'float32'} {name}: "
              f"{1e6 * np.median(times):.1f} us", flush=True)
