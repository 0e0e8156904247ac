# issue 18: wgmma.cu with blocks in groups down m and a step of wgmma kept in flight; the
# faster 16-bit copies
source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 300 python3 bench/results/session-2026-11-24h/wg_bench.py $OUT/wg-bench2.txt 2>&1 | grep -v Warn | grep -v BAD | tail -60
