#!/usr/bin/env bash
# The result set of one GPU host (docs/benchmarks.md): `portanet bench` beside PyTorch, the
# JSON, its plot and the printed table under $OUT. One part per call (each fits 10 minutes):
#   bash bench/gpu_bench.sh fp32        every workload on cuda and the GPU's OpenCL device
#                                       ($OPENCL, default opencl:0:0), PyTorch eager and in
#                                       a CUDA graph beside cuda: bench.json, bench.png
#   bash bench/gpu_bench.sh precisions  gemm and the MLP and LeNet steps on cuda in fp32,
#                                       tf32, bf16 and fp16, PyTorch computing alike:
#                                       precisions.json, precisions.png
#   bash bench/gpu_bench.sh resnet      the ResNet's step on cuda in fp32, bf16 and fp16 at
#                                       batch 128 and 512, PyTorch's beside it, both peaks
#                                       (bench/step_batches.py): resnet-step.jsonl
source bench/gpu_setup.sh
case "$1" in
fp32)
    timeout 560 python3 -m portanet.cli bench --device cuda --device "${OPENCL:-opencl:0:0}" \
        --json "$OUT/bench.json" --plot "$OUT/bench.png" 2>&1 | grep -v Warning \
        | tee "$OUT/bench.txt" | tail -30 ;;
precisions)
    timeout 560 python3 -m portanet.cli bench --device cuda --workload gemm \
        --workload mlp-big --workload mlp-small --workload lenet-step \
        --precision fp32 --precision tf32 --precision bf16 --precision fp16 \
        --json "$OUT/precisions.json" --plot "$OUT/precisions.png" 2>&1 | grep -v Warning \
        | tee "$OUT/precisions.txt" | tail -40 ;;
resnet)
    timeout 560 python3 bench/step_batches.py resnet-step --device cuda --batch 128 \
        --batch 512 --precision fp32 --precision bf16 --precision fp16 --torch 2>&1 \
        | grep -v Warning | tee "$OUT/resnet-step.jsonl" ;;
*)
    echo "usage: bash bench/gpu_bench.sh fp32|precisions|resnet"; exit 2 ;;
esac
