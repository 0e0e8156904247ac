# session 26b, call 7: the GPU tests of this session's changes at the final tree: the copy
# lane and batches (test_kernels), precisions (every test, cuda and NVIDIA's OpenCL), resume,
# loss scaling, the command line and bench
source bench/gpu_setup.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/pytest_xdist*.whl \
    .whl/execnet*.whl || exit 1
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 300 python3 -m pytest -q -p no:cacheprovider -n 8 tests/test_kernels.py \
  -k "(cuda or nvidia) and (write_samples or copy_lane or stage or lay_out)" > $OUT/tests-batches-7.txt 2>&1
tail -6 $OUT/tests-batches-7.txt
timeout 280 python3 -m pytest -q -p no:cacheprovider -n 8 tests/test_precision.py tests/test_resume.py \
  tests/test_loss_scaling.py tests/test_cli.py > $OUT/tests-precision-7.txt 2>&1
tail -12 $OUT/tests-precision-7.txt
