# Finish suiteB: collect the same selection in run order, skip the 520 already run
source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
ARGS=(-p no:cacheprovider tests -k "cuda or nvidia" --ignore=tests/test_kernels.py --ignore=tests/test_conv.py)
python3 -m pytest -q --collect-only "${ARGS[@]}" 2>&1 | grep '::' > $OUT/suiteB-collected.txt
echo "collected: $(wc -l < $OUT/suiteB-collected.txt)"
echo "test 520 (last done): $(sed -n 520p $OUT/suiteB-collected.txt)"
tail -n +521 $OUT/suiteB-collected.txt > $OUT/suiteB-remaining.txt
echo "remaining: $(wc -l < $OUT/suiteB-remaining.txt), first: $(head -1 $OUT/suiteB-remaining.txt)"
cut -d: -f1 $OUT/suiteB-remaining.txt | uniq -c
mapfile -t IDS < $OUT/suiteB-remaining.txt
timeout 560 python3 -m pytest -q -p no:cacheprovider -rfE "${IDS[@]}" 2>&1 | tee $OUT/gpu-suite-rest-part2-full.txt | tail -40 \
    | tee $OUT/gpu-suite-rest-part2.txt
