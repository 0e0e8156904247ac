#!/usr/bin/env bash
# Issue 14 on the GPU machine (device tool). Carry .gpu (../shared/device), .whl (the
# safetensors wheel) and .data/fashion-mnist. One part per call (each fits the 10-minute
# limit):
#   bash bench/gpu_issue14.sh suite            the test suite (torch parity included)
#   bash bench/gpu_issue14.sh resnet DEVICE... the command on each DEVICE:
#       portanet train --model resnet --optimizer adam --schedule cosine --epochs 10
#           --dataset fashion-mnist (batch 64)
#   bash bench/gpu_issue14.sh torch            the same ResNet in PyTorch (bench/resnet_torch.py)
# Results under $OUT.
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source .gpu/gpu-env.sh || exit 1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/safetensors*.whl || exit 1
export PYTHONPATH=$PWD:$PYTHONPATH PORTANET_DATA=$PWD/.data PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
case "$1" in
suite)
    timeout 560 python3 -m pytest -q -rs -p no:cacheprovider tests "${@:2}" 2>&1 \
        | tee "$OUT/pytest.log" | tail -40 ;;
resnet)
    for d in "${@:2}"; do
        timeout 400 python3 -m portanet.cli train --model resnet --optimizer adam \
            --schedule cosine --epochs 10 --dataset fashion-mnist --device "$d" --json 2>&1 \
            | grep -v Warning | tee "$OUT/resnet-${d//:/-}.log" | tail -13
    done ;;
torch)
    timeout 300 python3 bench/resnet_torch.py --epochs 10 --batch-size 64 --device cuda \
        --json "$OUT/resnet-torch.json" 2>&1 | tee "$OUT/resnet-torch.log" | tail -14 ;;
*)
    echo "usage: bash bench/gpu_issue14.sh suite|resnet DEVICE...|torch"; exit 2 ;;
esac
