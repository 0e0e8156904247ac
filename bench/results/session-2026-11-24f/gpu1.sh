# diagnostics: the epoch both ways, OpenCL events per launch, mlp-big ours vs torch
source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 200 python3 build/s14/epochs.py cuda,opencl:0:0 lenet,mlp 2>&1 | tee $OUT/epochs.txt
timeout 100 python3 build/s14/cl_events.py opencl:0:0/mlp-small/1000 opencl:0:0/lenet-step/64 \
   2>&1 | tee $OUT/cl-events.txt
timeout 100 python3 -m portanet.cli profile mlp-big --batch-size 10000 --device cuda 2>&1 \
   | tail -40 > $OUT/profile-mlp-big.txt
timeout 100 python3 build/s14/torch_prof.py 2>&1 | tail -40 > $OUT/torch-mlp-big.txt
timeout 60 python3 -m portanet.cli profile mlp-small --batch-size 1000 --device cuda 2>&1 \
   | tail -40 > $OUT/profile-mlp-small-cuda.txt
