#!/usr/bin/env bash
# Session 65 (~700 s; in calls of one part if need be: PART=tests / timing / levels): the resident binding's own
# tagged-outputs kernel beside the engine's untagged launched kernel
# (engines/stepkernel.RESIDENT_TAGGED_OUTPUTS, off until this passes; written after session 65's
# device time ran out, never run on a GPU).
# 1. tests/gpu/test_resident.py whole with FRAMEFUSE_RESIDENT_TAGGED_OUTPUTS=1: every resident
#    test on the twin (the 11 zoo archs bit for bit the launched step over 10,000 frames, the
#    state calls, the watchdog, start / stop 1,000 times, fewer SMs, a killed process), and the twin
#    test itself (it sets the flag both ways); then the fewer-SMs tests with the flag off.
# 2. resident_variants.py, the 11 zoo archs, default vs resident-tagged-outputs, 3 rounds: the
#    same gains as g21's tagged-outputs rows (session 65: p50 0.6-0.9 us lower on all 11)?
# If 1 passes and 2 is faster at p50 and p99 on every arch: RESIDENT_TAGGED_OUTPUTS on by default.
# 3. (PART=levels) device time of the fewer-levels tactic at 384 threads against fewer-phases.
# Session 66 ran most of it (bench/h100/2026-12-07-s66/): with the twin on, test_resident.py's
# first 46 of 54 cases passed before the 200 s cut (every zoo arch over 10,000 frames, ONNX Runtime,
# the twin test, state calls, start / stop 1,000 times, the watchdog, a killed process); the
# fewer-SMs tests with it off, 7 passed; the timing (g26). Left: PART=rest, the 8 cases after the
# cut with the twin on (~120 s), and PART=levels.
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g25
if [ "${PART:-}" = rest ]; then
  echo "== the rest of test_resident.py with the twin $(date +%T)"
  FRAMEFUSE_RESIDENT_TAGGED_OUTPUTS=1 timeout 300 python3 -m pytest -q -m gpu -rA -p no:cacheprovider tests/gpu/test_resident.py \
    -k "gpu_work_beside or needs_the_step_kernel or on_fewer_sms_matches or created_and_dropped" > $OUT/g25/rest.log 2>&1
  echo "rc=$? $(date +%T)"; grep -E "(PASSED|FAILED|ERROR) " $OUT/g25/rest.log | sed 's/.*:://' | cut -c1-150; tail -n 1 $OUT/g25/rest.log
fi
if [ -z "${PART:-}" ] || [ "$PART" = tests ]; then
  echo "== test_resident.py with the twin $(date +%T)"
  FRAMEFUSE_RESIDENT_TAGGED_OUTPUTS=1 timeout 330 python3 -m pytest -q -m gpu -rA -p no:cacheprovider \
    tests/gpu/test_resident.py > $OUT/g25/tests.log 2>&1
  echo "rc=$? $(date +%T)"; grep -E "(PASSED|FAILED|ERROR) " $OUT/g25/tests.log | sed 's/.*:://' | cut -c1-150; tail -n 2 $OUT/g25/tests.log
  # with it off: the fewer-SMs path, whose binding now builds its buffers and launched graphs on the
  # rescheduled step (session 65; before, on the engine's, with the done words made again after)
  echo "== fewer-SMs tests, flag off $(date +%T)"
  timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_resident.py -k "fewer_sms" 2>&1 | tail -n 2
fi
if [ -z "${PART:-}" ] || [ "$PART" = timing ]; then
  echo "== resident variants $(date +%T)"
  timeout 260 python3 bench/microbench/resident_variants.py --archs min_gru,min_lstm,gru,lstm,gated_ssm,attention,liquid,jamba,delta_net,mamba,xlstm \
    --rounds 3 --variants default,resident-tagged-outputs --out $OUT/g25/resident.json 2>&1 \
    | grep -v -e Warn -e "session = Session" | tee $OUT/g25/resident.log
fi
if [ -z "${PART:-}" ] || [ "$PART" = levels ]; then
  # 3. the replicated products (fewer-levels) at 384 threads: mamba's x_proj on 8 lanes of 64
  #    multiply-adds an element, not 4 of 128 (levels mamba 10 -> 8, jamba 8 -> 7, delta_net 8 -> 6)
  echo "== fewer levels at 384 threads $(date +%T)"
  timeout 200 python3 bench/microbench/stepkernel_variants.py --archs mamba,jamba,delta_net \
    --variants 384-threads-fewer-phases,fewer-levels-tactic,384-threads-fewer-levels,384-threads-fewer-phases \
    --out $OUT/g25/levels.json 2>&1 | grep -v Warn | tee $OUT/g25/levels.log
fi
echo "done $(date +%T)"
