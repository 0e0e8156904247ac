# session 25b, call 7: issue 18's accuracy criterion beside the peer: PyTorch's MLP and LeNet
# in fp32/tf32/bf16/fp16 over seeds 0-3, then portanet's (session 24e's script) at this tree
source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
D=bench/results/session-2026-11-25b
timeout 270 python3 $D/torch_precision_spread.py > $OUT/torch-precision-spread.jsonl 2> $OUT/torch-err.txt
tail -3 $OUT/torch-err.txt; cat $OUT/torch-precision-spread.jsonl
timeout 280 python3 bench/results/session-2026-11-24e/precision_spread.py > $OUT/portanet-precision-spread.jsonl 2> $OUT/pn-err.txt
tail -3 $OUT/pn-err.txt; cat $OUT/portanet-precision-spread.jsonl
