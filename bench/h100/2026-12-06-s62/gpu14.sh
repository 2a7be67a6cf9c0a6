#!/usr/bin/env bash
# Session 62: products of a recurrence's output split into partial sums (compiler/simplify.
# SplitProducts, the stepkernel-split tactics: levels min_gru, min_lstm, gated_ssm 6 -> 4, jamba
# 8 -> 6, mamba 10 -> 8). One call on an H100, from the repository root, after the wheel install:
#   bash bench/pending/2026-12-06-s62/gpu14.sh     (~300 s; each part cut by its own limit)
# 1. bench/microbench/split_products.py: stepkernel-384-threads-fewer-phases against
#    stepkernel-384-threads-split, each built with select=<tactic>: levels, parity (500 chained
#    steps against ONNX Runtime), resident bit for bit the launched kernel, device time, and
#    Session.step p50 / p99 launched and resident, 3 interleaved rounds.
# 2. The GPU tests of split products (test_stepkernel.py -k split: 7 cases at embed 256 against the
#    interpreter and ONNX Runtime, 2 small) and session 62's fix of test_driver_replay_matches_torch_replay.
# 3. compute-sanitizer memcheck and racecheck of split products' small cases.
# With "short" (a session's last minutes of device time, ~200 s): min_gru and mamba only, their
# 384-thread GPU tests, memcheck of the small min_gru case.
set -u
short=${1:-}
archs=min_gru,mamba,jamba,gated_ssm,min_lstm; tests="split or driver_replay"; tools="memcheck racecheck"
[ "$short" = short ] && archs=min_gru,mamba && tests="split_products_match and 384 and (min_gru or mamba)" && tools=memcheck
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g14
echo "== split_products $(date +%T)"
timeout 120 python3 bench/microbench/split_products.py --archs $archs --rounds 2 --steps 300 \
  --out $OUT/g14/split.json 2>&1 | grep -v Warn | tee $OUT/g14/split.log
echo "== GPU tests $(date +%T)"
timeout 90 python3 -m pytest -v -m gpu -k "$tests" tests/gpu/test_stepkernel.py \
  tests/gpu/test_session.py::test_driver_replay_matches_torch_replay -p no:cacheprovider > $OUT/g14/tests.log 2>&1
echo "rc=$? $(date +%T)"; grep -E " (PASSED|FAILED|ERROR)" $OUT/g14/tests.log | sed 's/.*:://'; tail -2 $OUT/g14/tests.log
for tool in $tools; do
  echo "== $tool: split products' small case (min_gru) $(date +%T)"
  bash tests/gpu/sanitize.sh $tool $OUT/g14/san -t 45 -k "split_products_small and min_gru" tests/gpu/test_stepkernel.py 2>&1 | tail -2
done
