source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 570 python3 -m pytest -q -p no:cacheprovider -rfE -k "cuda or nvidia" \
  tests/test_meta.py tests/test_onnx.py tests/test_opencl_platforms.py tests/test_optimizers.py tests/test_precision.py \
  tests/test_profile.py tests/test_readme.py tests/test_resume.py tests/test_saving.py tests/test_schedules.py \
  tests/test_semantics.py tests/test_threads.py tests/test_torch_interop.py tests/test_torch_parity.py \
  tests/test_torch_state.py tests/test_training.py tests/test_tune.py 2>&1 | tail -30 | tee $OUT/suite2.txt
