"""pn.gpt's baby GPT trained in PyTorch on the same Shakespeare split: the peer of

    portanet train --model gpt --dataset shakespeare --optimizer adamw --lr 1e-3 \
        --weight-decay 0.1 --clip-norm 1.0 --schedule "cosine(19, 1e-4)" --epochs 19 \
        --batch-size 64 --precision bf16 --device cuda --json

for comparing the held-out loss and the time (the initial weights differ: both start as
GPT-2 does). The network is portanet.peer.torch_gpt (nanoGPT's block, dropout where pn.gpt
has it, the attention's included); the windows are portanet.load_dataset("shakespeare",
context=256): 256 characters side by side from the corpus's first nine tenths, the held-out
loss the mean cross-entropy over every character of the windows of its last tenth. AdamW
with decay on the weights and embeddings (nanoGPT's groups), the rate of each epoch from
portanet's own schedule, the gradients' global norm clipped, batches of 64 shuffled each
epoch, bf16 autocast (or float32 with TF32 off, --precision fp32).

Time is taken between device synchronisations over the epochs, after a warm-up of a few
steps on a separate copy (CUDA context, cuBLAS, the allocator); evaluation is not timed.
Prints a line per epoch on stderr and one JSON object on stdout.

Usage: python bench/gpt_shakespeare_torch.py [--epochs 19] [--schedule "cosine(19, 1e-4)"]
       [--schedule-unit epoch|step]
       [--lr 1e-3] [--clip-norm 1.0] [--precision bf16|fp32] [--device cuda] [--seed 0]
       [--limit N]
"""
import argparse
import contextlib
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import portanet as pn                                       # noqa: E402
from portanet import schedules, text                        # noqa: E402
from portanet.models import GPT_STEP                        # noqa: E402
from portanet.peer import torch_gpt                         # noqa: E402

WARMUP_STEPS = 5


def main():
    args = argparse.ArgumentParser()
    args.add_argument("--epochs", type=int, default=19)
    args.add_argument("--schedule", default="cosine(19, 1e-4)")
    args.add_argument("--schedule-unit", default="epoch", choices=["epoch", "step"])
    args.add_argument("--lr", type=float, default=1e-3)
    args.add_argument("--weight-decay", type=float, default=0.1)
    args.add_argument("--clip-norm", type=float, default=1.0)
    args.add_argument("--batch-size", type=int, default=64)
    args.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    args.add_argument("--device", default="cuda")
    args.add_argument("--seed", type=int, default=0)
    args.add_argument("--limit", type=int, default=None, help="the first N windows (a check)")
    a = args.parse_args()

    import torch
    torch.manual_seed(a.seed)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    g = GPT_STEP
    (x, y), (x_val, y_val) = pn.load_dataset("shakespeare", context=g["context"])
    if a.limit:
        x, y, x_val, y_val = x[:a.limit], y[:a.limit], x_val[:a.limit], y_val[:a.limit]
    vocab = len(text.characters("shakespeare"))
    sizes = dict(vocab=vocab, context=g["context"], layers=g["layers"], heads=g["heads"],
                 dim=g["dim"], dropout=g["dropout"])
    device = torch.device(a.device)
    autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) \
        if a.precision == "bf16" else contextlib.nullcontext
    schedule = schedules.parse(a.schedule)
    cross = torch.nn.CrossEntropyLoss()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def made():
        model = torch_gpt(torch, **sizes).to(device)
        for name, p in model.named_parameters():         # GPT-2's start, as pn.gpt's
            if p.dim() >= 2:
                end = name.endswith(("proj.weight", "out.weight"))
                torch.nn.init.normal_(p, 0.0, 0.02 / (2 * g["layers"]) ** 0.5 if end else 0.02)
            elif name.endswith("bias"):
                torch.nn.init.zeros_(p)
        decayed = [p for p in model.parameters() if p.dim() >= 2]
        others = [p for p in model.parameters() if p.dim() < 2]
        opt = torch.optim.AdamW([{"params": decayed, "weight_decay": a.weight_decay},
                                 {"params": others, "weight_decay": 0.0}], lr=a.lr)
        return model, opt

    def step(model, opt, xb, yb):
        with autocast():
            loss = cross(model(xb).flatten(0, 1).float(), yb.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip_norm)
        opt.step()
        return loss

    xs, ys = (torch.tensor(v, dtype=torch.long, device=device) for v in (x, y))
    spare, spare_opt = made()                       # warm-up on a copy
    for _ in range(WARMUP_STEPS):
        step(spare, spare_opt, xs[:a.batch_size], ys[:a.batch_size])
    del spare, spare_opt
    model, opt = made()
    rng = np.random.default_rng(a.seed)
    seconds, losses = [], []
    sync()
    steps = 0
    for epoch in range(a.epochs):
        lr = schedule(epoch, a.lr)
        for group in opt.param_groups:
            group["lr"] = lr
        order = torch.tensor(rng.permutation(len(x)), device=device)
        model.train()
        start, total = time.perf_counter(), torch.zeros((), device=device)
        for i in range(0, len(x), a.batch_size):
            if a.schedule_unit == "step":      # the rate of each step, as portanet's
                lr = schedule(steps, a.lr)
                for group in opt.param_groups:
                    group["lr"] = lr
            steps += 1
            take = order[i:i + a.batch_size]
            total += step(model, opt, xs[take], ys[take]).detach() * len(take)
        sync()
        seconds.append(time.perf_counter() - start)
        losses.append(float(total) / len(x))
        print(f"epoch {epoch + 1}/{a.epochs}  loss {losses[-1]:.4f}  lr {lr:.3g}  "
              f"{seconds[-1]:.2f} s", file=sys.stderr)
    model.eval()
    val, count = 0.0, 0
    with torch.no_grad(), autocast():
        xv, yv = (torch.tensor(v, dtype=torch.long, device=device) for v in (x_val, y_val))
        for i in range(0, len(xv), 256):
            logits = model(xv[i:i + 256]).float()
            val += float(torch.nn.functional.cross_entropy(
                logits.flatten(0, 1), yv[i:i + 256].flatten(), reduction="sum"))
            count += yv[i:i + 256].numel()
    print(json.dumps({"library": "torch " + torch.__version__, "device": a.device,
                      "precision": a.precision, "epochs": a.epochs, "steps": steps,
                      "schedule": repr(schedule), "schedule_unit": a.schedule_unit,
                      "train_windows": len(x),
                      "val_windows": len(x_val), "epoch_seconds": seconds,
                      "seconds": sum(seconds), "final_loss": losses[-1],
                      "val_loss": val / count}))


if __name__ == "__main__":
    main()
