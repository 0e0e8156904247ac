# session 26c, call 1: 16-bit storage on the H100. The tests that touch it (storage, the
# precisions, loss scaling, on cuda and NVIDIA's OpenCL), then mlp-big in bf16 and fp16 with
# the tree before (806ddf6, carried in .before) and after, alternating, peak memory included.
source bench/gpu_setup.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/pytest_xdist*.whl \
    .whl/execnet*.whl || exit 1
ROOT=$PWD
timeout 250 env PYTHONPATH=$ROOT:$PYTHONPATH python3 -m pytest tests/test_storage16.py \
  tests/test_precision.py tests/test_loss_scaling.py -q -p no:cacheprovider -n 8 \
  -k "cuda or nvidia" > $OUT/tests-storage-1.txt 2>&1
echo "rc $?" >> $OUT/tests-storage-1.txt
tail -25 $OUT/tests-storage-1.txt
bench() {   # tree, file, precisions...
  local tree=$1 file=$2; shift 2
  local args=(); for p in "$@"; do args+=(--precision $p); done
  (cd /tmp && timeout 170 env PYTHONPATH=$tree:$PYTHONPATH python3 -m portanet.cli bench \
     --device cuda --workload mlp-big "${args[@]}" --json $OUT/$file.json \
     > $OUT/$file.txt 2>&1; echo "rc $?" >> $OUT/$file.txt; grep -A6 "^device" $OUT/$file.txt)
}
bench $ROOT/.before before-1 bf16 fp16
bench $ROOT after-1 fp32 bf16 fp16
