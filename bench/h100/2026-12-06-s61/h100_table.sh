#!/usr/bin/env bash
# Session 54: issue 17's benchmark, complete, on the H100 (the issue's device; H200s were not
# lent in sessions 51-53, and bench/e2e.py --merge refuses rows of different GPUs, so the H200 table
# of bench/h200/2026-12-05-s49/merged/ cannot take H100 rows). One call of the device tool per
# argument, each ~500-570 s, every peer in the same run per row, full settings, the build's own
# selection; about eleven calls over three sessions (row times from sessions 47-54: zoo T = 1
# 25-90 s a row, real T = 1 20-100 s, T = 32 ~150-170 s). Session 54's three real T = 32 rows
# (bench/h100/2026-12-05-s54/call3/real32a/) are on today's head and count: r32c leaves them out.
# Session 55 ran z1a, z1b and z32a (bench/h100/2026-12-05-s55/: 299, 384 and 271 s); r1 is split in
# two (ten real models at T = 1 would not fit one call at those rates).
# Session 57 ran r1a, r1b and r32a (bench/h100/2026-12-06-s57/: 255, 144 and 489 s; merged so far in
# bench/h100/2026-12-06-table/, whose README has the merge command to extend).
# Session 59 ran z32b, z32c and z32d (bench/h100/2026-12-06-s59/: 309, 445 and 560 s); z32d was cut by
# its limit during xlstm's row (delta_net's torch.compile max-autotune alone took 123 s, xlstm's
# framefuse build 125 s), so xlstm has its own call, z32e; and real T = 32 is rebalanced: jamba alone
# (r32b; session 57's r32a rows took 92-193 s each, jamba is the largest real model), the three
# torch.nn bidirectional RNNs together (r32c; 53-76 s each on the H200 in session 49).
# Session 60 ran r32b and r32c (bench/h100/2026-12-06-s60/: 264 and 202 s); z32e was cut again
# (framefuse's build 186 s, then torch.compile max-autotune ran past the rest of the 560 s). xlstm's
# T = 32 row needs its peers' compile caches filled first (bench/e2e.py's --prebuild, as its docstring
# says: max-autotune 331 s and reduce-overhead 81 s from cold in session 33's measurement): run
# `z32e-pre`, then `z32e` in the next call on the same held machine (build/cache stays between
# calls while it is held; a fresh machine starts with empty caches, so both again).
# Session 61 ran z32e-pre (534 s: max-autotune 417.5 s, reduce-overhead 76.6 s into build/cache), then
# z32e on the same held machine (328 s): the table is complete (bench/h100/2026-12-06-table/merged/).
#   bash bench/h100/2026-12-06-s61/h100_table.sh r1a     (then r1b, z32b .. z32d, r32a, r32b, r32c)
# Then, here: python3 bench/e2e.py --merge <each call's e2e.json> --out bench/h100/<date>-table/merged
set -u
call=${1:?which call: z1a z1b r1a r1b z32a z32b z32c z32d z32e-pre z32e r32a r32b r32c}
rows=bench/h200/2026-11-28-s35/gpu_s29_rows.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
case $call in
  z1a) bash $rows $call zoo step min_gru,min_lstm,lstm,gru,attention,gated_ssm 560 ;;
  z1b) bash $rows $call zoo step mamba,xlstm,delta_net,liquid,jamba 560 ;;
  r1a) bash $rows $call real step gpt2_sdpa,llama_gqa_sdpa,mamba,jamba,torch_lstm_bidir 560 ;;
  r1b) bash $rows $call real step torch_gru_bidir,torch_rnn_bidir,torch_rnncell_loop,torch_mlpcell_loop,torch_lnlstm_loop 560 ;;
  z32a) bash $rows $call zoo sequence min_gru,min_lstm,gated_ssm 560 ;;
  z32b) bash $rows $call zoo sequence lstm,gru,liquid 560 ;;
  z32c) bash $rows $call zoo sequence attention,mamba,jamba 560 ;;
  z32d) bash $rows $call zoo sequence delta_net,xlstm 560 ;;
  z32e-pre)  # fills the inductor / triton caches under build/cache for z32e, times nothing (not mergeable)
    export TORCHINDUCTOR_CACHE_DIR=$PWD/build/cache/inductor TRITON_CACHE_DIR=$PWD/build/cache/triton FRAMEFUSE_CACHE=$PWD/build/cache/ff
    mkdir -p build/cache $OUT/$call
    timeout 570 python3 bench/e2e.py --section zoo --forms sequence --archs xlstm \
      --prebuild torch_compile_autotune_graph,torch_compile --out $OUT/$call > $OUT/$call/$call.log 2>&1
    echo "rc=$? $(date +%T)"; grep -E "prebuild|built" $OUT/$call/$call.log | tail -8; du -sh build/cache/* ;;
  z32e) bash $rows $call zoo sequence xlstm 560 ;;
  r32a) bash $rows $call real sequence gpt2_sdpa,llama_gqa_sdpa,mamba 560 ;;
  r32b) bash $rows $call real sequence jamba 560 ;;
  r32c) bash $rows $call real sequence torch_lstm_bidir,torch_gru_bidir,torch_rnn_bidir 560 ;;
  *) echo "unknown call $call" >&2; exit 2 ;;
esac
