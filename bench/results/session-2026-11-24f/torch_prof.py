"""PyTorch's mlp-big step (as the bench's peer runs it) under torch.profiler: CUDA time
per kernel."""
import torch
from portanet import bench
import portanet.bench as B
torch.backends.cuda.matmul.allow_tf32 = False
sizes, acts, loss, _ = B.MLPS["mlp-big"]
m = 10000
layers = []
for i in range(len(sizes) - 1):
    layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
    if i < len(sizes) - 2:
        layers.append({"tanh": torch.nn.Tanh, "sigmoid": torch.nn.Sigmoid}[acts[i]]())
model = torch.nn.Sequential(*layers).cuda()
x = torch.randn(m, sizes[0], device="cuda")
y = (torch.rand(m, sizes[-1], device="cuda") > 0.5).float()
loss_fn = torch.nn.BCEWithLogitsLoss()
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
def step():
    opt.zero_grad(set_to_none=True)
    loss_fn(model(x), y).backward()
    opt.step()
for _ in range(5):
    step()
torch.cuda.synchronize()
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
    for _ in range(5):
        step()
    torch.cuda.synchronize()
print(p.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=90))
