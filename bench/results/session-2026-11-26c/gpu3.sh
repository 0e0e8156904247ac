# session 26c, call 3: issue 18's accuracy with 16-bit storage (Fashion-MNIST, 5 epochs,
# seeds 0-4, LeNet and MLP, fp32, bf16 and fp16 in one process; session 26b's
# precision_accuracy.py, whose call 5 ran seeds 0-9 on the tree before), then mlp-big's
# second round before and after
source bench/gpu_setup.sh
ROOT=$PWD
PRECISIONS=fp32,bf16,fp16 timeout 300 env PYTHONPATH=$ROOT:$PYTHONPATH python3 \
  bench/results/session-2026-11-26b/precision_accuracy.py cuda 0 1 2 3 4 \
  > $OUT/precision-accuracy-3.jsonl
wc -l $OUT/precision-accuracy-3.jsonl
bench() {   # tree, file, precisions...
  local tree=$1 file=$2; shift 2
  local args=(); for p in "$@"; do args+=(--precision $p); done
  (cd /tmp && timeout 120 env PYTHONPATH=$tree:$PYTHONPATH python3 -m portanet.cli bench \
     --device cuda --workload mlp-big "${args[@]}" --no-torch --json $OUT/$file.json \
     > $OUT/$file.txt 2>&1; echo "rc $?" >> $OUT/$file.txt; grep -A4 "^device" $OUT/$file.txt)
}
bench $ROOT after-3 bf16 fp16
bench $ROOT/.before before-3 bf16 fp16
