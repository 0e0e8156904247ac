# session 27b, call 8 (call 6's machine): the GPU suite's first half (test_a* .. test_k*) at
# this tree, then the files of the second half that train BatchNorm and Residual networks
# or hold them to PyTorch, on cuda and NVIDIA's OpenCL.
source bench/gpu_setup.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/pytest_xdist*.whl \
    .whl/execnet*.whl || exit 1
run() {   # log, seconds, files
  timeout $2 python3 -m pytest ${@:3} -q -p no:cacheprovider -n 14 -k "cuda or nvidia" \
    > $OUT/$1.log 2>&1
  echo "rc $?" >> $OUT/$1.log
  grep -E "^(FAILED|ERROR)" $OUT/$1.log | head -30; tail -7 $OUT/$1.log
}
export PYTHONPATH=$PWD:$PYTHONPATH
run tests-8a 330 $(ls tests/test_[a-k]*.py)
run tests-8b 200 tests/test_torch_parity.py tests/test_training.py tests/test_semantics.py \
  tests/test_layer_gradients.py tests/test_saving.py
