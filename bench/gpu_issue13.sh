#!/usr/bin/env bash
# Issue 13 on the GPU machine (device tool), one call: `portanet devices --check` on every
# device there, the MLP of the cross-implementation table (docs/ARCHITECTURE.md, "Every
# OpenCL implementation") on cuda and NVIDIA's OpenCL, and the test suite. Carry .gpu
# (../shared/device), .whl (the safetensors wheel) and .data/fashion-mnist.
# Usage: bash bench/gpu_issue13.sh        (results under $OUT)
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source .gpu/gpu-env.sh || exit 1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/safetensors*.whl || exit 1
export PYTHONPATH=$PWD:$PYTHONPATH PORTANET_DATA=$PWD/.data PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv
python3 -m portanet.cli devices 2>&1 | tee "$OUT/devices.log"
/usr/bin/time -f "devices --check: %e s" python3 -m portanet.cli devices --check 2>&1 | tee "$OUT/check.log"
for lr in 0.02 0.005; do
    for d in cuda opencl:nvidia; do
        timeout 200 python3 -m portanet.cli train --model mlp --dataset fashion-mnist --epochs 1 \
            --device $d --seed 0 --lr $lr --json 2>/dev/null | tail -1 | tee -a "$OUT/xtable.jsonl"
    done
done
timeout 420 python3 -m pytest -q -rs -p no:cacheprovider tests 2>&1 | tee "$OUT/pytest.log" | tail -30
