#!/usr/bin/env bash
# Session 66, issue 18: codegen.EARLY_FRAME_WORDS (the frame task publishes x at entry, before it
# computes the scalars of x; a first-layer task stages x for its products and the scalars for the
# phase that reads them). One call (~570 s; the parts share a deadline):
# 1. its GPU tests (10 cases: 4 small, the sanitizers' targets, and 6 zoo archs at embed 256, each
#    against the interpreter and bit for bit the plain kernel) beside memcheck and racecheck of
#    the small ones;
# 2. device time, launched, of the fewer-phases tactic with and without it on the 11 zoo archs
#    (alternated twice);
# 3. resident_variants.py, the 11 zoo archs: default, early-frame (its launched step timed beside:
#    launched-early-frame) and resident-tagged-outputs, each bit for bit the launched plain kernel
#    over 200 frames.
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g26
ARCHS=${ARCHS:-min_gru,min_lstm,gru,lstm,gated_ssm,attention,liquid,jamba,delta_net,mamba,xlstm}
START=$(date +%s)
DEADLINE=${DEADLINE:-565}
left() { local l=$((DEADLINE - ($(date +%s) - START))); [ "$l" -gt "$1" ] && echo "$1" || echo "$l"; }
echo "== early-frame tests and sanitizers $(date +%T)"
bash tests/gpu/sanitize.sh memcheck $OUT/g26 -t 180 -k early_frame_small tests/gpu/test_stepkernel.py > $OUT/g26/memcheck.txt 2>&1 &
m=$!
bash tests/gpu/sanitize.sh racecheck $OUT/g26 -t 180 -k early_frame_small tests/gpu/test_stepkernel.py > $OUT/g26/racecheck.txt 2>&1 &
r=$!
timeout 170 python3 -m pytest -q -m gpu -rA -p no:cacheprovider -k early_frame tests/gpu/test_stepkernel.py > $OUT/g26/tests.log 2>&1
echo "tests rc=$? $(date +%T)"; grep -E "(PASSED|FAILED|ERROR) " $OUT/g26/tests.log | sed 's/.*:://' | cut -c1-160; tail -n 1 $OUT/g26/tests.log
wait $m $r
echo "== sanitizers $(date +%T)"; tail -n 2 $OUT/g26/memcheck.txt $OUT/g26/racecheck.txt
echo "== device time, launched $(date +%T)"
timeout $(left 150) python3 bench/microbench/stepkernel_variants.py --archs $ARCHS \
  --variants fewer-phases-tactic,fewer-phases-tactic+early-frame,fewer-phases-tactic,fewer-phases-tactic+early-frame \
  --out $OUT/g26/early.json 2>&1 | grep -v Warn | tee $OUT/g26/early.log
echo "== resident variants $(date +%T), $(left 999) s left"
timeout $(left 999) python3 bench/microbench/resident_variants.py --archs ${RARCHS:-$ARCHS} --rounds ${ROUNDS:-2} \
  --variants default,early-frame,resident-tagged-outputs --out $OUT/g26/resident.json 2>&1 \
  | grep -v -e Warn -e "session = Session" | tee $OUT/g26/resident.log
echo "done $(date +%T)"
