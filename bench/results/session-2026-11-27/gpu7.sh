# session 27, call 7: LeNet's accuracy with its activations in 16 bits (Fashion-MNIST, 5
# epochs, seeds 0-2, fp32, bf16 and fp16 in one process: session 26b's
# precision_accuracy.py), then the first half of the whole suite (test_a* .. test_k*) on
# cuda and NVIDIA's OpenCL.
source bench/gpu_setup.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/pytest_xdist*.whl \
    .whl/execnet*.whl || exit 1
ROOT=$PWD
MODELS=lenet PRECISIONS=fp32,bf16,fp16 timeout 240 env PYTHONPATH=$ROOT:$PYTHONPATH python3 \
  bench/results/session-2026-11-26b/precision_accuracy.py cuda 0 1 2 > $OUT/accuracy-7.jsonl
cat $OUT/accuracy-7.jsonl
timeout 320 env PYTHONPATH=$ROOT:$PYTHONPATH python3 -m pytest $(ls tests/test_[a-k]*.py) -q \
  -p no:cacheprovider -n 8 -k "cuda or nvidia" > $OUT/tests-7.log 2>&1
echo "rc $?" >> $OUT/tests-7.log
grep -E "^(FAILED|ERROR)" $OUT/tests-7.log | head -30; tail -6 $OUT/tests-7.log
