#!/usr/bin/env bash
# Session 67 (~260 s): the resident tagged twin's 8 test_resident.py cases left (gpu25.sh
# PART=rest), then resident Session.step default / the twin on delta_net and gru, 5 rounds.
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g31
echo "== the resident tagged twin: the rest of its tests $(date +%T)"
FRAMEFUSE_RESIDENT_TAGGED_OUTPUTS=1 timeout 150 python3 -m pytest -q -m gpu -rA -p no:cacheprovider tests/gpu/test_resident.py \
  -k "gpu_work_beside or needs_the_step_kernel or on_fewer_sms_matches or created_and_dropped" > $OUT/g31/twin-rest.log 2>&1
echo "rc=$? $(date +%T)"; grep -E "(PASSED|FAILED|ERROR) " $OUT/g31/twin-rest.log | sed 's/.*:://' | cut -c1-150; tail -n 1 $OUT/g31/twin-rest.log
echo "== resident: default / twin, 5 rounds $(date +%T)"
timeout 100 python3 bench/microbench/resident_variants.py --archs delta_net,gru --rounds 5 \
  --variants default,resident-tagged-outputs --out $OUT/g31/resident.json 2>&1 \
  | grep -v -e Warn -e "session = Session" | tee $OUT/g31/resident.log
echo "done $(date +%T)"
