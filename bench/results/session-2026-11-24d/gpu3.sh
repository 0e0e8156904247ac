source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 300 python3 -m portanet.cli bench --device cuda --workload gemm --workload mlp-big \
    --workload mlp-small --precision fp32 --precision tf32 --precision bf16 --precision fp16 \
    --json $OUT/bench-precision.json 2>&1 | tail -30 | tee $OUT/bench-precision.txt
for p in fp32 tf32 bf16 fp16; do
timeout 60 python3 -m portanet.cli train --model mlp --epochs 5 --device cuda --precision $p \
    --json 2>/dev/null | tail -1 >> $OUT/train.jsonl
timeout 60 python3 -m portanet.cli train --model lenet --epochs 5 --device cuda --precision $p \
    --json 2>/dev/null | tail -1 >> $OUT/train.jsonl
done
cut -c1-400 $OUT/train.jsonl
