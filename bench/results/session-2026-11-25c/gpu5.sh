# session 25c, call 5: the GPU tests of this session's one library-side change (a test tiling
# of cuBLAS's 64 x 64 of 8 x 4, 32 deep) and the kernel tests around it, on cuda and NVIDIA's
# OpenCL
source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 400 python3 -m pytest tests/test_kernels.py -q -x -p no:cacheprovider \
  -k "(cuda or nvidia) and (gemm or split)" > $OUT/tests.txt 2>&1
tail -8 $OUT/tests.txt
