#!/usr/bin/env bash
# Where a step's and an epoch's host time goes on the GPU machine, one call (carry .gpu,
# .data and the safetensors wheel in .whl): what an enqueue costs NVIDIA's OpenCL
# (bench/cl_launch_cost.py), the LeNet epoch from host arrays on cuda and opencl:0:0 under
# cProfile (bench/epoch_profile.py), mlp-small's replayed launches one by one
# (bench/step_launches.py), then `portanet bench` of every workload with PyTorch's columns
# (unless BENCH=no). Results under $OUT.
source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 90 python3 bench/cl_launch_cost.py --device opencl:0:0 2>&1 | grep -v -i warn \
    | tee "$OUT/launch-cost.txt"
for d in cuda opencl:0:0; do
    timeout 120 python3 bench/epoch_profile.py --device $d 2>&1 | grep -v -i warn \
        | tee "$OUT/epoch-profile-$(echo $d | tr ':' '-').txt"
done
timeout 60 python3 bench/step_launches.py --device opencl:0:0 --workload mlp-small \
    --batch 1000 2>&1 | grep -v -i warn | tee "$OUT/launches-mlp-small.txt"
[ "$BENCH" = no ] || timeout 300 python3 -m portanet.cli bench --device cuda \
    --device opencl:0:0 --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log" | tail -25
