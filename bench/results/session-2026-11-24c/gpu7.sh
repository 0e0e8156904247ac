source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_precision.py -k "cuda" 2>&1 | \
    tail -4 | tee $OUT/tests-tf32.txt
for p in fp32 tf32; do
timeout 60 python3 -m portanet.cli profile lenet-step --device cuda --batch-size 64 --precision \
    $p 2>&1 | head -40 > $OUT/profile-lenet-64-$p.txt
done
tail -14 $OUT/profile-lenet-64-tf32.txt; tail -14 $OUT/profile-lenet-64-fp32.txt
timeout 100 python3 -m portanet.cli bench --device cuda --workload lenet-step --precision fp32 \
    --precision tf32 --no-torch 2>&1 | tail -6 | tee $OUT/bench-lenet.txt
