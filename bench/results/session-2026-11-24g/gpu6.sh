# before (build/prev, 39ec0b9) and after (HEAD) with the shipped tuning applying to both;
# round 2's after is the whole bench with PyTorch
source bench/gpu_setup.sh
BASE=$PYTHONPATH
for round in 1 2; do for tree in before after; do
  root=$PWD; [ $tree = before ] && root=$PWD/build/prev
  args="--workload mlp-small --workload lenet-step --no-torch"
  [ $round$tree = 2after ] && args="--json $OUT/bench-final.json"
  echo "== round $round, $tree" | tee -a $OUT/bench-ab.txt
  (cd $root && PYTHONPATH=$root:$BASE timeout 200 python3 -m portanet.cli bench --device cuda \
     --device opencl:0:0 $args 2>&1 | grep -v Warn > $OUT/bench-$round-$tree.txt)
  grep -E " auto " $OUT/bench-$round-$tree.txt | cut -c1-175 | tee -a $OUT/bench-ab.txt
done; done
for tree in before after; do
  root=$PWD; [ $tree = before ] && root=$PWD/build/prev
  echo "== $tree" | tee -a $OUT/epoch-ab.txt
  PYTHONPATH=$root:$BASE timeout 100 python3 bench/lenet_compare.py --devices cuda,opencl:0:0 \
     --epochs 4 --no-torch --json $OUT/epoch-$tree.json 2>&1 | grep -v Warn | tail -3 \
     | tee -a $OUT/epoch-ab.txt
done
