"""PyTorch as the peer of `portanet bench`: the same workloads in PyTorch, timed as ours
(timing.py), where torch is importable: a training step eager or captured in a CUDA
graph, its peak memory, and DDP's step in the same distributed job."""
import contextlib

from . import models
from .errors import PortanetError
from .models import GPT_STEP, MLPS
from .timing import STEP_SAMPLE_S, in_step, measure


def device_of(bk):
    """The torch device string matching a portanet backend, or (None, reason)."""
    try:
        import torch
    except ImportError:
        return None, "PyTorch is not installed (pip install torch, for this column alone)"
    if bk.kind == "cpu":
        return "cpu", None
    if bk.kind == "cuda":
        if torch.cuda.is_available():
            return f"cuda:{bk.name.split(':')[1]}", None
        return None, "PyTorch has no CUDA here"
    return None, "PyTorch has no OpenCL device"


def torch_case(workload, case, device, graph=False, precision="fp32"):
    """Seconds of the same workload and case in PyTorch float32 computing as `precision`
    asks: TF32 allowed (tf32) or not, under autocast to bfloat16 or float16 (bf16, fp16;
    fp16's loss scaled by a GradScaler): eager, or with graph=True the whole training step
    captured once in a CUDA graph and replayed (the strongest peer of a small step, whose
    eager time is mostly Python and launches). On CUDA the figures hold `peak_bytes` too:
    torch.cuda.max_memory_allocated() over the warm-up and timed calls, less what was
    allocated before the case made its model and batch (as portanet's peak counts its
    own, the batch included)."""
    import torch
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    figures = torch_figures(torch, workload, case, device, graph, precision)
    if cuda:
        torch.cuda.synchronize(device)
        figures["peak_bytes"] = torch.cuda.max_memory_allocated(device) - base
    return figures


def torch_figures(torch, workload, case, device, graph, precision):
    """torch_case's timing (see there)."""
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = precision == "tf32"
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    autocast = ((lambda: torch.autocast(device.split(":")[0], dtype=half)) if half else
                contextlib.nullcontext)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    if workload == "gemm":
        n = int(case.split("^")[0])
        a, b = (torch.randn(n, n, device=device) for _ in range(2))
        if half:
            a, b = a.to(half), b.to(half)
        c = torch.empty(n, n, device=device, dtype=a.dtype)
        return measure(lambda: torch.mm(a, b, out=c), sync, repeats=10, inner=3)
    m = int(case.split()[1]) if case.startswith("batch") else int(case.split()[0])
    model, x, y, loss_fn = torch_model(torch, workload, m, device)
    if workload == "lenet-infer":
        host = x.cpu().numpy()

        def infer():
            with torch.no_grad(), autocast():
                model(torch.from_numpy(host).to(device)).softmax(1).cpu()
        return measure(infer, sync, repeats=5)
    opt = torch_optimizer(torch, workload, model, capturable=graph)
    scaler = torch.amp.GradScaler(enabled=precision == "fp16")

    def step():
        opt.zero_grad()
        with autocast():
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    if graph:
        if precision == "fp16":
            raise PortanetError("GradScaler's step reads its overflow check on the host, "
                                "which a CUDA graph cannot capture")
        step = torch_graph(torch, step, opt)
    return measure(step, sync, repeats=10, inner=3, sample_s=STEP_SAMPLE_S)


def torch_optimizer(torch, workload, model, capturable=False):
    """The optimizer the bench's step of `workload` takes, as ours: SGD with momentum, or
    for gpt-step nanoGPT's AdamW and its decay groups (capturable: its step counts on the
    device, for a CUDA graph)."""
    if workload != "gpt-step":
        return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    decayed = [p for p in model.parameters() if p.dim() >= 2]
    others = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decayed, "weight_decay": 0.1},
                              {"params": others, "weight_decay": 0.0}], lr=1e-3,
                             betas=(0.9, 0.99), capturable=capturable)


def torch_model(torch, workload, m, device):
    """(model, x, y, loss function) of a step or inference workload on m samples."""
    if workload == "gpt-step":
        g = GPT_STEP
        model = torch_gpt(torch, **{k: g[k] for k in ("vocab", "context", "layers", "heads",
                                                       "dim", "dropout")}).to(device)
        x, y = (torch.randint(0, g["vocab"], (m, g["context"]), device=device)
                for _ in range(2))
        cross = torch.nn.CrossEntropyLoss()
        return model, x, y, lambda logits, y: cross(logits.flatten(0, 1), y.flatten())
    if workload in MLPS:
        sizes, acts, loss, _ = MLPS[workload]
        layers = []
        for i, a in enumerate(acts):
            layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
            if i < len(acts) - 1:
                layers.append({"tanh": torch.nn.Tanh, "sigmoid": torch.nn.Sigmoid,
                               "relu": torch.nn.ReLU}[a]())
        model = torch.nn.Sequential(*layers).to(device)
        x = torch.randn(m, sizes[0], device=device)
        if loss == "softmax_cross_entropy":
            y = torch.randint(0, sizes[-1], (m,), device=device)
            loss_fn = torch.nn.CrossEntropyLoss()
        else:
            y = (torch.rand(m, sizes[-1], device=device) > 0.5).float()
            loss_fn = torch.nn.BCEWithLogitsLoss()
        return model, x, y, loss_fn
    model = (torch_resnet(torch) if workload == "resnet-step" else torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 3), torch.nn.ReLU(), torch.nn.Conv2d(16, 32, 3),
        torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(),
        torch.nn.Linear(4608, 10))).to(device)
    x = torch.rand(m, 1, 28, 28, device=device)
    return model, x, torch.randint(0, 10, (m,), device=device), torch.nn.CrossEntropyLoss()


