#!/usr/bin/env bash
# Data-parallel training on a GPU host, one part per call. Carry .gpu, .whl (with .whl/mpi:
# mpi4py and mpich, and .whl/nccl: nccl4py, as cp312 wheels, `pip download --only-binary=:all:
# --python-version 3.12 --no-deps ...`) and .data; the wheels go in only where an import
# fails. NVLink multicast stays off (NCCL_NVLS_ENABLE=0). Results under $OUT.
#   bash bench/gpu_distributed.sh scaling   (two or more GPUs) the distributed tests, then
#                                           `portanet bench --distributed` of mlp-big over
#                                           NCCL and over MPI through host memory (throughput,
#                                           scaling efficiency: bench-nccl.json,
#                                           bench-mpi.json), and the LeNet epoch on 1 and 2
#                                           GPUs over NCCL (lenet-epoch.txt)
#   bash bench/gpu_distributed.sh mixed     (one GPU) a job of a cuda rank and an OpenCL rank
#                                           (opencl:0:0) trains the MLP 5 epochs at 2 x 64,
#                                           then with --balance, beside one process on cuda at
#                                           128 (mixed-vendor-job.jsonl)
source bench/gpu_setup.sh
python3 -c "import nccl.core" 2>/dev/null || python3 -m pip install -q --no-index --no-deps \
    --target /tmp/site .whl/nccl/*.whl 2>/dev/null
command -v mpiexec > /dev/null || { python3 -m pip install -q --no-index --no-deps \
    --target /tmp/site .whl/mpi/*.whl && export PATH=/tmp/site/bin:$PATH; } || exit 1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1   # Open MPI, run as root
case "$1" in
scaling)
    timeout 300 python3 -m pytest -q -rs tests/test_distributed.py -p no:cacheprovider 2>&1 \
        | tail -15 | tee "$OUT/distributed-tests.txt"
    for engine in nccl mpi; do
        PORTANET_DIST=$engine PORTANET_DEVICE="cuda:{local_rank}" timeout 200 mpiexec -n 2 \
            python3 -m portanet.cli bench --distributed --workload mlp-big \
            --json "$OUT/bench-$engine.json" 2>&1 | grep -v Warning | tee -a "$OUT/bench.txt"
    done
    for n in 1 2; do
        PORTANET_DIST=nccl PORTANET_DEVICE="cuda:{local_rank}" timeout 200 mpiexec -n $n \
            python3 -m portanet.cli train --model lenet --epochs 2 --distributed --json \
            2>&1 | grep -v Warning | tail -3 | sed "s/^/$n GPU: /" | tee -a "$OUT/lenet-epoch.txt"
    done ;;
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
