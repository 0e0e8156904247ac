# session 25, call 7: after the final review's tidy, the suite's GPU tests of what the
# session touched, on cuda and NVIDIA's OpenCL
source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 200 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_precision.py \
  -k "cuda and (stopped_midway or kept or memory_plan or dense_in_lower or training_in_lower)" > $OUT/tests-final-precision.txt 2>&1
tail -2 $OUT/tests-final-precision.txt
timeout 240 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_kernels.py tests/test_graphs.py \
  tests/test_memory.py tests/test_training.py tests/test_layer_gradients.py tests/test_semantics.py \
  -k "(cuda or nvidia) and (transpose or auto_gemm or routing or activation or bias or graph or replay or plan or train or gradient or dense)" \
  > $OUT/tests-final-suite.txt 2>&1
tail -4 $OUT/tests-final-suite.txt
