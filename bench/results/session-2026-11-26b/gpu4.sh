# session 26b, call 4: (1) the copy lane's test as it now races (16 fills just before the
# send), on the tree before the fix (.old_tree, as in call 3) and after, ten times each;
# (2) issue 18's accuracy for the MLP, which call 3's limit cut
source bench/gpu_setup.sh
D=bench/results/session-2026-11-26b
rm -rf /tmp/old && mkdir -p /tmp/old && cp -r portanet kernels_cl kernels_cu tests setup.cfg /tmp/old/ \
  && cp .old_tree/*.py /tmp/old/portanet/backends/
for tree in /tmp/old $PWD; do
  echo "== $tree" >> $OUT/tests-lane-4.txt
  for i in 1 2 3 4 5 6 7 8 9 10; do
    (cd $tree && PYTHONPATH=$tree:$PYTHONPATH timeout 60 python3 -m pytest tests/test_kernels.py -q \
      -p no:cacheprovider -k "(cuda or nvidia) and copy_lane_waits" 2>&1 | grep -E "passed|failed|^FAILED") \
      >> $OUT/tests-lane-4.txt
  done
done
cat $OUT/tests-lane-4.txt
export PYTHONPATH=$PWD:$PYTHONPATH
MODELS=mlp timeout 330 python3 $D/precision_accuracy.py cuda 0 1 > $OUT/precision-accuracy-4.jsonl
cat $OUT/precision-accuracy-4.jsonl
