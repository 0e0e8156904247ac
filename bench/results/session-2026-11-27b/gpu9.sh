# session 27b, call 9 (call 6's machine): call 8's second run timed out at 28% with no
# failure; here PyTorch parity alone (ResNet and BatchNorm networks against torch on cuda),
# with BatchNorm in pieces.
source bench/gpu_setup.sh
python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/pytest_xdist*.whl \
    .whl/execnet*.whl > /dev/null 2>&1
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 250 python3 -m pytest tests/test_torch_parity.py -q -p no:cacheprovider -n 14 \
  -k "cuda or nvidia" > $OUT/tests-9.log 2>&1
echo "rc $?" >> $OUT/tests-9.log
grep -E "^(FAILED|ERROR)" $OUT/tests-9.log | head -30; tail -7 $OUT/tests-9.log
