#!/usr/bin/env bash
# Session 58, one call (~570 s) with the must-haves of gpu9.sh (session 57) and gpu10.sh, for a
# session whose device starts keep failing: (1) the GPU tests of every window with a recurrence
# under session 57's defaults (input helpers, together), the x-in-registers tests (every zoo
# architecture on 16 blocks, the fewer-levels ones on 132) and the fewer-levels tactic tests, with
# memcheck and racecheck on an x-in-registers kernel beside; (2) device time of fewer-levels with
# and without x in registers, fewer-phases beside; (3) launched and resident Session.step of
# fewer-levels (x in registers) against fewer-phases; (4) the resident fewer-SMs test that hung
# (faulthandler at 40 s). What is left of gpu9.sh / gpu10.sh: rnn_sizes, the few-block sweep, the
# real-model variants, the trace, the lazy-loading probe.
set -u
export TORCHINDUCTOR_CACHE_DIR=$PWD/build/cache/inductor TRITON_CACHE_DIR=$PWD/build/cache/triton FRAMEFUSE_CACHE=$PWD/build/cache/ff
mkdir -p build/cache $OUT/s58
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== tests + sanitizers $(date +%T)"
SAN="x_in_registers and mamba and 132"
(timeout 190 bash tests/gpu/sanitize.sh memcheck /tmp/san -t 170 -k "$SAN" tests/gpu/test_stepkernel.py > /tmp/san-memcheck.summary 2>&1) &
(timeout 190 bash tests/gpu/sanitize.sh racecheck /tmp/san -t 170 -k "$SAN" tests/gpu/test_stepkernel.py > /tmp/san-racecheck.summary 2>&1) &
timeout 180 python3 -m pytest -m gpu -q -n 8 -p no:cacheprovider -rfE tests/gpu/test_stepkernel.py \
  -k "(sequence_window and (lstm or gru or liquid or xlstm)) or rnn_size_tactics or wide_or_long_rnn or x_in_registers or fewer-levels" \
  > $OUT/s58/tests.log 2>&1
echo "pytest rc=$? $(date +%T)"; tail -n 8 $OUT/s58/tests.log
wait
tail -n 3 /tmp/san-memcheck.summary /tmp/san-racecheck.summary
cat /tmp/san-memcheck.summary /tmp/san-racecheck.summary > $OUT/s58/sanitizers.summary 2>/dev/null
echo "== variants $(date +%T)"
timeout 100 python3 bench/microbench/stepkernel_variants.py --archs mamba,jamba,delta_net \
  --variants fewer-phases,fewer-levels,fewer-levels+x-in-registers,fewer-levels,fewer-levels+x-in-registers,fewer-phases \
  > $OUT/s58/variants.log 2>&1; echo "rc=$? $(date +%T)"
python3 - $OUT/s58/variants.log <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
by = {}
for r in rows:
    by.setdefault(r["arch"], []).append(f"{r['variant']} {r.get('us_per_step', float('nan')):.2f}us L{r.get('levels', '-')} d={r.get('max_abs_diff_vs_baseline')}")
for a, v in by.items():
    print(a, " | ".join(v))
PY
for sel in stepkernel-fewer-phases stepkernel-fewer-levels; do
  echo "== bench/stepkernel.py --select $sel $(date +%T)"
  timeout 70 python3 bench/stepkernel.py --archs mamba,jamba,delta_net --select $sel --steps 1000 --no-plan \
    --out $OUT/s58/$sel > $OUT/s58/$sel.log 2>&1
  echo "rc=$? $(date +%T)"; grep -E "^[a-z_]+ +[0-9]+ " $OUT/s58/$sel.log | tail -n 3
done
echo "== resident_sms $(date +%T)"
timeout 70 python3 -m pytest -m gpu -q -s -p no:cacheprovider -o faulthandler_timeout=40 tests/gpu/test_resident.py \
  -k "fewer_sms or first_used_beside" > $OUT/s58/resident_sms.log 2>&1; echo "rc=$? $(date +%T)"
grep -v "^\s*$" $OUT/s58/resident_sms.log | grep -E "File \"/|Thread|Timeout|passed|failed|Error|Warning" | head -n 30
echo "== done $(date +%T)"
