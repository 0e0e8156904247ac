/* peer.cu: a small bucket summed over the ranks of one host by reading each other's memory
   (CUDA IPC, over NVLink where the GPUs have it), for the buckets where an NCCL all-reduce
   costs its protocol's latency more than its bytes (portanet/backends/peer_sum.py's PeerSum).

   Each rank copies weight x into its own staging buffer, tells every rank that its part is
   there (a flag in that rank's memory) and waits for theirs, then adds up the ranks' parts
   in rank order: the same sum, to the bit, on every rank. A block does this for its own
   slice of x, with flags of its own, so no block waits for the whole grid. Each launch is
   one step of a count each block keeps (`counts`), the same on every rank since every rank
   launches the same buckets in the same order; the staging buffers have two halves, used
   by turns, so a rank that runs ahead into the next launch writes the half no rank is still
   reading. The count lives in device memory: a recorded step replays it. */
#include "prelude.h"

/* a flag written for another GPU (and the host) to see: after this thread's earlier
   writes, and those its block made before a barrier (the fence is cumulative) */
DEVICE void store_release(int *flag, const int value) {
    asm volatile("st.release.sys.global.s32 [%0], %1;" :: "l"(flag), "r"(value) : "memory");
}

DEVICE int load_acquire(const int *flag) {
    int value;
    asm volatile("ld.acquire.sys.global.s32 %0, [%1];" : "=r"(value) : "l"(flag) : "memory");
    return value;
}

/* x[0..n) <- sum over the ranks r of weight_r x_r[0..n). table: the ranks' staging buffers
   (each two halves of `half` reals) as addresses, then the ranks' flags (ranks x blocks
   ints each); counts: this rank's launches so far, per block. Every rank launches it with
   the same grid. */
KERNEL void peer_sum(GLOBAL real *x, const int n, const real weight,
                     const unsigned long long *table, int *counts, const int rank,
                     const int ranks, const int half)
{
    LOCAL int step;
    const int b = blockIdx.x, blocks = gridDim.x;
    const int first = b * blockDim.x + threadIdx.x, stride = blocks * blockDim.x;
    if (threadIdx.x == 0)
        step = counts[b] + 1;
    __syncthreads();
    const int turn = (step & 1) * half;
    real *mine = (real *)table[rank] + turn;
    for (int i = first; i < n; i += stride)
        mine[i] = weight * x[i];
    __syncthreads();
    if (threadIdx.x < ranks) {          /* thread p: tell rank p, then wait for rank p */
        const int p = threadIdx.x;
        __threadfence_system();
        store_release((int *)table[ranks + p] + rank * blocks + b, step);
        const int *theirs = (const int *)table[ranks + rank] + p * blocks + b;
        while (load_acquire(theirs) < step) {
        }
    }
    __syncthreads();
    for (int i = first; i < n; i += stride) {
        real sum = 0;
        for (int p = 0; p < ranks; p++)
            sum += __ldcv((const real *)table[p] + turn + i);   /* not from a stale cache */
        x[i] = sum;
    }
    if (threadIdx.x == 0)
        counts[b] = step;
}
