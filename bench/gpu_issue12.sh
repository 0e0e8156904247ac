#!/usr/bin/env bash
# Issue 12 on the GPU machine (device tool). Carry .gpu (../shared/device) and .whl (the
# safetensors wheel). One part per call (each fits the 10-minute limit):
#   bash bench/gpu_issue12.sh sweep     our GEMM kernel's tilings at 4096^3 (gpu_compare
#                                       --variants) and the GEMM table against cuBLAS
#   bash bench/gpu_issue12.sh tune      portanet tune on cuda and opencl:nvidia, its database
#                                       under $OUT, then the GEMM table with the tuned tiling
#   bash bench/gpu_issue12.sh bench     portanet bench's gemm and MLP workloads, cuda and
#                                       opencl:nvidia (the shipped tuned tilings)
#   bash bench/gpu_issue12.sh suite     the test suite on the GPUs
# Results under $OUT.
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source .gpu/gpu-env.sh || exit 1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/safetensors*.whl || exit 1
export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
case "$1" in
sweep)
    timeout 560 python3 bench/gpu_compare.py --variants --only gemm --opencl opencl:nvidia \
        --json "$OUT/sweep.json" 2>&1 | grep -v Warning | tee "$OUT/sweep.log" ;;
tune)
    export XDG_CACHE_HOME=/tmp/cache
    timeout 420 python3 -m portanet.cli tune --device cuda --device opencl:nvidia --budget ${BUDGET:-40} --size ${SIZE:-4096} \
        --output "$OUT/tuned-h100.json" --json "$OUT/tune-h100.json" 2>&1 | tee "$OUT/tune.log"
    mkdir -p /tmp/cache/portanet && cp "$OUT/tuned-h100.json" /tmp/cache/portanet/tuning.json
    timeout 150 python3 bench/gpu_compare.py --only gemm --opencl opencl:nvidia \
        --json "$OUT/gemm-tuned.json" 2>&1 | grep -v Warning | tee "$OUT/gemm-tuned.log" ;;
bench)
    timeout 300 python3 -m portanet.cli bench --device cuda --device opencl:nvidia \
        --workload gemm --workload mlp-big --workload mlp-small --json "$OUT/bench.json" 2>&1 \
        | grep -v Warning | tee "$OUT/bench.log" | tail -30 ;;
suite)
    timeout 560 python3 -m pytest -q -rs -p no:cacheprovider tests "${@:2}" 2>&1 \
        | tee "$OUT/pytest.log" | tail -40 ;;
*)
    echo "usage: bash bench/gpu_issue12.sh sweep|tune|bench|suite"; exit 2 ;;
esac
