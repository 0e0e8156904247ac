# session 24j, call 4: after the review's tidying of the kept-copy code: the precision tests'
# kept, plan, dense and training cases on cuda; the elementwise kernels' tests (bias_activation,
# momentum updates, dense) and the optimizer and graph tests on cuda and NVIDIA's OpenCL
source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 200 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_precision.py \
  -k "cuda and (kept or memory_plan or training_in_lower or dense_in_lower)" > $OUT/tests-review2-precision.txt 2>&1
tail -4 $OUT/tests-review2-precision.txt
timeout 330 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_kernels.py tests/test_optimizers.py \
  tests/test_graphs.py tests/test_semantics.py -k "(cuda or nvidia) and (bias_activation or momentum or dense or sgd or graph or replay or update)" \
  > $OUT/tests-review2-kernels.txt 2>&1
tail -5 $OUT/tests-review2-kernels.txt
