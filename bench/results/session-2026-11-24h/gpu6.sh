# second read: the tree after the review's edits on cuda (wgmma.cu's paths, the precision
# tests) and on NVIDIA's OpenCL and cuda (the GEMM, loss and gather kernels)
source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 270 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_precision.py -k \
  "cuda and (hopper or ties or views or memory_plan or (gemm_in_lower and (136 or 1000)))" \
  2>&1 | tail -4 | tee $OUT/tests-review-precision.txt
timeout 290 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_kernels.py -k \
  "(cuda or nvidia) and (gemm or bias_softmax_xent or gather or gemv)" 2>&1 | tail -4 \
  | tee $OUT/tests-review-kernels.txt
