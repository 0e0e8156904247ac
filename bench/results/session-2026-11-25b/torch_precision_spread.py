"""The peer's side of issue 18's accuracy criterion: PyTorch trains the MLP and LeNet of
`portanet train` (784-512-256-10 relu; conv 16 3x3, conv 32 3x3, maxpool 2, dense 10) on
Fashion-MNIST for 5 epochs (batch 64, SGD 0.02 momentum 0.9, its default initialisation),
seeds 0-3, in fp32, tf32 (allow_tf32), bf16 (autocast) and fp16 (autocast with GradScaler);
test accuracy, one JSON line a run. precision_spread.py (session-2026-11-24e) is portanet's
side."""
import json
import time

import numpy as np
import torch

import portanet as pn

(x, y), (xt, yt) = pn.load_dataset("fashion-mnist")
x = torch.from_numpy(np.ascontiguousarray(x, np.float32).reshape(-1, 1, 28, 28)).cuda()
y = torch.from_numpy(np.asarray(y, np.int64)).cuda()
xt = torch.from_numpy(np.ascontiguousarray(xt, np.float32).reshape(-1, 1, 28, 28)).cuda()
yt = torch.from_numpy(np.asarray(yt, np.int64)).cuda()
MODELS = {
    "mlp": lambda: torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256),
        torch.nn.ReLU(), torch.nn.Linear(256, 10)),
    "lenet": lambda: torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 3), torch.nn.ReLU(), torch.nn.Conv2d(16, 32, 3), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(32 * 12 * 12, 10)),
}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def run(model_name, seed, precision):
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
    torch.manual_seed(seed)
    model = MODELS[model_name]().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda", enabled=precision == "fp16")
    loss_fn = torch.nn.CrossEntropyLoss()
    rng = np.random.default_rng(seed)
    for _ in range(5):
        order = torch.from_numpy(rng.permutation(len(y))).cuda()
        for i in range(0, len(y), 64):
            idx = order[i:i + 64]
            with torch.autocast("cuda", dtype=DTYPES.get(precision, torch.float32),
                                enabled=precision in DTYPES):
                loss = loss_fn(model(x[idx]), y[idx])
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    with torch.no_grad(), torch.autocast("cuda", dtype=DTYPES.get(precision, torch.float32),
                                         enabled=precision in DTYPES):
        right = sum((model(xt[i:i + 1000]).argmax(1) == yt[i:i + 1000]).sum().item()
                    for i in range(0, len(yt), 1000))
    return right / len(yt)


for model_name in MODELS:
    for seed in range(4):
        for precision in ("fp32", "tf32", "bf16", "fp16"):
            start = time.perf_counter()
            acc = run(model_name, seed, precision)
            print(json.dumps({"impl": "torch", "model": model_name, "seed": seed,
                              "precision": precision, "test_accuracy": acc,
                              "seconds": round(time.perf_counter() - start, 1)}), flush=True)
