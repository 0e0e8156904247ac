#!/usr/bin/env bash
# Issue 16 on two GPUs (device kind nvidia-h200-x2; ask `status` first). Carry .gpu
# (../shared/device), .whl (safetensors; .whl/mpi: mpi4py and mpich; .whl/nccl: nccl4py,
# `pip download --only-binary=:all: --python-version 3.12 --no-deps nccl4py`) and .data
# (Fashion-MNIST). The image has mpi4py, cuda-core and nvidia-nccl-cu13 (KINDS.md); carried
# wheels go in only where an import fails. NVLink multicast stays off (NCCL_NVLS_ENABLE=0,
# as the machine sets it). Results under $OUT.
#   bash bench/gpu_issue16.sh nccl   the distributed tests on the GPUs (NCCL and MPI);
#                                    portanet bench --distributed mlp-big over NCCL and MPI
#                                    (throughput, scaling efficiency), the LeNet epoch on 1
#                                    and 2 GPUs
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source .gpu/gpu-env.sh > /dev/null || exit 1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/safetensors*.whl || exit 1
python3 -c "import nccl.core" 2>/dev/null || python3 -m pip install -q --no-index --no-deps \
    --target /tmp/site .whl/nccl/*.whl || exit 1
command -v mpiexec > /dev/null || { python3 -m pip install -q --no-index --no-deps \
    --target /tmp/site .whl/mpi/*.whl && export PATH=/tmp/site/bin:$PATH; } || exit 1
export PYTHONUNBUFFERED=1 PORTANET_DATA=$PWD/.data PYTHONPATH=$PWD:$PYTHONPATH
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1   # the image runs as root
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
case "$1" in
nccl)
    timeout 300 python3 -m pytest -q -rs tests/test_distributed.py -p no:cacheprovider 2>&1 \
        | tail -15 | tee "$OUT/distributed-tests.log"
    for engine in nccl mpi; do
        PORTANET_DIST=$engine PORTANET_DEVICE="cuda:{local_rank}" timeout 200 mpiexec -n 2 \
            python3 -m portanet.cli bench --distributed --workload mlp-big --workload \
            lenet-step --json "$OUT/bench-$engine.json" 2>&1 | grep -v Warning \
            | tee -a "$OUT/bench.log"
    done
    for n in 1 2; do
        PORTANET_DIST=nccl PORTANET_DEVICE="cuda:{local_rank}" timeout 200 mpiexec -n $n \
            python3 -m portanet.cli train --model lenet --epochs 2 --distributed --json \
            2>&1 | grep -v Warning | tail -3 | sed "s/^/$n GPU: /" | tee -a "$OUT/epoch.log"
    done ;;
esac
