source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
for p in bf16 tf32; do
timeout 120 python3 -m portanet.cli profile mlp-big --device cuda --batch-size 10000 \
    --precision $p 2>&1 | head -60 > $OUT/profile-mlp-big-$p.txt
done
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_precision.py -k \
    "cuda and (16_bit or ties or dense)" 2>&1 | tail -4 | tee $OUT/tests-final.txt
timeout 250 python3 -m portanet.cli bench --device cuda --workload gemm --workload mlp-big \
    --workload mlp-small --precision fp32 --precision tf32 --precision bf16 --precision fp16 \
    --json $OUT/bench-final.json 2>&1 | tail -24 | tee $OUT/bench-final.txt
