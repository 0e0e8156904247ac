# session 26c, call 5: after the review's fixes (gather's 16-bit batch, a download written
# back, the products buffer planned as a batch buffer): the storage, precision and
# loss-scaling tests and the batch kernels' on cuda and NVIDIA's OpenCL
source bench/gpu_setup.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/pytest_xdist*.whl \
    .whl/execnet*.whl || exit 1
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 300 python3 -m pytest tests/test_storage16.py tests/test_precision.py \
  tests/test_loss_scaling.py tests/test_kernels.py -q -p no:cacheprovider -n 8 \
  -k "(cuda or nvidia) and not (test_kernels and not (gather or features or write_samples or stage or lay_out))" \
  > $OUT/tests-storage-5.txt 2>&1
echo "rc $?" >> $OUT/tests-storage-5.txt
tail -12 $OUT/tests-storage-5.txt
