#!/usr/bin/env bash
# Session 53's GPU call (device time was scarce: each failed start cost 90-105 s of it): the
# decisive parts of gpu1.sh and gpu2.sh in one call, with session 53's stepkernel-fewer-levels,
# the most informative first (a call cut by its limit still brings back what it wrote).
# 1. Device time of every zoo step kernel under baseline / fewer-phases / fewer-levels, then of the
#    transformers models at T = 1 (Mamba, Jamba, GPT-2, Llama: 10 -> 4, 12 -> 3, 10 -> 2, 9 -> 2
#    levels with fewer-levels), each variant's outputs compared with the baseline's.
# 2. The fewer-levels tactic (and fewer-phases at 256 threads where fewer-levels changes nothing)
#    against ONNX Runtime: every zoo architecture at embed 256 over 200 chained steps, and at
#    embed 64 launched and resident; memcheck and racecheck on the small fewer-levels kernels where
#    the schedule changes.
# 3. Session.step p50 / p99, launched and resident, of the fewer-levels tactic, parity over 1,000
#    steps, the traces of mamba and xlstm.
set -u
export TORCHINDUCTOR_CACHE_DIR=$PWD/build/cache/inductor TRITON_CACHE_DIR=$PWD/build/cache/triton FRAMEFUSE_CACHE=$PWD/build/cache/ff
mkdir -p build/cache $OUT/tests $OUT/views
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
ARCHS=min_gru,min_lstm,gru,lstm,gated_ssm,attention,liquid,jamba,delta_net,mamba,xlstm
echo "== variants $(date +%T)"
timeout 170 python3 bench/microbench/stepkernel_variants.py --archs $ARCHS --variants baseline,fewer-phases,fewer-levels,baseline \
  > $OUT/views/variants.log 2>&1; echo "rc=$? $(date +%T)"
timeout 70 python3 bench/microbench/stepkernel_variants.py --archs real:mamba,real:jamba,real:gpt2_sdpa,real:llama_gqa_sdpa --variants baseline,fewer-levels,baseline \
  > $OUT/views/variants-real.log 2>&1; echo "rc=$? $(date +%T)"
python3 - $OUT/views/variants.log $OUT/views/variants-real.log <<'PY'
import json, sys
for path in sys.argv[1:]:
    rows = [json.loads(l) for l in open(path) if l.startswith("{")]
    by = {}
    for r in rows:
        by.setdefault(r["arch"], []).append(f"{r['variant']} {r['us_per_step']:.2f}us L{r.get('levels', '-')} d={r['max_abs_diff_vs_baseline']}")
    for a, v in by.items():
        print(a, " | ".join(v))
PY
echo "== tests + sanitizers $(date +%T)"
SAN="views_tactic and fewer-levels and (mamba or delta_net or jamba)"
(timeout 150 bash tests/gpu/sanitize.sh memcheck /tmp/san -k "$SAN" tests/gpu/test_stepkernel.py > /tmp/san-memcheck.summary 2>&1) &
(timeout 150 bash tests/gpu/sanitize.sh racecheck /tmp/san -k "$SAN" tests/gpu/test_stepkernel.py > /tmp/san-racecheck.summary 2>&1) &
timeout 150 python3 -m pytest -m gpu -q -n 8 -p no:cacheprovider -rfE tests/gpu/test_stepkernel.py \
  -k "fewer-levels or (tactics_match and fewer-phases and not 384 and (gru or lstm or liquid))" > $OUT/tests/tests.log 2>&1
echo "pytest rc=$? $(date +%T)"; tail -n 8 $OUT/tests/tests.log
wait; echo "sanitizers done $(date +%T)"
(cat /tmp/san-memcheck.summary /tmp/san-racecheck.summary; for f in /tmp/san/*.log; do echo "== $f"; tail -n 40 $f; done) > $OUT/tests/sanitizers.log 2>&1
cat /tmp/san-memcheck.summary /tmp/san-racecheck.summary
sel=stepkernel-fewer-levels
echo "== bench/stepkernel.py --select $sel $(date +%T)"
timeout 150 python3 bench/stepkernel.py --archs $ARCHS --select $sel --steps 1000 --no-plan --trace mamba,xlstm --out $OUT/views/$sel > $OUT/views/$sel.log 2>&1
echo "rc=$? $(date +%T)"; grep -E "^[a-z_]+ +[0-9]+ " $OUT/views/$sel.log | tail -n 12
