# session 26b, call 6: the noise floor of issue 18's per-seed criterion: fp32 again, seeds
# 0-9, with every product on cuBLAS (PORTANET_GEMM=vendor) where call 5's fp32 routed;
# only the order of sums differs between the two
source bench/gpu_setup.sh
D=bench/results/session-2026-11-26b
export PYTHONPATH=$PWD:$PYTHONPATH
PORTANET_GEMM=vendor PRECISIONS=fp32 timeout 400 python3 $D/precision_accuracy.py cuda 0 1 2 3 4 5 6 7 8 9 \
  > $OUT/fp32-vendor-6.jsonl
PRECISIONS=fp32 timeout 100 python3 $D/precision_accuracy.py cuda 0 1 2 3 4 5 6 7 8 9 \
  > $OUT/fp32-auto-6.jsonl
wc -l $OUT/*.jsonl
