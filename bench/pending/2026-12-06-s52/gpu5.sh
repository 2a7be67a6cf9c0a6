#!/usr/bin/env bash
# GPU call 5 (written in session 51): the transformers real models at T = 32 on this head (see gpu4.sh).
set -u
bash bench/h200/2026-11-28-s35/gpu_s29_rows.sh real32b real sequence gpt2_sdpa,llama_gqa_sdpa,mamba,jamba 570
