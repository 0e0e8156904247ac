# session 26c, call 4: where mlp-big's bf16 step goes with 16-bit storage and before it
# (portanet profile, batch 10000), and the storage tests again after call 1's tolerance fix
source bench/gpu_setup.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/pytest_xdist*.whl \
    .whl/execnet*.whl || exit 1
ROOT=$PWD
for tree in after before; do
  dir=$ROOT; [ $tree = before ] && dir=$ROOT/.before
  (cd /tmp && timeout 100 env PYTHONPATH=$dir:$PYTHONPATH python3 -m portanet.cli profile \
     mlp-big --device cuda --batch-size 10000 --precision bf16 \
     > $OUT/profile-mlp-big-bf16-$tree.txt 2>&1; echo "rc $?" >> $OUT/profile-mlp-big-bf16-$tree.txt)
  head -40 $OUT/profile-mlp-big-bf16-$tree.txt
done
timeout 150 env PYTHONPATH=$ROOT:$PYTHONPATH python3 -m pytest tests/test_storage16.py -q \
  -p no:cacheprovider -n 8 -k "cuda" > $OUT/tests-storage-4.txt 2>&1
echo "rc $?" >> $OUT/tests-storage-4.txt
tail -6 $OUT/tests-storage-4.txt
