source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 60 python3 build/s14/cl_pinned.py opencl:0:0 2>&1 | tee $OUT/cl-pinned.txt
for m in lenet mlp; do for d in host device; do
timeout 100 python3 build/s14/replay_ops.py $m $d 2>&1 | tee -a $OUT/replay-ops.txt
done; done
