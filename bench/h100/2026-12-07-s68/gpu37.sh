#!/usr/bin/env bash
# Session 68 (~300 s, one call on an H100): the leader chosen as the block that joins the frame last
# (codegen.RESIDENT_LEADER_LAST, off until timed): g35's mamba trace with the framer's go had block 0,
# the leader, entering the first 128-block task ~1 us after the others (its bell poll in flight as
# the go came).
# Also mamba's and jamba's SSM root a warp per element (codegen.WARP_SPLIT_MIN 16, variant
# warp-roots-16): g35's mamba trace had that level's last phase at 1.2-1.4k cycles, 4 threads of a
# block each looping over the 16 states.
# 1. resident_variants, 11 zoo archs: leader-last and warp-roots-16 against default (the framer's
#    go, the first block that reads no frame as leader), 2 rounds
# 2. the resident trace of mamba with both (module settings patched in below)
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g37
echo "== resident, 11 archs $(date +%T)"
timeout 300 python3 bench/microbench/resident_variants.py \
  --archs min_gru,min_lstm,gru,lstm,gated_ssm,attention,liquid,jamba,delta_net,mamba,xlstm --rounds 2 \
  --variants default,leader-last,warp-roots-16 --out $OUT/g37/resident.json 2>&1 \
  | grep -v -e Warn -e "session = Session" | tee $OUT/g37/resident.log
echo "== resident trace $(date +%T)"
timeout 60 python3 -c "import sys; sys.argv = ['stepkernel.py', '--archs', ',', '--trace-resident', 'mamba', \
'--select', 'stepkernel-fewer-phases', '--out', '$OUT/g37/traces']; sys.path.insert(0, 'bench'); \
from framefuse.compiler import codegen; codegen.RESIDENT_LEADER_LAST = True; codegen.WARP_SPLIT_MIN = 16; import stepkernel; raise SystemExit(stepkernel.main())" 2>&1 | grep -e "^trace-resident" -e Error | tee $OUT/g37/traces.log
echo "done $(date +%T)"
