source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 570 python3 -m pytest -q -p no:cacheprovider -rfE -k "cuda or nvidia" \
  tests/test_backend_state.py tests/test_batchnorm.py tests/test_bench.py tests/test_callbacks.py tests/test_check.py \
  tests/test_checkpoint.py tests/test_cli.py tests/test_curves.py tests/test_data.py tests/test_distributed.py \
  tests/test_dlpack.py tests/test_errors.py tests/test_gradients.py tests/test_graphs.py tests/test_kernel_sources.py \
  tests/test_layer_gradients.py tests/test_loss_scaling.py tests/test_memory.py 2>&1 | tail -30 | tee $OUT/suite1.txt
