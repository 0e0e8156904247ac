#!/usr/bin/env bash
# Training runs on a GPU host (Fashion-MNIST carried in .data), one part per call:
#   bash bench/gpu_train.sh mlp          `portanet train --model mlp`, 5 epochs, seed 0, on
#                                        cuda, NVIDIA's OpenCL and cpu: the same seed's test
#                                        accuracy on each (train.jsonl)
#   bash bench/gpu_train.sh lenet-epoch  the LeNet epoch against PyTorch's
#                                        (bench/lenet_epoch.py, 4 epochs: lenet-epoch.json)
#   bash bench/gpu_train.sh resnet       `portanet train --model resnet --optimizer adam
#                                        --schedule cosine --epochs 10` on cuda and NVIDIA's
#                                        OpenCL, then the same network in PyTorch
#                                        (bench/resnet_epoch_torch.py): resnet-train.jsonl
#   bash bench/gpu_train.sh accuracy     test accuracy over seeds 0-9 of LeNet and the MLP in
#                                        every precision on cuda (bench/seed_accuracy.py:
#                                        seed-accuracy.jsonl); with GEMM=vendor, fp32 with
#                                        every product on cuBLAS (the order of sums changed
#                                        alone: seed-accuracy-fp32-cublas.jsonl)
# Results under $OUT.
source bench/gpu_setup.sh
case "$1" in
mlp)
    for d in cuda opencl:0:0 cpu; do
        timeout 180 python3 -m portanet.cli train --model mlp --dataset fashion-mnist \
            --epochs 5 --device $d --seed 0 --json 2>/dev/null | tail -1 \
            | tee -a "$OUT/train.jsonl"
    done ;;
lenet-epoch)
    timeout 500 python3 bench/lenet_epoch.py --devices cuda,opencl:0:0 --epochs 4 \
        --json "$OUT/lenet-epoch.json" 2>&1 | grep -v Warning | tee "$OUT/lenet-epoch.txt" ;;
resnet)
    for d in cuda opencl:0:0; do
        timeout 200 python3 -m portanet.cli train --model resnet --optimizer adam \
            --schedule cosine --epochs 10 --dataset fashion-mnist --device $d --json \
            2>/dev/null | tail -1 | tee -a "$OUT/resnet-train.jsonl"
    done
    timeout 150 python3 bench/resnet_epoch_torch.py --epochs 10 --batch-size 64 \
        --device cuda 2>/dev/null | tee -a "$OUT/resnet-train.jsonl" ;;
accuracy)
    if [ "$GEMM" = vendor ]; then
        PORTANET_GEMM=vendor timeout 560 python3 bench/seed_accuracy.py --device cuda \
            --seeds 0-9 --model lenet --model mlp --precision fp32 \
            --json "$OUT/seed-accuracy-fp32-cublas.jsonl" 2>&1 | grep -v Warning | tail -4
    else
        timeout 560 python3 bench/seed_accuracy.py --device cuda --seeds 0-9 --model lenet \
            --model mlp --precision fp32 --precision tf32 --precision bf16 --precision fp16 \
            --json "$OUT/seed-accuracy.jsonl" 2>&1 | grep -v Warning | tail -8
    fi ;;
*)
    echo "usage: bash bench/gpu_train.sh mlp|lenet-epoch|resnet|accuracy"; exit 2 ;;
esac
