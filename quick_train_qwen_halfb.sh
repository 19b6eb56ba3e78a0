#!/usr/bin/env bash
# Quick start: PPO on 6x6 Sokoban with Qwen2.5-0.5B-Instruct on one GPU, validated on Sokoban,
# Tetris, BlocksWorld and GSM8K.
# `--help` lists the positional arguments and their defaults. Works with `source` too.
(
    GRL_DEFAULTS=(0 8 16 64,32,32,32 1,1,1,1 simpleSokobanAgent simpleSokobanAgent,tetrisAgent_type_1_dim_4,blocksworldAgent_text,gsm8kAgent_single_turn 1 grl quick_train_qwen_halfb Qwen/Qwen2.5-0.5B-Instruct 200)
    GRL_HAS_MEM_FRACTION=0
    GRL_PRESET=a100_1x_0.5b
    # GSM8K needs its dataset (scripts/install_dataset.sh --gsm8k). Without CUDA the run is the CPU preset's
    # recipe as it stands (docs/RESULTS.md: the one that learns to read the board on 2 cores).
    GRL_CPU_OVERRIDES=()
    source "$(dirname "${BASH_SOURCE[0]}")/examples/launch_common.sh"
    grl_launch "$@"
)
