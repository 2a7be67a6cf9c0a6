#!/usr/bin/env bash
# GPU call 4 (written in session 51): issue 17's real-model rows at T = 32 that the published
# table (bench/h200/2026-12-05-s49/merged/) still takes from sessions 36-39, re-run on this head,
# every peer in the same run, full settings. Session 54 ran the first three of its four rows on an
# H100 (bench/h100/2026-12-05-s54/call3/); this is the fourth (~150 s; the build's selection is
# most of it). Merge its e2e.json with rows of the same GPU only (bench/e2e.py --merge refuses
# results from different GPUs).
set -u
bash bench/h200/2026-11-28-s35/gpu_s29_rows.sh real32a real sequence torch_rnn_bidir 300
