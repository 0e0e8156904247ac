# Fashion-MNIST accuracy in every precision over four seeds (build/s13/precision_spread.py)
source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 540 python3 build/s13/precision_spread.py 2>&1 | grep -v "^building" \
    | tee $OUT/precision-spread.jsonl
