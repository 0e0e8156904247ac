# session 26, call 5: the GPU tests of SGD's two update ways (momentum_updates fused on GPUs,
# momentum_update a layer a launch on CPUs, both forced on every device by the tests) and
# of the profile's launch list, on cuda and NVIDIA's OpenCL
source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 200 python3 -m pytest tests/test_kernels.py -q -p no:cacheprovider \
  -k "(cuda or nvidia) and (momentum or skip_flag)" > $OUT/tests-updates.txt 2>&1
tail -5 $OUT/tests-updates.txt
timeout 200 python3 -m pytest tests/test_profile.py -q -p no:cacheprovider \
  > $OUT/tests-profile.txt 2>&1; tail -5 $OUT/tests-profile.txt
