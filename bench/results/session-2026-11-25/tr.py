"""The transpose kernel against a plain copy of the same bytes (median of 9, us and GB/s
moved, read + write): mlp-big's w of layers 1 and 2 and its first input. Usage:
python3 tr.py DEVICE..."""
import sys
import time

import numpy as np

import portanet as pn


def med(fn, sync, n=9):
    fn()
    sync()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return sorted(times)[n // 2]


for spec in sys.argv[1:]:
    bk = pn.device(spec)
    for rows, cols in ((5000, 10000), (1000, 5000), (10000, 10000)):
        x = bk.upload(np.random.default_rng(0).random((rows, cols), dtype=np.float32))
        out = bk.empty((cols, rows))
        t = med(lambda: bk.transpose(x, out), bk.synchronize)
        assert np.array_equal(bk.download(out)[:7, :5], bk.download(x)[:5, :7].T)
        c = med(lambda: bk.copy(x, bk.view(out, (rows, cols))), bk.synchronize)
        gb = 2 * x.nbytes / 1e9
        print(f"{bk.name} {rows}x{cols}: transpose {1e6 * t:8.1f} us ({gb / t:6.0f} GB/s), "
              f"copy {1e6 * c:8.1f} us ({gb / c:6.0f} GB/s)")
        bk.free(x), bk.free(out)
