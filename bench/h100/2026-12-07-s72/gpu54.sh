#!/usr/bin/env bash
# Session 72 (~150 s, one call on an H100). g53 timed the frame-block replicas in 6 launches a
# variant in which the default never took the slow phase (min_gru 8.99-9.06 us p50 in all 6), so it
# could not say whether a replica saves the slow launches' second read. Here many launches each:
# resident_spread.py over min_gru, gru and lstm, 4 sessions x 3 launches, alternating the default
# and the replicas (1,100 cycles) twice, each process its own kernel.
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g54
for pass in 1 2; do
  for v in default replicas; do
    flag=""; [ $v = replicas ] && flag="--replicas 1100"
    timeout 80 python3 bench/microbench/resident_spread.py --archs min_gru,gru,lstm --sessions 4 --launches 3 \
      --iters 2000 $flag --out $OUT/g54/spread-$v-$pass.json 2>&1 | grep -v -e Warn -e "session = Session" \
      | python3 -c "import sys,json
for l in sys.stdin:
    try: r=json.loads(l); print('$v', r['arch'], r['session'], r['launch'], r['p50_us'], r['p99_us'], r['frame_copies'])
    except Exception: print(l.rstrip()[:200])" | tee -a $OUT/g54/spread.log
  done
done
echo "done $(date +%T)"
