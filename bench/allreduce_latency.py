"""Latency of an all-reduce of LeNet's gradient (50,890 floats, 200 KB) between the GPUs of
one host, in PyTorch: NCCL eager, NCCL in a CUDA graph (as portanet's recorded step runs
it), and PyTorch's symmetric-memory all-reduces (one-shot: each GPU reads the others'
buffers over NVLink), eager and in a graph, where this PyTorch has them. Each rank prints
its microseconds per all-reduce.

Usage: NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc_per_node 2 bench/allreduce_latency.py
"""
import time

import torch
import torch.distributed as dist

ELEMENTS = 50890        # LeNet's parameters: its SGD velocity, one bucket
CALLS = 3000            # timed eagerly; a graph holds IN_GRAPH of them
IN_GRAPH = 20


def per_call(call, calls=CALLS):
    """Microseconds a call of `call` takes, after a warm-up, the ranks started together."""
    for _ in range(100):
        call()
    torch.cuda.synchronize()
    dist.barrier()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def in_graph(call):
    """Microseconds one call takes as IN_GRAPH of them recorded in a CUDA graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):       # NCCL's and symmetric memory's first calls set up
        for _ in range(3):
            call()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(IN_GRAPH):
            call()
    return per_call(graph.replay, CALLS // IN_GRAPH) / IN_GRAPH


def main():
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(rank)
    x = torch.randn(ELEMENTS, device="cuda")
    out = {"nccl eager": per_call(lambda: dist.all_reduce(x)),
           "nccl graph": in_graph(lambda: dist.all_reduce(x))}
    try:
        import torch.distributed._symmetric_memory as symm_mem
        name = dist.group.WORLD.group_name
        buffer = symm_mem.empty(ELEMENTS, device="cuda")
        symm_mem.rendezvous(buffer, name)
        buffer.copy_(x)
        one_shot = torch.ops.symm_mem.one_shot_all_reduce
        out["symmetric one-shot eager"] = per_call(lambda: one_shot(buffer, "sum", name))
        out["symmetric one-shot graph"] = in_graph(lambda: one_shot(buffer, "sum", name))
    except Exception as e:              # an older PyTorch, or no peer access
        out["symmetric memory"] = f"unavailable: {type(e).__name__}: {e}"[:200]
    print(rank, {k: round(v, 2) if isinstance(v, float) else v for k, v in out.items()},
          flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
