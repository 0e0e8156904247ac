# issue 11, session 10: the loss with its bias gradient in one launch, the batch's gather
# in one; before (build/prev, 39ec0b9) and after, alternating
source bench/gpu_setup.sh
BASE=$PYTHONPATH
export PYTHONPATH=$PWD:$BASE
for dev in cuda opencl:0:0; do
  timeout 100 python3 build/s15/routes.py $dev 2>&1 | grep -v Warn | tee -a $OUT/routes.txt
done
for round in 1 2; do for tree in before after; do
  root=$PWD; [ $tree = before ] && root=$PWD/build/prev
  echo "== round $round, $tree" | tee -a $OUT/bench-ab.txt
  (cd $root && PYTHONPATH=$root:$BASE timeout 150 python3 -m portanet.cli bench --device cuda \
     --device opencl:0:0 --workload mlp-small --workload lenet-step --no-torch 2>&1 \
     | grep -v Warn | tail -14) | tee -a $OUT/bench-ab.txt
done; done
for round in 1 2; do for tree in before after; do
  root=$PWD; [ $tree = before ] && root=$PWD/build/prev
  echo "== round $round, $tree" | tee -a $OUT/epoch-ab.txt
  PYTHONPATH=$root:$BASE timeout 100 python3 bench/lenet_compare.py --devices cuda,opencl:0:0 \
     --epochs 4 --no-torch --json $OUT/epoch-$tree-$round.json 2>&1 | grep -v Warn | tail -4 \
     | tee -a $OUT/epoch-ab.txt
done; done
