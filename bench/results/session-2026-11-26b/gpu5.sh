# session 26b, call 5: issue 18's accuracy over ten seeds (0-9), LeNet and MLP, every
# precision, in one process: how far each precision's mean is from fp32's beside the seeds'
# own spread
source bench/gpu_setup.sh
D=bench/results/session-2026-11-26b
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 560 python3 $D/precision_accuracy.py cuda 0 1 2 3 4 5 6 7 8 9 > $OUT/precision-accuracy-5.jsonl
tail -3 $OUT/precision-accuracy-5.jsonl; wc -l $OUT/precision-accuracy-5.jsonl
