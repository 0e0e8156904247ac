# session 24j, call 3: the GPU tests around this session's changes (routing's trials,
# kept operands) in more files: training, memory, optimizers, layer gradients, conv and
# the precision tests' dense, training and plan cases
source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 280 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_training.py tests/test_memory.py \
  tests/test_optimizers.py tests/test_layer_gradients.py -k "cuda or nvidia" > $OUT/tests-training.txt 2>&1
tail -6 $OUT/tests-training.txt
timeout 250 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_conv.py tests/test_precision.py \
  -k "(cuda or nvidia) and (conv_paths or cnn or dense_in_lower or training_in_lower or plan or kept)" > $OUT/tests-conv-precision.txt 2>&1
tail -6 $OUT/tests-conv-precision.txt
