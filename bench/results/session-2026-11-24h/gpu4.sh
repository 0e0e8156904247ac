# issue 18: the GPU tests of wgmma.cu's change: every precision test on cuda, the sources
source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 560 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_precision.py \
  tests/test_kernel_sources.py -k "cuda or sources" 2>&1 | tail -8 | tee $OUT/tests-precision.txt
