#!/usr/bin/env bash
# Where a step's and an epoch's host time goes on a GPU host, one call: what an enqueue
# costs NVIDIA's OpenCL (bench/cl_launch_cost.py), the LeNet epoch from host arrays on cuda
# and opencl:0:0 under cProfile (bench/epoch_profile.py), and mlp-small's replayed launches
# one by one (bench/step_launches.py). Results under $OUT.
source bench/gpu_setup.sh
timeout 90 python3 bench/cl_launch_cost.py --device opencl:0:0 2>&1 | grep -v -i warn \
    | tee "$OUT/launch-cost.txt"
for d in cuda opencl:0:0; do
    timeout 120 python3 bench/epoch_profile.py --device $d 2>&1 | grep -v -i warn \
        | tee "$OUT/epoch-profile-$(echo $d | tr ':' '-').txt"
done
timeout 60 python3 bench/step_launches.py --device opencl:0:0 --workload mlp-small \
    --batch 1000 2>&1 | grep -v -i warn | tee "$OUT/launches-mlp-small.txt"