def torch_ddp_case(workload, m, device, group):
    """PyTorch's DDP (NCCL) on the same job as portanet's distributed bench: the workload's
    float32 step (its optimizer: torch_optimizer) on m samples a rank, alone and wrapped in
    DistributedDataParallel (buckets overlapped with backward, as DDP does by default),
    each timed as the bench
    times ours: {"alone": figures, "distributed": figures}. torch.distributed joins once a
    process: at the launcher's MASTER_ADDR and MASTER_PORT, or under MPI at an address rank
    0 gives through the job's channel."""
    import socket

    import torch
    import torch.distributed as dist
    torch.cuda.set_device(device)
    if not dist.is_initialized() and group.channel.kind == "tcp":
        # torchrun's store (or rank 0's, under srun) at MASTER_ADDR:MASTER_PORT
        dist.init_process_group("nccl", init_method="env://", rank=group.rank,
                                world_size=group.size)
    elif not dist.is_initialized():
        where = None
        if group.rank == 0:
            with socket.socket() as s:
                s.bind(("", 0))
                where = (socket.gethostname(), s.getsockname()[1])
        host, port = group.channel.bcast(where)
        dist.init_process_group("nccl", init_method=f"tcp://{host}:{port}", rank=group.rank,
                                world_size=group.size)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    sync = torch.cuda.synchronize
    out = {}
    for name in ("alone", "distributed"):
        model, x, y, loss_fn = torch_model(torch, workload, m, device)
        if name == "distributed":
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device])
        opt = torch_optimizer(torch, workload, model)

        def step():
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
        out[name] = measure(step, sync, repeats=10, inner=3, sample_s=STEP_SAMPLE_S) \
            if name == "alone" else measure(step, sync, **in_step(group, out["alone"]))
    return out


def torch_resnet(torch):
    """models.resnet in PyTorch: the same layers (a 1x1 convolution with bias as the
    projection where a block changes the shape), in the same order."""
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, c_in, c, stride):
            super().__init__()
            self.inner = nn.Sequential(
                nn.Conv2d(c_in, c, 3, stride, 1), nn.BatchNorm2d(c), nn.ReLU(),
                nn.Conv2d(c, c, 3, 1, 1), nn.BatchNorm2d(c))
            self.proj = nn.Conv2d(c_in, c, 1, stride) if (c_in, stride) != (c, 1) else None

        def forward(self, x):
            return torch.relu(self.inner(x) + (self.proj(x) if self.proj else x))

    layers, c = [nn.Conv2d(1, 32, 3, 1, 1), nn.BatchNorm2d(32), nn.ReLU()], 32
    for width, stride in models.RESNET_BLOCKS:
        layers.append(Block(c, width, stride))
        c = width
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.3),
                         nn.Linear(c, 10))


def torch_gpt(torch, vocab, context, layers, heads, dim, dropout):
    """pn.gpt's network in PyTorch, as nanoGPT writes it: token and position embeddings,
    pre-norm blocks of causal scaled_dot_product_attention and a gelu MLP, a LayerNorm and
    the output product; dropout where pn.gpt has it (the attention's probabilities too)."""
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
            self.fc, self.out = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
            self.drop = nn.Dropout(dropout)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(dim, dim=2)
            q, k, v = (z.view(b, t, heads, dim // heads).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                               dropout_p=dropout if self.training else 0.0)
            x = x + self.drop(self.proj(y.transpose(1, 2).reshape(b, t, dim)))
            return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, dim), nn.Embedding(context, dim)
            self.drop = nn.Dropout(dropout)
            self.blocks = nn.Sequential(*[Block() for _ in range(layers)])
            self.ln, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab)

        def forward(self, ids):
            pos = torch.arange(ids.shape[1], device=ids.device)
            x = self.drop(self.wte(ids) + self.wpe(pos))
            return self.head(self.ln(self.blocks(x)))
    return GPT()


def torch_graph(torch, step, opt):
    """step captured in a CUDA graph as PyTorch's documentation does it: warm-up on a side
    stream (the optimizer creates its momentum buffers there), then one capture with the
    gradients set to None first, so that backward allocates them from the graph's pool."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        step()
    return graph.replay
