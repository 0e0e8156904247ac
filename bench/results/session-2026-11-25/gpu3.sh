# session 25, call 3: the GPU tests of the transposed copies and of the copies written beside
# a layer's output and delta; bf16/fp16/tf32 mlp-big A/B against 5b495f2 (build/prev)
source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
T="timeout 300 python3 -m pytest -q -p no:cacheprovider -rfE -x"
for round in 1 2; do
  for tree in build/prev .; do
    name=$( [ $tree = . ] && echo after || echo before )
    (cd $tree && PYTHONPATH=$PWD:/tmp/site timeout 100 python3 -m portanet.cli bench --device cuda \
      --workload mlp-big --precision bf16 --precision fp16 --precision tf32 --no-torch) \
      > $OUT/ab16-$round-$name.txt 2>&1
    echo "round $round $name"; grep -E "^cuda +(bf16|fp16|tf32) +mlp-big.* ms " $OUT/ab16-$round-$name.txt | cut -c1-90
  done
done
timeout 60 python3 -m portanet.cli profile mlp-big --device cuda --precision bf16 --batch-size 10000 > $OUT/profile-mlp-big-bf16.txt 2>&1
head -32 $OUT/profile-mlp-big-bf16.txt | tail -30
$T tests/test_memory.py -k "cuda and (plan or transposed)" > $OUT/tests-memory.txt 2>&1
tail -2 $OUT/tests-memory.txt
$T tests/test_precision.py -k "cuda and (kept or memory_plan or training_in_lower or dense_in_lower)" > $OUT/tests-precision.txt 2>&1
tail -2 $OUT/tests-precision.txt
