# session 26b, call 1: the whole suite on cuda and NVIDIA's OpenCL at the tree the last
# session ended with (its routing and CPU gemv-group changes had not run on a GPU)
source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
git log --oneline -1 > $OUT/tree.txt 2>/dev/null
timeout 560 python3 -m pytest tests -q -p no:cacheprovider --durations=15 \
  -k "cuda or nvidia" > $OUT/tests-gpu.txt 2>&1
echo "rc $?" >> $OUT/tests-gpu.txt
tail -30 $OUT/tests-gpu.txt
