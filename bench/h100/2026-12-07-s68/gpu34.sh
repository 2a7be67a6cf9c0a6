#!/usr/bin/env bash
# Session 68 (~250 s, one call on an H100): the resident kernel's own timeline (bench/stepkernel.py
# --trace-resident, new in session 68): session 67's traces were of the launched kernel, whose
# weight rows are copied every launch, so its levels are not the resident frame's. Five archs on
# the fewer-phases tactic: 20 samples of 50 frames each, the last frame's stamps; the traced
# resident kernel's outputs checked bit for bit against the untraced launched kernel's.
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g34
echo "== resident traces $(date +%T)"
timeout 400 python3 bench/stepkernel.py --archs , --trace-resident min_gru,attention,mamba,xlstm,jamba \
  --select stepkernel-fewer-phases --out $OUT/g34/traces 2>&1 | grep -v -e Warn -e "session = Session" \
  | grep -e "^trace-resident" -e Error -e error | tee $OUT/g34/traces.log
echo "done $(date +%T)"
