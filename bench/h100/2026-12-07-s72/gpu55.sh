#!/usr/bin/env bash
# Session 72 (~450 s, one call on an H100), with codegen.RESIDENT_FRAMER_REPLICAS on by default:
# 1) resident_spread.py on the other three archs that get a replica (min_lstm, liquid, mamba),
#    3 sessions x 3 launches, without (--replicas 0) and with, alternating, twice;
# 2) memcheck and racecheck on the small replica cases (min_gru, mamba; native and Python paths);
# 3) tests/gpu/test_resident.py whole.
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g55
for pass in 1 2; do
  for v in off on; do
    flag=""; [ $v = off ] && flag="--replicas 0"
    timeout 70 python3 bench/microbench/resident_spread.py --archs min_lstm,liquid,mamba --sessions 3 --launches 3 \
      $flag --out $OUT/g55/spread-$v-$pass.json 2>&1 | grep -v -e Warn -e "session = Session" \
      | python3 -c "import sys,json
for l in sys.stdin:
    try: r=json.loads(l); print('$v', r['arch'], r['session'], r['launch'], r['p50_us'], r['p99_us'], r['frame_copies'])
    except Exception: print(l.rstrip()[:200])" >> $OUT/g55/spread.log
  done
done
tail -3 $OUT/g55/spread.log
k="framer_replicas and small"
bash tests/gpu/sanitize.sh memcheck $OUT/g55/sanitize -t 150 -k "$k" tests/gpu/test_resident.py &
bash tests/gpu/sanitize.sh racecheck $OUT/g55/sanitize -t 150 -k "$k" tests/gpu/test_resident.py &
wait
timeout 290 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider tests/gpu/test_resident.py --durations=10 \
  > $OUT/g55/test_resident.log 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/g55/test_resident.log | cut -c1-200; tail -n 1 $OUT/g55/test_resident.log
echo "done $(date +%T)"
