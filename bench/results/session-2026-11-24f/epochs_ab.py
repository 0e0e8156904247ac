"""fit with its default data_on_device, as a user calls it: one call of 4 epochs (epochs
2-4 shown, us a batch) and 3 calls of one epoch (each whole call, us a batch)."""
import sys, time
import portanet as pn

device, model, tree = sys.argv[1], sys.argv[2], sys.argv[3]
(x, y), _ = pn.load_dataset("fashion-mnist")
x, y = x[:20000], y[:20000]
batches = -(-len(x) // 64)
net = (pn.lenet if model == "lenet" else pn.mlp)(device=device, seed=0)
net.fit(x[:1280], y[:1280], epochs=1, batch_size=64)          # kernels built, routes measured
h = net.fit(x, y, epochs=4, batch_size=64)
many = [s / batches * 1e6 for s in h["seconds"][1:]]
single = []
for _ in range(3):
    net.backend.synchronize()
    t = time.perf_counter()
    net.fit(x, y, epochs=1, batch_size=64)
    net.backend.synchronize()
    single.append((time.perf_counter() - t) / batches * 1e6)
print(f"{model:5s} {device:11s} {tree:6s} fit(epochs=4), epochs 2-4: "
      + " ".join(f"{v:6.1f}" for v in many) + "   fit(epochs=1) x3: "
      + " ".join(f"{v:6.1f}" for v in single), flush=True)
