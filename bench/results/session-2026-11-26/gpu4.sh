# session 26, call 4: the GPU tests of this session's changes (replays' arguments converted
# once; fp16 offered on OpenCL devices with cl_khr_fp16, which NVIDIA's OpenCL lacks) on
# cuda and NVIDIA's OpenCL; a second bench process of the small steps
source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 240 python3 -m pytest tests/test_precision.py tests/test_training.py \
  tests/test_optimizers.py tests/test_loss_scaling.py -q -p no:cacheprovider \
  -k "nvidia or opencl_devices_compute" > $OUT/tests.txt 2>&1; tail -6 $OUT/tests.txt
timeout 120 python3 -m portanet.cli bench --device cuda --device opencl:0:0 --workload mlp-small \
  --workload lenet-step --no-torch --json $OUT/bench-small.json > $OUT/bench-small.txt 2>&1
grep -v "^  " $OUT/bench-small.txt | tail -8
