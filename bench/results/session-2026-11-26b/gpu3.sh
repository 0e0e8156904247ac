# session 26b, call 3: (1) the copy lane's wait, before and after (the tree before the fix is
# the carried .old_tree, untracked: the three backend modules of 02b9... HEAD~1), ten times
# each; (2) issue 18's accuracy in every precision at this tree, LeNet first; (3) mlp-big in
# tf32 and bf16 beside PyTorch
source bench/gpu_setup.sh
D=bench/results/session-2026-11-26b
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/pytest_xdist*.whl \
    .whl/execnet*.whl || exit 1
rm -rf /tmp/old && mkdir -p /tmp/old && cp -r portanet /tmp/old/ && cp -r kernels_cl kernels_cu tests setup.cfg /tmp/old/ \
  && cp .old_tree/*.py /tmp/old/portanet/backends/
for tree in /tmp/old $PWD; do
  echo "== $tree" >> $OUT/tests-lane.txt
  (cd $tree && PYTHONPATH=$tree:$PYTHONPATH timeout 100 python3 -m pytest tests/test_kernels.py -q \
    -p no:cacheprovider -k "(cuda or nvidia) and (copy_lane_waits or write_samples)" \
    2>&1 | tail -4) >> $OUT/tests-lane.txt
  for i in 1 2 3 4 5 6 7 8 9 10; do
    (cd $tree && PYTHONPATH=$tree:$PYTHONPATH timeout 60 python3 -m pytest tests/test_kernels.py -q \
      -p no:cacheprovider -k "(cuda or nvidia) and copy_lane_waits" 2>&1 | tail -1) >> $OUT/tests-lane.txt
  done
done
cat $OUT/tests-lane.txt
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 300 python3 $D/precision_accuracy.py cuda 0 1 > $OUT/precision-accuracy.jsonl 2> $OUT/acc-err.txt
tail -3 $OUT/acc-err.txt; cat $OUT/precision-accuracy.jsonl
timeout 150 python3 -m portanet.cli bench --device cuda --workload mlp-big --precision fp32 \
  --precision tf32 --precision bf16 --precision fp16 --json $OUT/bench-precisions.json \
  > $OUT/bench-precisions.txt 2>&1; tail -20 $OUT/bench-precisions.txt
