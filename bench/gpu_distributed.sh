#!/usr/bin/env bash
# Data-parallel training on a GPU host, one part per call. Carry .gpu, .whl and .data
# (bench/gpu_setup.sh says what each holds). NVLink multicast stays off (NCCL_NVLS_ENABLE=0).
# Results under $OUT.
#   bash bench/gpu_distributed.sh scaling   (two or more GPUs) the distributed tests on
#                                           GPUs; `portanet bench --distributed` under
#                                           torchrun (NCCL, no MPI) of lenet-step, resnet-step
#                                           and mlp-big beside PyTorch DDP on 2 GPUs and on all
#                                           of them (bench-nccl-N-W.json); mlp-big over MPI
#                                           through host memory (bench-mpi.json); the LeNet
#                                           run on 1 GPU at 64 and on 2 at 64 a rank, twice in
#                                           turn, then on 1 at 128 (lenet-epoch.jsonl)
#   bash bench/gpu_distributed.sh mixed     (one GPU) a job of a cuda rank and an OpenCL rank
#                                           (opencl:0:0) trains the MLP 5 epochs at 2 x 64,
#                                           then with --balance, beside one process on cuda at
#                                           128 (mixed-vendor-job.jsonl)
source bench/gpu_setup.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1   # Open MPI, run as root
case "$1" in
scaling)
    # every torchrun job its own timeout and its whole log in $OUT: a hang costs one row
    n=$(nvidia-smi -L | wc -l)
    ranks="torchrun --standalone --nproc_per_node"
    timeout ${TEST_S:-300} python3 -m pytest -q -rs tests/test_distributed.py \
        -k "gpus or nccl" -p no:cacheprovider > "$OUT/distributed-tests.txt" 2>&1
    tail -3 "$OUT/distributed-tests.txt"
    sizes="$n"; [ "$n" -gt 2 ] && sizes="2 $n"
    for k in $sizes; do
        gpus=$(seq -s, 0 $((k - 1)))
        for w in lenet-step resnet-step mlp-big; do
            CUDA_VISIBLE_DEVICES=$gpus PORTANET_DEVICE="cuda:{local_rank}" timeout 300 \
                $ranks $k -m portanet.cli bench --distributed --workload $w \
                --json "$OUT/bench-nccl-$k-$w.json" > "$OUT/bench-nccl-$k-$w.log" 2>&1
            grep "^rank 0" "$OUT/bench-nccl-$k-$w.log" | head -2
        done
    done
    PORTANET_DIST=mpi PORTANET_DEVICE="cuda:{local_rank}" timeout 200 mpiexec -n 2 \
        python3 -m portanet.cli bench --distributed --workload mlp-big --no-torch \
        --json "$OUT/bench-mpi.json" > "$OUT/bench-mpi.log" 2>&1
    grep "^rank" "$OUT/bench-mpi.log"
    train="-m portanet.cli train --model lenet --epochs 3 --json"
    for round in 1 2; do
        timeout 200 python3 $train --device cuda --batch-size 64 2>/dev/null | tail -1 \
            | tee -a "$OUT/lenet-epoch.jsonl"
        PORTANET_DEVICE="cuda:{local_rank}" timeout 200 $ranks 2 $train --distributed \
            --batch-size 64 2>/dev/null | tail -1 | tee -a "$OUT/lenet-epoch.jsonl"
    done
    timeout 200 python3 $train --device cuda --batch-size 128 2>/dev/null | tail -1 \
        | tee -a "$OUT/lenet-epoch.jsonl" ;;
mixed)
    run() { timeout 280 "$@" --model mlp --epochs 5 --json 2>/dev/null | tail -1; }
    PORTANET_DEVICE=cuda:0,opencl:0:0 run mpiexec -n 2 python3 -m portanet.cli train \
        --distributed --batch-size 64 | tee -a "$OUT/mixed-vendor-job.jsonl"
    PORTANET_DEVICE=cuda:0,opencl:0:0 run mpiexec -n 2 python3 -m portanet.cli train \
        --distributed --balance --batch-size 64 | tee -a "$OUT/mixed-vendor-job.jsonl"
    run python3 -m portanet.cli train --device cuda --batch-size 128 \
        | tee -a "$OUT/mixed-vendor-job.jsonl" ;;
*)
    echo "usage: bash bench/gpu_distributed.sh scaling|mixed"; exit 2 ;;
esac
