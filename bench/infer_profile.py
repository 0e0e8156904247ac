"""Where lenet-infer's time goes: predict on 10000 images (the bench's workload) timed
whole, its host side profiled (cProfile: time waiting for the device shows in the waits),
and the device time of one batch's forward alone (markers around it).

Usage: python bench/infer_profile.py [--device cuda] [--batch N]
"""
import argparse
import cProfile
import pstats
import time

import numpy as np

import portanet as pn


def timeline(net, x, chunk):
    """predict's loop with markers on the device after each batch's upload and forward,
    and the host's clock at the same points (ms from the start)."""
    bk = net.backend
    bk.synchronize()
    rows = []
    with bk.profiling():
        origin, t0 = bk._marker(), time.perf_counter()
        for i in range(0, len(x), chunk):
            h0 = time.perf_counter()
            net.plan.upload(x[i:i + chunk], first=i)
            h1, up = time.perf_counter(), bk._marker()
            net._forward()
            h2, fw = time.perf_counter(), bk._marker()
            rows.append((h0, h1, h2, up, fw))
        bk.synchronize()
        print("batch  host: start  sent  queued   device: uploaded  forward done (ms)")
        for k, (h0, h1, h2, up, fw) in enumerate(rows):
            print(f"{k:5d}  {(h0 - t0) * 1e3:11.2f} {(h1 - t0) * 1e3:5.2f} {(h2 - t0) * 1e3:7.2f}"
                  f"  {bk._elapsed(origin, up) * 1e3:16.2f} {bk._elapsed(origin, fw) * 1e3:13.2f}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch", type=int, default=None)
    args = parser.parse_args()
    net = pn.lenet(device=args.device)
    bk = net.backend
    x = np.random.default_rng(0).random((10000, 1, 28, 28), dtype=np.float32)
    net.predict(x, batch_size=args.batch)
    chunk = net.plan.inference_batch(args.batch, len(x))
    times = []
    for _ in range(5):
        start = time.perf_counter()
        net.predict(x, batch_size=args.batch)
        times.append(time.perf_counter() - start)
    print(f"{args.device} predict 10000 images, batch {chunk}: "
          + " ".join(f"{t * 1e3:.2f}" for t in times) + " ms")
    profile = cProfile.Profile()
    profile.enable()
    net.predict(x, batch_size=args.batch)
    profile.disable()
    pstats.Stats(profile).sort_stats("tottime").print_stats(14)
    for m in sorted({chunk, len(x) % chunk or chunk}):
        net.plan.bind(m)
        net._forward()
        with bk.profiling():
            start = bk._marker()
            for _ in range(10):
                net._forward()
            end = bk._marker()
            took = bk._elapsed(start, end) / 10
        print(f"forward of a batch of {m}, device: {took * 1e3:.3f} ms")
    timeline(net, x, chunk)
    start = time.perf_counter()
    for i in range(0, len(x), chunk):
        np.all(np.isfinite(x[i:i + chunk]))
    print(f"host NaN checks: {(time.perf_counter() - start) * 1e3:.2f} ms")
    pinned = bk.host_empty(chunk * 784)
    start = time.perf_counter()
    for i in range(0, len(x), chunk):
        np.copyto(pinned[:x[i:i + chunk].size], x[i:i + chunk].reshape(-1))
    print(f"host copies into pinned memory: {(time.perf_counter() - start) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
