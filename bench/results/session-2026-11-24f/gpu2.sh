source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 120 python3 build/s14/cl_depth.py opencl:0:0 2>&1 | tee $OUT/cl-depth.txt
timeout 200 python3 build/s14/lt_algos.py 2>&1 | tee $OUT/lt-algos.txt
timeout 200 python3 build/s14/epochs.py cuda,opencl:0:0 lenet,mlp 2>&1 | tee $OUT/epochs-multi.txt
