# before (build/prev, HEAD d805816) and after (data_on_device="auto" by default), alternating
source bench/gpu_setup.sh
BASE=$PYTHONPATH
for round in 1 2; do
  for dev in cuda opencl:0:0; do for model in lenet mlp; do
    for tree in before after; do
      root=$PWD; [ $tree = before ] && root=$PWD/build/prev
      PYTHONPATH=$root:$BASE timeout 120 python3 build/s14/epochs_ab.py $dev $model $tree \
        2>&1 | grep -v Warn | tail -1 | tee -a $OUT/epochs-ab.txt
    done
  done; done
done
