#!/usr/bin/env bash
# GPU call 4 (written in session 51): issue 17's real-model rows at T = 32 that the published
# table (bench/h200/2026-12-05-s49/merged/) still takes from sessions 36-39, re-run on this head,
# every peer in the same run, full settings. Four rows a call (~100-140 s each: the build's
# selection is most of it).
set -u
bash bench/h200/2026-11-28-s35/gpu_s29_rows.sh real32a real sequence torch_rnncell_loop,torch_mlpcell_loop,torch_lnlstm_loop,torch_rnn_bidir 570
