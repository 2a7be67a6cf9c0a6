#!/usr/bin/env bash
# Written in session 53, to run first in the next GPU session (~450 s): is stepkernel-fewer-phases
# faster everywhere, so that its settings can become the defaults (codegen.ALIAS_VIEWS,
# PHASE_ONE_PASS, ROOT_IN_ARRAY_WARP, schedule.RECOMPUTED_SCALARS = 64) and every other tactic
# stacks on them? Session 53 (bench/h100/2026-12-05-s53/) timed ten zoo step kernels, all faster by
# 3.4-6.6 %; not xlstm's step, the windows, or the real models. Device time under baseline /
# fewer-phases / baseline, outputs compared with the baseline's; then racecheck of the small
# fewer-phases and fewer-levels kernels (session 53's did not finish in its 150 s).
set -u
export TORCHINDUCTOR_CACHE_DIR=$PWD/build/cache/inductor TRITON_CACHE_DIR=$PWD/build/cache/triton FRAMEFUSE_CACHE=$PWD/build/cache/ff
mkdir -p build/cache $OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
V=baseline,fewer-phases,baseline
echo "== xlstm step, windows $(date +%T)"
timeout 200 python3 bench/microbench/stepkernel_variants.py --variants $V \
  --archs xlstm,min_gru/sequence32,lstm/sequence32,attention/sequence32,mamba/sequence32,jamba/sequence32,delta_net/sequence32,xlstm/sequence32 \
  > $OUT/variants-windows.log 2>&1; echo "rc=$? $(date +%T)"
echo "== real models $(date +%T)"
timeout 120 python3 bench/microbench/stepkernel_variants.py --variants $V \
  --archs real:mamba,real:jamba,real:gpt2_sdpa,real:llama_gqa_sdpa,real:gpt2_sdpa/sequence32,real:torch_lstm_bidir/sequence32 \
  > $OUT/variants-real.log 2>&1; echo "rc=$? $(date +%T)"
grep -h '^{' $OUT/variants-*.log | cut -c1-150
echo "== racecheck $(date +%T)"
timeout 110 bash tests/gpu/sanitize.sh racecheck /tmp/san -k "views_tactic and (fewer-levels or fewer-phases) and (mamba or lstm)" tests/gpu/test_stepkernel.py > $OUT/racecheck.summary 2>&1
echo "rc=$? $(date +%T)"; cat $OUT/racecheck.summary
