# session 26b, call 2: the whole suite on cuda and NVIDIA's OpenCL, in 8 workers (call 1 ran
# it in one process and reached 45% in its 560 s)
source bench/gpu_setup.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/pytest_xdist*.whl \
    .whl/execnet*.whl || exit 1
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 560 python3 -m pytest tests -q -p no:cacheprovider -n 8 --durations=15 \
  -k "cuda or nvidia" > $OUT/tests-gpu.txt 2>&1
echo "rc $?" >> $OUT/tests-gpu.txt
tail -40 $OUT/tests-gpu.txt
