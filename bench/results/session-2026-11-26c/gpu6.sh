# session 26c, call 6: PyTorch's peak memory on mlp-big in fp32, bf16 (autocast) and fp16
# (autocast and GradScaler), beside portanet's 1470, 1337 and 1547 MiB (gpu1.sh)
source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 200 python3 bench/results/session-2026-11-26c/torch_peak.py > $OUT/torch-peak.jsonl 2>&1
cat $OUT/torch-peak.jsonl
