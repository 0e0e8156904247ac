# session 25b, call 8: GPU tests after the review's tidy (STAGED_SAMPLES, Dense.forward's keep)
source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 300 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_kernels.py tests/test_graphs.py \
  tests/test_training.py tests/test_layer_gradients.py -k "(cuda or nvidia) and (transpose or features_first or staged or graph or replay or train or gradient or dense)" \
  > $OUT/tests-review.txt 2>&1; tail -6 $OUT/tests-review.txt
timeout 200 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_precision.py -k "cuda and (kept or stopped_midway or memory_plan)" \
  > $OUT/tests-review-precision.txt 2>&1; tail -4 $OUT/tests-review-precision.txt
