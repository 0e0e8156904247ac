# the memory plan's 16-bit operand workspace: its test on cuda, and mlp-big's plan beside
# the bench's measured peaks (1565.4 MiB bf16, 1775.2 fp16 this session)
source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 300 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_precision.py \
    -k "cuda and memory_plan" 2>&1 | tail -6 | tee $OUT/tests-memory-plan.txt
timeout 120 python3 - <<'PY' 2>&1 | tee $OUT/plan-mlp-big.txt
import portanet as pn
for p in ("fp32", "bf16", "fp16"):
    net = pn.Sequential([pn.Dense(5000, "tanh"), pn.Dense(1000, "sigmoid"),
                         pn.Dense(10, "sigmoid")], 10000, loss="binary_cross_entropy",
                        device="cuda", precision=p)
    plan = net.memory_plan(10000, pn.SGD(0.01, 0.9))
    print(p, f"plan {plan.total / 2**20:.1f} MiB", plan.by_kind())
PY
