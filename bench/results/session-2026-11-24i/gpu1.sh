# session 17, call 1: the elementwise kernels' STEPS (bias_activation, momentum_updates):
# GPU tests, before (f58607b, build/prev) and after alternating, profiles of mlp-big
source bench/gpu_setup.sh
BASE=$PYTHONPATH
export PYTHONPATH=$PWD:$BASE
timeout 200 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_kernels.py tests/test_optimizers.py \
  -k "(cuda or nvidia) and (bias_activation or momentum or dense or sgd)" 2>&1 | tail -8 | tee $OUT/tests-elementwise.txt
for round in 1 2; do for tree in before after; do
  root=$PWD; [ $tree = before ] && root=$PWD/build/prev
  echo "== round $round, $tree" | tee -a $OUT/bench-ab.txt
  (cd $root && PYTHONPATH=$root:$BASE timeout 100 python3 -m portanet.cli bench --device cuda \
     --device opencl:0:0 --workload mlp-big --workload mlp-small --no-torch 2>&1 | grep -v Warn | tail -12) | tee -a $OUT/bench-ab.txt
  (cd $root && PYTHONPATH=$root:$BASE timeout 60 python3 -m portanet.cli bench --device cuda \
     --workload mlp-big --precision bf16 --no-torch 2>&1 | grep -v Warn | tail -6) | tee -a $OUT/bench-ab.txt
done; done
for p in fp32 bf16; do
  timeout 60 python3 -m portanet.cli profile mlp-big --batch-size 10000 --device cuda --precision $p \
    2>&1 | grep -v Warn > $OUT/profile-mlp-big-$p.txt; tail -16 $OUT/profile-mlp-big-$p.txt
done
