#!/usr/bin/env bash
# Session 58, GPU call 10 (~550 s): x in registers (codegen.DOT_X_IN_REGISTERS, ffk_load_x /
# ffk_warp_dot_x: a warp's rows of one long product that all read one x row load x once). (1) Device
# time of the fewer-levels kernels with and without it, where it applies at the H100's grid (the
# replicated products: mamba's and jamba's x_proj, delta_net's, attention's; the transformers
# Mamba / Jamba / Llama at T = 1), fewer-phases beside (stepkernel_variants.py, outputs compared);
# (2) the plain kernel on 16 and 33 blocks (a small GPU's share of rows: every product of 256 or
# more has several rows a warp) with and without (bench/stepkernel.py --sweep +xregs); (3) the GPU
# tests of the kernels that use it (every zoo architecture on 16 blocks, the fewer-levels ones on
# 132) and the fewer-levels tactic tests; (4) memcheck and racecheck on a kernel that uses it;
# (5) launched and resident Session.step p50 / p99 of fewer-levels (x in registers since session
# 58) against fewer-phases, parity over 1,000 steps; (6) mamba's per-task timeline with fewer-levels + x in registers (the x_proj phase's cycles:
# 2,757-3,337 in session 53).
set -u
export TORCHINDUCTOR_CACHE_DIR=$PWD/build/cache/inductor TRITON_CACHE_DIR=$PWD/build/cache/triton FRAMEFUSE_CACHE=$PWD/build/cache/ff
mkdir -p build/cache $OUT/xregs
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== variants $(date +%T)"
timeout 150 python3 bench/microbench/stepkernel_variants.py --archs mamba,jamba,delta_net,attention \
  --variants fewer-phases,fewer-levels,fewer-levels+x-in-registers,fewer-levels,fewer-levels+x-in-registers,fewer-phases \
  > $OUT/xregs/variants.log 2>&1; echo "rc=$? $(date +%T)"
timeout 80 python3 bench/microbench/stepkernel_variants.py --archs real:mamba,real:jamba,real:llama_gqa_sdpa \
  --variants baseline,fewer-levels,fewer-levels+x-in-registers,fewer-levels,fewer-levels+x-in-registers,baseline \
  > $OUT/xregs/variants-real.log 2>&1; echo "rc=$? $(date +%T)"
python3 - $OUT/xregs/variants.log $OUT/xregs/variants-real.log <<'PY'
import json, sys
for path in sys.argv[1:]:
    rows = [json.loads(l) for l in open(path) if l.startswith("{")]
    by = {}
    for r in rows:
        by.setdefault(r["arch"], []).append(f"{r['variant']} {r.get('us_per_step', float('nan')):.2f}us L{r.get('levels', '-')} d={r.get('max_abs_diff_vs_baseline')}")
    for a, v in by.items():
        print(a, " | ".join(v))
PY
echo "== sweep on few blocks $(date +%T)"
timeout 120 python3 bench/stepkernel.py --archs , --sweep mamba,mamba+xregs,min_gru,min_gru+xregs,attention,attention+xregs,lstm,lstm+xregs \
  --grids 16,33 --threads 256 --out $OUT/xregs/sweep > $OUT/xregs/sweep.log 2>&1; echo "rc=$? $(date +%T)"
grep "sweep " $OUT/xregs/sweep.log | sed 's/.*\] //'
echo "== tests + sanitizers $(date +%T)"
SAN="x_in_registers and mamba and 132"
(timeout 150 bash tests/gpu/sanitize.sh memcheck /tmp/san -k "$SAN" tests/gpu/test_stepkernel.py > /tmp/san-memcheck.summary 2>&1) &
(timeout 150 bash tests/gpu/sanitize.sh racecheck /tmp/san -k "$SAN" tests/gpu/test_stepkernel.py > /tmp/san-racecheck.summary 2>&1) &
timeout 150 python3 -m pytest -m gpu -q -n 8 -p no:cacheprovider -rfE tests/gpu/test_stepkernel.py \
  -k "x_in_registers or fewer-levels" > $OUT/xregs/tests.log 2>&1
echo "pytest rc=$? $(date +%T)"; tail -n 8 $OUT/xregs/tests.log
wait
cat /tmp/san-memcheck.summary /tmp/san-racecheck.summary | tail -n 12
cp /tmp/san-memcheck.summary $OUT/xregs/memcheck.summary 2>/dev/null; cp /tmp/san-racecheck.summary $OUT/xregs/racecheck.summary 2>/dev/null
for sel in stepkernel-fewer-phases stepkernel-fewer-levels; do
  echo "== bench/stepkernel.py --select $sel $(date +%T)"
  timeout 110 python3 bench/stepkernel.py --archs mamba,jamba,delta_net,attention --select $sel --steps 1000 --no-plan \
    --out $OUT/xregs/$sel > $OUT/xregs/$sel.log 2>&1
  echo "rc=$? $(date +%T)"; grep -E "^[a-z_]+ +[0-9]+ " $OUT/xregs/$sel.log | tail -n 4
done
echo "== trace $(date +%T)"
timeout 60 python3 - <<'PY' 2>&1 | grep -v Warn | tail -n 16
import sys; sys.path.insert(0, "bench")
from pathlib import Path
import stepkernel
from framefuse.engines import fusion
for on in (False, True):
    fusion.STEPKERNELS["stepkernel-fewer-levels"] = {**fusion.STEPKERNELS["stepkernel-fewer-levels"], "x_in_registers": on}
    print("x in registers", on)
    stepkernel.trace_arch("mamba", Path("/tmp/trace"), select="stepkernel-fewer-levels")
PY
echo "== done $(date +%T)"
