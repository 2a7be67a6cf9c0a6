#!/usr/bin/env bash
# Session 54, GPU call 7 (~250 s): why fewer phases can be slower. Session 54 timed
# stepkernel-fewer-phases slower than the plain kernel for the transformers Llama at T = 1 (14.04 ->
# 14.68 us device time; 43 -> 36 phases, the same 9 levels) and the zoo lstm window at T = 32
# (61.3 -> 62.3; 23 -> 16 phases, 7 levels), where it was faster for every zoo step kernel. The
# per-task timeline (entry, inputs arrived, exit per block; each phase's cycles) of both kernels of
# both models says which tasks got longer.
set -u
export TORCHINDUCTOR_CACHE_DIR=$PWD/build/cache/inductor TRITON_CACHE_DIR=$PWD/build/cache/triton FRAMEFUSE_CACHE=$PWD/build/cache/ff
mkdir -p build/cache $OUT/plain $OUT/fewer
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
T=lstm/sequence32,real:llama_gqa_sdpa
echo "== plain $(date +%T)"
timeout 110 python3 bench/stepkernel.py --archs , --select stepkernel --trace $T --out $OUT/plain > $OUT/plain/trace.log 2>&1; echo "rc=$? $(date +%T)"
echo "== fewer-phases $(date +%T)"
timeout 110 python3 bench/stepkernel.py --archs , --select stepkernel-fewer-phases --trace $T --out $OUT/fewer > $OUT/fewer/trace.log 2>&1; echo "rc=$? $(date +%T)"
python3 - "$OUT" <<'PY'
import json, sys
for kind in ("plain", "fewer"):
    traces = json.load(open(f"{sys.argv[1]}/{kind}/stepkernel.json"))["traces"]
    for arch, rows in traces.items():
        if isinstance(rows, dict):
            print(kind, arch, rows.get("error")); continue
        for r in rows:
            print(kind, arch, r.get("task"), str(r.get("value"))[:32], r.get("phases"), r.get("enter_us"), r.get("ready_us"), r.get("exit_us"), r.get("phase_cycles"))
PY
