#!/usr/bin/env bash
# Issue 12 on the GPU machine (device tool). Carry .gpu (../shared/device) and .whl (the
# safetensors wheel). One part per call (each fits the 10-minute limit):
#   bash bench/gpu_issue12.sh sweep     our GEMM kernel's tilings at 4096^3 (gpu_compare
#                                       --variants) and the GEMM table against cuBLAS
#   bash bench/gpu_issue12.sh tune [D]  portanet tune on D (default: cuda and opencl:nvidia),
#                                       1024, 2048 and 4096, its database under $OUT
#   bash bench/gpu_issue12.sh compare   the GEMM table with the shipped tuned tilings and with
#                                       the untuned defaults, and portanet bench's gemm
#   bash bench/gpu_issue12.sh bench     portanet bench's workloads, cuda and
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
    for d in ${2:-cuda opencl:nvidia}; do
        timeout ${LIMIT:-540} python3 -m portanet.cli tune --device $d --budget ${BUDGET:-30} \
            --output "$OUT/tuned-h100.json" --json "$OUT/tune-h100-${d%%:*}.json" 2>&1 \
            | tee "$OUT/tune-${d%%:*}.log"
    done ;;
compare)    # the GEMM table (the shipped tuned tilings), then with the untuned defaults
    timeout 200 python3 bench/gpu_compare.py --only gemm --opencl opencl:nvidia \
        --json "$OUT/gemm-tuned.json" 2>&1 | grep -v Warning | tee "$OUT/gemm-tuned.log"
    PORTANET_TUNING=off timeout 200 python3 bench/gpu_compare.py --only gemm \
        --opencl opencl:nvidia --json "$OUT/gemm-default.json" 2>&1 | grep -v Warning \
        | tee "$OUT/gemm-default.log"
    timeout 150 python3 -m portanet.cli bench --device cuda --device opencl:nvidia \
        --workload gemm --json "$OUT/bench-gemm.json" 2>&1 | grep -v Warning \
        | tee "$OUT/bench-gemm.log" | tail -12 ;;
bench)
    timeout 300 python3 -m portanet.cli bench --device cuda --device opencl:nvidia \
        --workload gemm --workload mlp-big --workload mlp-small --workload lenet-step \
        --workload lenet-infer --json "$OUT/bench.json" 2>&1 \
        | grep -v Warning | tee "$OUT/bench.log" | tail -30 ;;
suite)
    timeout 560 python3 -m pytest -q -rs -p no:cacheprovider tests "${@:2}" 2>&1 \
        | tee "$OUT/pytest.log" | tail -40 ;;
*)
    echo "usage: bash bench/gpu_issue12.sh sweep|tune|compare|bench|suite"; exit 2 ;;
esac
