# issue 18: wgmma.cu against cuBLAS (gpu_compare.py --only tensor); the bf16 and fp16 steps
# before (2c50155, build/prev) and after, alternating, two rounds
source bench/gpu_setup.sh
BASE=$PYTHONPATH
export PYTHONPATH=$PWD:$BASE
timeout 200 python3 bench/gpu_compare.py --only tensor --json $OUT/tensor.json 2>&1 \
  | grep -v Warn | grep "^tensor" | tee $OUT/tensor.txt
for round in 1; do for tree in before after; do
  root=$PWD; [ $tree = before ] && root=$PWD/build/prev
  echo "== round $round, $tree" | tee -a $OUT/bench-ab.txt
  (cd $root && PYTHONPATH=$root:$BASE timeout 120 python3 -m portanet.cli bench --device cuda \
     --workload mlp-big --workload mlp-small --precision bf16 --precision fp16 --no-torch \
     2>&1 | grep -v Warn | tail -6) | tee -a $OUT/bench-ab.txt
done; done
timeout 150 python3 bench/results/session-2026-11-24h/routes16.py 2>&1 | grep -v Warn | tee $OUT/routes16.txt | tail -30
timeout 150 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_precision.py \
  -k "cuda and (training or memory_plan or command_line or bench or hopper or dense or convolution)" \
  2>&1 | tail -6 | tee $OUT/tests-precision-rest.txt
