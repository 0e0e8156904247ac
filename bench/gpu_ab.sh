#!/usr/bin/env bash
# Any command in the tree before a change and in this tree, alternating, so that both meet
# the same machine, clocks and driver. Each runs from inside its own tree: Python puts the
# working directory first on sys.path, so a tree named only in PYTHONPATH but run from this
# checkout would import this checkout's portanet. Carry build/prev, the tree before
# (git archive <commit> portanet kernels_cl kernels_cu | tar -x -C build/prev), beside what
# gpu_setup.sh needs. Each run's first line says which portanet it imported.
#   ROUNDS=2 bash bench/gpu_ab.sh python3 -m portanet.cli train --model lenet --epochs 3 --json
#   bash bench/gpu_ab.sh torchrun --standalone --nproc_per_node 2 -m portanet.cli train ...
# Writes each run's output to $OUT/ab-<before|after>-<round>.txt and their last lines to
# $OUT/ab.txt.
source bench/gpu_setup.sh
ROOT=$PWD
for r in $(seq 1 ${ROUNDS:-2}); do for v in before after; do
    tree=$([ $v = before ] && echo "$ROOT/build/prev" || echo "$ROOT")
    (cd "$tree" && export PYTHONPATH=$tree:$PYTHONPATH \
        && python3 -c "import portanet; print('portanet from', portanet.__file__)" \
        && timeout ${RUN_S:-280} "$@") > "$OUT/ab-$v-$r.txt" 2>&1
    echo "$v $r: $(head -1 "$OUT/ab-$v-$r.txt") | $(tail -1 "$OUT/ab-$v-$r.txt")" \
        | tee -a "$OUT/ab.txt"
done; done
