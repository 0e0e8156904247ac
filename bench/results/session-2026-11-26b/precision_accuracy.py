"""Fashion-MNIST test accuracy after 5 epochs (batch 64, SGD 0.02 momentum 0.9) of
`portanet train`'s LeNet and MLP, for the seeds given, in each precision on the device given
(issue 18's criterion: within 0.3 pp of fp32 on the same seed). One JSON line a run.
python3 precision_accuracy.py DEVICE SEED [SEED ...]
MODELS=mlp (default lenet,mlp), PRECISIONS=fp32 (default all four)"""
import json
import os
import sys
import time

import portanet as pn

device, seeds = sys.argv[1], [int(s) for s in sys.argv[2:]]
(x, y), (xt, yt) = pn.load_dataset("fashion-mnist")
for model in os.environ.get("MODELS", "lenet,mlp").split(","):   # as `portanet train` builds
    for seed in seeds:
        for precision in os.environ.get("PRECISIONS", "fp32,tf32,bf16,fp16").split(","):
            start = time.perf_counter()
            net = pn.models.MODELS[model](input_shape=x.shape[1:], classes=10, device=device,
                                          seed=seed, precision=precision)
            history = net.fit(x, y, epochs=5, batch_size=64, optimizer=pn.SGD(0.02, 0.9),
                              seed=seed)
            acc = net.evaluate(xt, yt)[1]
            print(json.dumps({"model": model, "seed": seed, "precision": precision,
                              "test_accuracy": acc, "skipped": history.get("skipped_steps"),
                              "seconds": round(time.perf_counter() - start, 1)}), flush=True)
            net.free()
