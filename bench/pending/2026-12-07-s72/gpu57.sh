#!/usr/bin/env bash
# Session 72, not run (~260 s, one call on an H100). Two replicas of each frame block
# (codegen.RESIDENT_REPLICAS_PER_FRAME_BLOCK 2: copies 1 and 2 of the frame words polled a third and
# two thirds of a poll period behind the frame block; only where 2 free blocks besides the leader):
# 1) the replica GPU tests, one and two replicas (bit for bit the launched kernel, native and Python
#    frame paths, a restart after an odd number of frames);
# 2) memcheck and racecheck on the small cases (two replicas among them);
# 3) resident_spread.py on min_gru, gru and lstm, 4 sessions x 3 launches, one replica (the default)
#    and two alternating, twice. Keep two only if its median p50 and median p99 are not worse.
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g57
timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_resident.py -k framer_replicas \
  2>&1 | tail -5 | tee $OUT/g57/tests.log
k="framer_replicas and small"
bash tests/gpu/sanitize.sh memcheck $OUT/g57/sanitize -t 150 -k "$k" tests/gpu/test_resident.py &
bash tests/gpu/sanitize.sh racecheck $OUT/g57/sanitize -t 150 -k "$k" tests/gpu/test_resident.py &
wait
for pass in 1 2; do
  for each in 1 2; do
    timeout 45 python3 bench/microbench/resident_spread.py --archs min_gru,gru,lstm --sessions 4 --launches 3 \
      --replicas-each $each --out $OUT/g57/spread-$each-$pass.json 2>&1 | grep -v -e Warn -e "session = Session" \
      | cut -c1-160 >> $OUT/g57/spread.log
  done
done
d=$OUT/g57
python3 bench/microbench/resident_spread.py --summarize one=$d/spread-1-1.json,$d/spread-1-2.json \
  two=$d/spread-2-1.json,$d/spread-2-2.json | tee $d/summary.log
echo "done $(date +%T)"
