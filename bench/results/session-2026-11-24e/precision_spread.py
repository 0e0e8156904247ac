"""Fashion-MNIST test accuracy after 5 epochs (batch 64, SGD 0.02 momentum 0.9) of the MLP
and LeNet of `portanet train`, for seeds 0-3, in each precision on cuda: whether a
precision's distance from fp32 is larger than the seeds' own spread. One JSON line a run."""
import json
import time

import portanet as pn

data = pn.load_dataset("fashion-mnist")
(x, y), (xt, yt) = data
for model in ("mlp", "lenet"):                  # as `portanet train --model M` builds them
    for seed in range(4):
        for precision in ("fp32", "tf32", "bf16", "fp16"):
            start = time.perf_counter()
            net = pn.models.MODELS[model](input_shape=x.shape[1:], classes=10, device="cuda",
                                          seed=seed, precision=precision)
            history = net.fit(x, y, epochs=5, batch_size=64, optimizer=pn.SGD(0.02, 0.9),
                              seed=seed)
            acc = net.evaluate(xt, yt)[1]
            print(json.dumps({"model": model, "seed": seed, "precision": precision,
                              "test_accuracy": acc, "skipped": history.get("skipped_steps"),
                              "seconds": round(time.perf_counter() - start, 1)}), flush=True)
            net.free()
