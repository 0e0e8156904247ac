#!/usr/bin/env bash
# One call on the GPU machine (device tool): install the kit, run the test suite on every
# device there, train on cpu / cuda / NVIDIA OpenCL with the same seed, and benchmark
# against PyTorch. Needs .gpu (../shared/device), .whl (the safetensors wheel: pip download
# safetensors --no-deps --python-version 3.12 --only-binary=:all: -d .whl) and
# .data/fashion-mnist carried.
# Usage: bash bench/gpu_run.sh [tests,train,lenet,lenet-own,bench,portanet-bench,own-bench]   (results under $OUT)
set -o pipefail
STEPS=${1:-tests,train,bench}
has() { [[ ",$STEPS," == *",$1,"* ]]; }
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source .gpu/gpu-env.sh || exit 1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:$PYTHONPATH PORTANET_DATA=$PWD/.data PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv
python3 -m portanet.cli devices
if has tests; then
    timeout 540 python3 -m pytest -q -rs -p no:cacheprovider tests 2>&1 | tee "$OUT/pytest.log" | tail -25
fi
if has train; then
    for d in cuda opencl cpu; do
        timeout 200 python3 -m portanet.cli train --model mlp --dataset fashion-mnist \
            --epochs 5 --device $d --seed 0 --json 2>/dev/null | tee -a "$OUT/train.log" | tail -1
    done
fi
if has lenet; then
    for d in cuda opencl; do
        timeout 250 python3 -m portanet.cli train --model lenet --dataset fashion-mnist \
            --epochs 5 --device $d --seed 0 --json 2>/dev/null | tee -a "$OUT/train-lenet.log" | tail -1
    done
    timeout 300 python3 bench/lenet_compare.py --json "$OUT/lenet.json" 2>&1 | tee "$OUT/lenet.log"
fi
if has portanet-bench; then
    timeout 400 python3 -m portanet.cli bench --device cuda --device opencl:0:0 \
        --json "$OUT/bench-h100.json" --plot "$OUT/bench-h100.png" 2>&1 | tee "$OUT/portanet-bench.log"
fi
if has lenet-own; then
    PORTANET_GEMM=own timeout 200 python3 bench/lenet_compare.py --devices opencl,cuda --epochs 1 \
        --json "$OUT/lenet-own.json" 2>&1 | tee "$OUT/lenet-own.log" | tail -5
fi
if has own-bench; then
    PORTANET_GEMM=own timeout 300 python3 -m portanet.cli bench --device cuda --device opencl:0:0 \
        --workload gemm --workload mlp-big --workload mlp-small --workload lenet-step \
        --json "$OUT/bench-own-h100.json" 2>&1 | tee "$OUT/portanet-bench-own.log" | tail -20
fi
if has bench; then
    timeout 400 python3 bench/gpu_compare.py ${TUNE:+--variants} --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log"
fi
