#!/usr/bin/env bash
# portanet's GEMM on a GPU host against the vendors' (bench/gemm_paths.py), one part per call
# (each fits 10 minutes). Results under $OUT.
#   bash bench/gpu_gemm.sh paths     SGEMM n^3, n = 1024, 2048, 4096, NN, NT and TN: our
#                                    kernel on CUDA and OpenCL, cuBLAS, CLBlast and torch.mm
#                                    with the shipped tilings (gemm-paths.json), then with
#                                    PORTANET_TUNING=off (gemm-paths-untuned.json)
#   bash bench/gpu_gemm.sh tensor    bf16 and fp16 products on our tensor-core GEMM
#                                    (kernels_cu/wgmma.cu) against cuBLAS's gemm_ex and the
#                                    paths around them (tensor-gemm.json; Hopper)
#   bash bench/gpu_gemm.sh sweep     our kernel at 4096^3 with each tiling of GEMM_VARIANTS,
#                                    its registers, spills and shared memory (sweep.json)
#   bash bench/gpu_gemm.sh tune [D]  `portanet tune` on D (default: cuda and opencl:nvidia),
#                                    the database it finds as tuned.json
source bench/gpu_setup.sh
case "$1" in
paths)
    timeout 250 python3 bench/gemm_paths.py --only gemm --opencl opencl:nvidia \
        --json "$OUT/gemm-paths.json" 2>&1 | grep -v Warning | tee "$OUT/gemm-paths.txt"
    PORTANET_TUNING=off timeout 250 python3 bench/gemm_paths.py --only gemm \
        --opencl opencl:nvidia --json "$OUT/gemm-paths-untuned.json" 2>&1 | grep -v Warning \
        | tee "$OUT/gemm-paths-untuned.txt" ;;
tensor)
    timeout 400 python3 bench/gemm_paths.py --only tensor --json "$OUT/tensor-gemm.json" \
        2>&1 | grep -v Warning | tee "$OUT/tensor-gemm.txt" ;;
sweep)
    timeout 560 python3 bench/gemm_paths.py --variants --only gemm --opencl opencl:nvidia \
        --json "$OUT/sweep.json" 2>&1 | grep -v Warning | tee "$OUT/sweep.txt" ;;
tune)
    export XDG_CACHE_HOME=/tmp/cache
    for d in ${2:-cuda opencl:nvidia}; do
        timeout ${LIMIT:-540} python3 -m portanet.cli tune --device $d --budget ${BUDGET:-30} \
            --output "$OUT/tuned.json" --json "$OUT/tune-${d%%:*}.json" 2>&1 \
            | tee "$OUT/tune-${d%%:*}.txt"
    done ;;
*)
    echo "usage: bash bench/gpu_gemm.sh paths|tensor|sweep|tune [DEVICE]"; exit 2 ;;
esac
