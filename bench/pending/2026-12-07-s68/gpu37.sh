#!/usr/bin/env bash
# Session 68 (~300 s, one call on an H100): the leader chosen as the block that joins the frame last
# (codegen.RESIDENT_LEADER_LAST, off until timed): g35's mamba trace with the framer's go had block 0,
# the leader, entering the first 128-block task ~1 us after the others (its bell poll in flight as
# the go came).
# 1. resident_variants, 11 zoo archs: leader-last against default (the framer's go, the first block
#    that reads no frame as leader) and leader-go (session 67's default), 2 rounds
# 2. the resident trace of mamba with the leader last (FRAMEFUSE_... not a setting: patched in below)
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g37
echo "== resident, 11 archs $(date +%T)"
timeout 300 python3 bench/microbench/resident_variants.py \
  --archs min_gru,min_lstm,gru,lstm,gated_ssm,attention,liquid,jamba,delta_net,mamba,xlstm --rounds 2 \
  --variants default,leader-last,leader-go --out $OUT/g37/resident.json 2>&1 \
  | grep -v -e Warn -e "session = Session" | tee $OUT/g37/resident.log
echo "== resident trace $(date +%T)"
timeout 60 python3 -c "import sys; sys.argv = ['stepkernel.py', '--archs', ',', '--trace-resident', 'mamba', \
'--select', 'stepkernel-fewer-phases', '--out', '$OUT/g37/traces']; sys.path.insert(0, 'bench'); \
from framefuse.compiler import codegen; codegen.RESIDENT_LEADER_LAST = True; import stepkernel; raise SystemExit(stepkernel.main())" 2>&1 | grep -e "^trace-resident" -e Error | tee $OUT/g37/traces.log
echo "done $(date +%T)"
