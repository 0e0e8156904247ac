"""Where the host's time goes in a training epoch from host arrays (an epoch slower against
another device than its replayed step is points at the host): the epoch timed as fit runs
it, then once more under cProfile, with the host microseconds per batch in the batch's
upload, in the step (a replay) and in the rest of fit's loop, and the functions that cost
most.

Usage: python bench/epoch_profile.py [--device opencl:0:0] [--samples 20000] [--batch 64]
       [--model lenet|mlp] [--on-device]   (fit(data_on_device=True): the set kept on the
       device, each batch gathered there from the indices the host sends)
"""
import argparse
import cProfile
import pstats
import time

import portanet as pn


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="opencl:0:0")
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--model", default="lenet", choices=["lenet", "mlp"])
    parser.add_argument("--on-device", action="store_true")
    args = parser.parse_args()
    (x, y), _ = pn.load_dataset("fashion-mnist")
    x, y = x[:args.samples], y[:args.samples]
    make = pn.lenet if args.model == "lenet" else pn.mlp
    net = make(device=args.device, seed=0)
    kept = {"data_on_device": args.on_device}
    net.fit(x[:args.batch * 20], y[:args.batch * 20], epochs=1, batch_size=args.batch, verbose=0, **kept)
    bk = net.backend
    batches = -(-len(x) // args.batch)
    for _ in range(2):
        bk.synchronize()
        start = time.perf_counter()
        net.fit(x, y, epochs=1, batch_size=args.batch, verbose=0, **kept)
        bk.synchronize()
        took = time.perf_counter() - start
        print(f"{args.model} epoch of {len(x)} on {bk.name}, set "
              f"{'on the device' if args.on_device else 'on the host'}: {took:.3f} s, "
              f"{took / batches * 1e6:.1f} us a batch")
    profile = cProfile.Profile()
    profile.enable()
    net.fit(x, y, epochs=1, batch_size=args.batch, verbose=0, **kept)
    bk.synchronize()
    profile.disable()
    stats = pstats.Stats(profile)
    cumulative = {}
    for f, v in stats.stats.items():
        cumulative[f[2]] = cumulative.get(f[2], 0.0) + v[3]
    whole = cumulative.get("_epochs", 0.0)
    # the batch's upload: the batch laid out, or with the set kept there its indices
    sent = "write" if args.on_device else "_upload_batch"
    parts = {"upload": cumulative.get(sent, 0.0), "step": cumulative.get("train_step", 0.0)}
    parts["rest of the loop"] = whole - sum(parts.values())
    print("under cProfile, us a batch: " + ", ".join(
        f"{k} {v / batches * 1e6:.1f}" for k, v in parts.items()))
    stats.sort_stats("tottime").print_stats(14)


if __name__ == "__main__":
    main()
