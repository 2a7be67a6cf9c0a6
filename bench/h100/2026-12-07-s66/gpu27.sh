#!/usr/bin/env bash
# Session 66, second call (~580 s, the parts under one deadline):
# 1. tests/gpu/test_resident.py whole with FRAMEFUSE_RESIDENT_TAGGED_OUTPUTS=1 (gpu25's PART=tests:
#    every resident test on the binding's tagged twin, and the twin test), then the fewer-SMs
#    tests with it off (the binding's buffers and graphs on the rescheduled step).
# 2. codegen.EARLY_FRAME_WORDS with the x store moved after the prologue's copies (g26: stored
#    before them, it waited for the frame's host read ahead of them), launched device time of the
#    fewer-phases tactic: plain / early-frame / early-frame-whole (no late scalar staging), twice.
# 3. its GPU tests and memcheck / racecheck of its small cases again (the store moved).
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g27
ARCHS=${ARCHS:-min_gru,min_lstm,gru,lstm,gated_ssm,attention,liquid,jamba,delta_net,mamba,xlstm}
START=$(date +%s)
DEADLINE=${DEADLINE:-575}
left() { local l=$((DEADLINE - ($(date +%s) - START))); [ "$l" -gt "$1" ] && echo "$1" || echo "$l"; }
echo "== test_resident.py with the twin $(date +%T)"
FRAMEFUSE_RESIDENT_TAGGED_OUTPUTS=1 timeout $(left ${RTIME:-240}) python3 -m pytest -q -m gpu -rA -p no:cacheprovider \
  --durations=15 tests/gpu/test_resident.py > $OUT/g27/resident-tests.log 2>&1
echo "rc=$? $(date +%T)"; grep -E "(PASSED|FAILED|ERROR) " $OUT/g27/resident-tests.log | sed 's/.*:://' | cut -c1-150; tail -n 1 $OUT/g27/resident-tests.log
echo "== fewer-SMs tests, flag off $(date +%T)"
timeout $(left 70) python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_resident.py -k "fewer_sms" 2>&1 | tail -n 2
echo "== early-frame device time $(date +%T)"
timeout $(left 160) python3 bench/microbench/stepkernel_variants.py --archs ${EARCHS:-$ARCHS} \
  --variants fewer-phases-tactic,fewer-phases-tactic+early-frame,fewer-phases-tactic+early-frame-whole,fewer-phases-tactic,fewer-phases-tactic+early-frame,fewer-phases-tactic+early-frame-whole \
  --out $OUT/g27/early.json 2>&1 | grep -v Warn | tee $OUT/g27/early.log
echo "== early-frame tests and sanitizers $(date +%T), $(left 999) s left"
L=$(left 999)
bash tests/gpu/sanitize.sh memcheck $OUT/g27 -t $((L - 10)) -k early_frame_small tests/gpu/test_stepkernel.py > $OUT/g27/memcheck.txt 2>&1 &
m=$!
bash tests/gpu/sanitize.sh racecheck $OUT/g27 -t $((L - 10)) -k early_frame_small tests/gpu/test_stepkernel.py > $OUT/g27/racecheck.txt 2>&1 &
r=$!
timeout $((L - 10)) python3 -m pytest -q -m gpu -p no:cacheprovider -k early_frame tests/gpu/test_stepkernel.py 2>&1 | tail -n 1
wait $m $r
tail -n 2 $OUT/g27/memcheck.txt $OUT/g27/racecheck.txt
echo "done $(date +%T)"
