#!/usr/bin/env bash
# GPU call 2 (written in sessions 51-52): do stepkernel-views (codegen.ALIAS_VIEWS, a phase less in
# each task that reads a view of its own arrays) and stepkernel-fewer-phases (the views,
# codegen.PHASE_ONE_PASS: a phase's products in one pass of the warps, ROOT_IN_ARRAY_WARP: a root
# that publishes its one product computed by that product's lanes) make the zoo's step kernels
# faster (issue 18)? Device time of each kernel against its own source with the settings on
# (stepkernel_variants.py, outputs compared), then launched and resident Session.step p50 / p99 of
# the plain kernel and of the tactic's (bench/stepkernel.py, parity over 1,000 chained steps
# against ONNX Runtime), with the per-task timeline of mamba and xlstm.
set -u
export TORCHINDUCTOR_CACHE_DIR=$PWD/build/cache/inductor TRITON_CACHE_DIR=$PWD/build/cache/triton FRAMEFUSE_CACHE=$PWD/build/cache/ff
mkdir -p build/cache $OUT/views
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
ARCHS=min_gru,min_lstm,gru,lstm,gated_ssm,attention,liquid,jamba,delta_net,mamba,xlstm
echo "== variants $(date +%T)"
timeout 270 python3 bench/microbench/stepkernel_variants.py --archs $ARCHS --variants baseline,alias-views,one-pass,recomputed-scalars,fewer-phases,baseline \
  --out $OUT/views/variants.json > $OUT/views/variants.log 2>&1; echo "rc=$? $(date +%T)"; grep -v Warn $OUT/views/variants.log | tail -n 30
for sel in stepkernel stepkernel-fewer-phases; do
  echo "== bench/stepkernel.py --select $sel $(date +%T)"
  timeout 140 python3 bench/stepkernel.py --archs $ARCHS --select $sel --steps 1000 --no-plan --trace mamba,xlstm --out $OUT/views/$sel > $OUT/views/$sel.log 2>&1
  echo "rc=$? $(date +%T)"; grep -E "^[a-z_]+ +[0-9]+ " $OUT/views/$sel.log | tail -n 12
done
