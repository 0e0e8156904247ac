# session 26c, call 8: after the review of the whole change (one _stored, _run's stored
# build, one precision_backend in the tests): the storage, precision and loss-scaling tests
# and the batch and bias kernels' on cuda and NVIDIA's OpenCL
source bench/gpu_setup.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/pytest_xdist*.whl \
    .whl/execnet*.whl || exit 1
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 330 python3 -m pytest tests/test_storage16.py tests/test_precision.py \
  tests/test_loss_scaling.py tests/test_kernels.py -q -p no:cacheprovider -n 8 \
  -k "(cuda or nvidia) and not (test_kernels and not (gather or features or write_samples or bias_activation or activation_bias_grad or fill))" \
  > $OUT/tests-review-8.txt 2>&1
echo "rc $?" >> $OUT/tests-review-8.txt
tail -8 $OUT/tests-review-8.txt
