# session 24j, call 1: kept 16-bit operands (issue 18) A/B against 7de6966 (build/prev), their
# tests, the routing change's tests, and where lenet-infer's time goes (issue 11)
source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
D=bench/results/session-2026-11-24j
timeout 200 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_precision.py \
  -k "cuda and (kept or memory_plan or training_in_lower)" > $OUT/tests-kept.txt 2>&1
tail -3 $OUT/tests-kept.txt
timeout 120 python3 $D/infer.py cuda opencl:0:0 > $OUT/infer.txt 2>&1; cat $OUT/infer.txt
for round in 1 2; do
  for tree in build/prev .; do
    (cd $tree && PYTHONPATH=$PWD:/tmp/site timeout 100 python3 -m portanet.cli bench --device cuda \
      --workload mlp-big --precision bf16 --precision fp16 --precision tf32 --no-torch) \
      > $OUT/ab-$round-$(basename $(realpath $tree)).txt 2>&1
    echo "round $round $tree"; grep "mlp-big" $OUT/ab-$round-$(basename $(realpath $tree)).txt | grep -v "^cuda " | cut -c1-100
  done
done
timeout 60 python3 -m portanet.cli profile mlp-big --device cuda --precision bf16 --batch-size 10000 > $OUT/profile-mlp-big-bf16.txt 2>&1
head -40 $OUT/profile-mlp-big-bf16.txt | tail -30
