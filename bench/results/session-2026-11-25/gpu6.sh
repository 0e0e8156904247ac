# session 25, call 6: after the review's fix (a forward starts with no kept copies): the
# precision tests of kept copies and the plan, the new stopped-step test, graphs on cuda,
# and mlp-big in bf16 and fp16 once more
source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 240 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_precision.py \
  -k "cuda and (stopped_midway or kept or memory_plan or dense_in_lower)" > $OUT/tests-after-review.txt 2>&1
tail -3 $OUT/tests-after-review.txt
timeout 100 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_graphs.py -k "cuda" > $OUT/tests-graphs-after-review.txt 2>&1
tail -3 $OUT/tests-graphs-after-review.txt
timeout 90 python3 -m portanet.cli bench --device cuda --workload mlp-big --precision bf16 \
  --precision fp16 --no-torch > $OUT/bench-after-review.txt 2>&1
grep -E "^cuda +(bf16|fp16) +mlp-big.* ms " $OUT/bench-after-review.txt | cut -c1-90
