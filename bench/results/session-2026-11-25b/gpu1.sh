# session 25b, call 1: what an enqueue costs on NVIDIA's OpenCL by its arguments; the
# mlp-small step's launches; the bench's mlp-small before any change
source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
D=bench/results/session-2026-11-25b
timeout 200 python3 $D/enqueue_args.py opencl:0:0 > $OUT/enqueue-args.txt 2>&1; cat $OUT/enqueue-args.txt
timeout 200 python3 -m portanet.cli bench --device cuda --device opencl:0:0 --workload mlp-small \
  --workload lenet-step --no-torch > $OUT/bench-before.txt 2>&1; grep -v "^cuda \|^opencl" $OUT/bench-before.txt | tail -15
