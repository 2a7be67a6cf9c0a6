#!/usr/bin/env bash
# Session 66, written after its device time ran out (~420 s, one call):
# 1. codegen.EARLY_FRAME_WORDS as it is now (the x store after the prologue's copies, no late
#    scalars; the build's tactic stepkernel-fewer-phases-early-frame): its GPU tests (10 cases) and
#    compute-sanitizer memcheck and racecheck of the 4 small ones. Session 66's sanitizer calls
#    selected no test (`-k early_frame_small`); this -k selects 4 (sanitize.sh now fails on 0).
# 2. The rest of the resident tagged twin's tests (bench/pending/2026-12-06-s65/gpu25.sh PART=rest:
#    the 8 cases of test_resident.py after g27's 200 s cut) and a 6-round timing of delta_net, the
#    arch whose resident p99 was higher with the twin in g26 (17.4 -> 19.3 us) and in g21. If all
#    pass and delta_net's p99 is not higher: engines/stepkernel.RESIDENT_TAGGED_OUTPUTS on.
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g28
echo "== early-frame tests and sanitizers $(date +%T)"
bash tests/gpu/sanitize.sh memcheck $OUT/g28 -t 240 -k "early_frame and small" tests/gpu/test_stepkernel.py > $OUT/g28/memcheck.txt 2>&1 &
m=$!
bash tests/gpu/sanitize.sh racecheck $OUT/g28 -t 240 -k "early_frame and small" tests/gpu/test_stepkernel.py > $OUT/g28/racecheck.txt 2>&1 &
r=$!
timeout 150 python3 -m pytest -q -m gpu -rA -p no:cacheprovider -k early_frame tests/gpu/test_stepkernel.py > $OUT/g28/tests.log 2>&1
echo "tests rc=$? $(date +%T)"; tail -n 1 $OUT/g28/tests.log
wait $m $r
cat $OUT/g28/memcheck.txt $OUT/g28/racecheck.txt
echo "== the resident tagged twin: the rest of its tests $(date +%T)"
PART=rest bash bench/pending/2026-12-06-s65/gpu25.sh
cp $OUT/g25/rest.log $OUT/g28/ 2>/dev/null
echo "== delta_net, 6 rounds $(date +%T)"
timeout 90 python3 bench/microbench/resident_variants.py --archs delta_net,gru --rounds 6 \
  --variants default,resident-tagged-outputs --out $OUT/g28/resident.json 2>&1 | grep -v -e Warn -e "session = Session" | tee $OUT/g28/resident.log
echo "done $(date +%T)"
