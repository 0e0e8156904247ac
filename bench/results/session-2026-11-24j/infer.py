"""Where lenet-infer's time goes (issue 11): predict on 10000 images in default batches,
split into its parts, each timed alone (median of 7, ms): the uploads (write_samples
through the staging buffer), the forward replays on resident data, the downloads; and
PyTorch's upload of the same array for scale. Usage: python3 infer.py DEVICE..."""
import sys
import time

import numpy as np

import portanet as pn
from portanet import training


def med(fn, sync, n=7):
    fn()
    sync()
    times = []
    for _ in range(n):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return 1e3 * sorted(times)[n // 2]


x = np.random.default_rng(0).random((10000, 1, 28, 28), dtype=np.float32)
for spec in sys.argv[1:]:
    bk = pn.device(spec)
    net = pn.models.lenet(device=bk)
    net.predict(x)
    chunk = net._inference_batch(None, len(x))
    starts = range(0, len(x), chunk)
    out = bk.host_empty((net.n_out * chunk,))

    def uploads():
        for i in starts:
            net._upload_batch(x[i:i + chunk], first=i)

    def forwards():
        for i in starts:
            net._bind(min(chunk, len(x) - i))
            training.replayed(net, ("predict", net.m), net._forward)

    def downloads():
        for i in starts:
            net._bind(min(chunk, len(x) - i))
            a = net.layers[-1].a
            bk.download_into(a, out[:a.size])

    row = {"predict": med(lambda: net.predict(x), bk.synchronize),
           "predict one batch": med(lambda: net.predict(x, batch_size=len(x)), bk.synchronize),
           "uploads": med(uploads, bk.synchronize), "forwards": med(forwards, bk.synchronize),
           "downloads": med(downloads, bk.synchronize)}
    print(f"{spec} ({bk.info()['name']}): batch {chunk}, {len(starts)} batches; "
          + ", ".join(f"{k} {v:.2f} ms" for k, v in row.items()), flush=True)
    net.free()
try:
    import torch
    dev = torch.device("cuda")
    t = torch.empty(x.shape, device=dev)
    row = med(lambda: t.copy_(torch.from_numpy(x)), torch.cuda.synchronize)
    pinned = torch.from_numpy(x).pin_memory()
    row2 = med(lambda: t.copy_(pinned, non_blocking=True), torch.cuda.synchronize)
    print(f"torch: upload of the 31 MB from pageable memory {row:.2f} ms, pinned {row2:.2f} ms")
except ImportError:
    pass
