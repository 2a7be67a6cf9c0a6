#!/usr/bin/env bash
# Session 66, issue 18: codegen.EARLY_FRAME_WORDS (the frame task publishes x before it computes
# the scalars of x; a first-layer task stages x for its products and the scalars for the phase that
# reads them). One part a call:
#   PART=check   its GPU tests (10 cases: 4 small, the sanitizers' targets, and 6 zoo archs at
#                embed 256, each bit for bit the plain kernel and against the interpreter) beside
#                memcheck and racecheck of the small ones; then device time, launched, of the
#                fewer-phases tactic with and without it on the 11 zoo archs (~400 s)
#   PART=resident  resident_variants.py, the 11 zoo archs, 3 rounds: default, resident-tagged-outputs,
#                early-frame, early-frame-resident-tagged (each bit for bit the launched plain
#                kernel over 200 frames; early-frame's launched step timed beside) (~330 s)
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g26
ARCHS=${ARCHS:-min_gru,min_lstm,gru,lstm,gated_ssm,attention,liquid,jamba,delta_net,mamba,xlstm}
PART=${PART:?PART=check|resident}
if [ "$PART" = check ]; then
  echo "== early-frame tests and sanitizers $(date +%T)"
  timeout 230 bash tests/gpu/sanitize.sh memcheck $OUT/g26 -t 220 -k early_frame_small tests/gpu/test_stepkernel.py > $OUT/g26/memcheck.txt 2>&1 &
  m=$!
  timeout 230 bash tests/gpu/sanitize.sh racecheck $OUT/g26 -t 220 -k early_frame_small tests/gpu/test_stepkernel.py > $OUT/g26/racecheck.txt 2>&1 &
  r=$!
  timeout 200 python3 -m pytest -q -m gpu -rA -p no:cacheprovider -k early_frame tests/gpu/test_stepkernel.py > $OUT/g26/tests.log 2>&1
  echo "tests rc=$? $(date +%T)"; grep -E "(PASSED|FAILED|ERROR) " $OUT/g26/tests.log | sed 's/.*:://' | cut -c1-160; tail -n 1 $OUT/g26/tests.log
  wait $m $r
  echo "== sanitizers $(date +%T)"; tail -n 3 $OUT/g26/memcheck.txt $OUT/g26/racecheck.txt
  echo "== device time, launched $(date +%T)"
  timeout 170 python3 bench/microbench/stepkernel_variants.py --archs $ARCHS \
    --variants fewer-phases-tactic,fewer-phases-tactic+early-frame,fewer-phases-tactic,fewer-phases-tactic+early-frame \
    --out $OUT/g26/early.json 2>&1 | grep -v Warn | tee $OUT/g26/early.log
fi
if [ "$PART" = resident ]; then
  echo "== resident variants $(date +%T)"
  timeout 340 python3 bench/microbench/resident_variants.py --archs $ARCHS --rounds 3 \
    --variants default,resident-tagged-outputs,early-frame,early-frame-resident-tagged --out $OUT/g26/resident.json 2>&1 \
    | grep -v -e Warn -e "session = Session" | tee $OUT/g26/resident.log
fi
echo "done $(date +%T)"
