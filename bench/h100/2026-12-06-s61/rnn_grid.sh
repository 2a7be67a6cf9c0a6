#!/usr/bin/env bash
# Session 57: issue 17's "LSTM/GRU at least as fast as cuDNN at every size the benchmark covers",
# on the H100, built as `framefuse build` does (--select time: every tactic timed, the fastest kept),
# with the input helpers and together on (session 57's defaults). The last whole grid was session 49's
# on an H200 with the plain kernel (bench/h200/2026-12-05-s49/rnn_sizes/: two ties, LSTM 64/256/1
# 1.00x and 1024/32/2 0.99x). --select time builds every candidate, torch.compile's included (hidden
# 1024 rows took 100-140 s each in session 55), so the grid is split in calls, then merged here:
# Session 59: hidden 1024 split by T (lstm1024a: T 1 and 32, lstm1024b: T 256; gru the same): six rows
# at 100-140 s each (session 55's T = 32 rows with two directions; T = 256 not timed yet) would not fit
# one call. A cut call keeps its finished rows; run what it left with --seq / --dirs in a new call.
# Also session 59: the build's selection now times a candidate slower than 2 ms a call within a
# budget (engines/fusion.calls_within_budget): hidden 1024's plan / unoptimized / inductor candidates
# (~17 ms a step at T = 32, more at T = 256) took ~35 s each of a build before, minutes at T = 256.
# Session 61 ran the whole hidden-1024 grid (LSTM and GRU, 12 rows) in one call in 439 s (rows 11-91 s
# each after session 59's budget for slow candidates), as `python3 bench/rnn_sizes.py --kinds LSTM,GRU
# --hidden 1024` (this script's `h1024` call; bench/h100/2026-12-06-s61/rnn/h1024/); the split
# calls below were not needed.
#   bash bench/h100/2026-12-06-s61/rnn_grid.sh h64     (then h256, lstm1024a, lstm1024b, gru1024a, gru1024b)
#   python bench/rnn_sizes.py --merge bench/h100/<date>-rnn/*/rnn_sizes.jsonl \
#     --out bench/h100/<date>-rnn/merged
# The inductor / triton caches stay in build/cache (carry it with .whl to reuse them in a later call).
set -u
call=${1:?which call: h64 h256 h1024 lstm1024a lstm1024b gru1024a gru1024b}
export TORCHINDUCTOR_CACHE_DIR=$PWD/build/cache/inductor TRITON_CACHE_DIR=$PWD/build/cache/triton FRAMEFUSE_CACHE=$PWD/build/cache/ff
mkdir -p build/cache $OUT/$call
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
case $call in
  h64) sizes="--kinds LSTM,GRU --hidden 64" ;;
  h256) sizes="--kinds LSTM,GRU --hidden 256" ;;
  h1024) sizes="--kinds LSTM,GRU --hidden 1024" ;;  # session 61: the whole hidden-1024 grid fit one call
  lstm1024a) sizes="--kinds LSTM --hidden 1024 --seq 1,32" ;;
  lstm1024b) sizes="--kinds LSTM --hidden 1024 --seq 256" ;;
  gru1024a) sizes="--kinds GRU --hidden 1024 --seq 1,32" ;;
  gru1024b) sizes="--kinds GRU --hidden 1024 --seq 256" ;;
  *) echo "unknown call $call" >&2; exit 2 ;;
esac
# rnn_sizes.jsonl is appended row by row: a call cut by its limit keeps the rows it finished
timeout 570 python3 bench/rnn_sizes.py $sizes --select time --out $OUT/$call --work /tmp/rnn-work \
  2>&1 | grep -E "^\[rnn_sizes" | tee $OUT/$call/rnn_sizes.log
grep -h "^| [LG]" $OUT/$call/rnn_sizes.md 2>/dev/null
