# session 26c, call 7: 16-bit storage through Flatten (network._storage) on cuda: the
# network-level storage tests, in bf16 and fp16
source bench/gpu_setup.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/pytest_xdist*.whl \
    .whl/execnet*.whl || exit 1
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 200 python3 -m pytest tests/test_storage16.py -q -p no:cacheprovider -n 8 \
  -k "cuda and (trains or laid_out or written_back or delta)" > $OUT/tests-storage-7.txt 2>&1
echo "rc $?" >> $OUT/tests-storage-7.txt
tail -6 $OUT/tests-storage-7.txt
