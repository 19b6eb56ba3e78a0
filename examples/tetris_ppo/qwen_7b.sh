#!/usr/bin/env bash
# Tetris (type 1, 4x4) PPO with Qwen2.5-7B-Instruct on eight GPUs.
# `--help` lists the positional arguments and their defaults. Works with `source` too.
(
    # GRL's 13-task validation (256 episodes each), as GRL's own scripts run it.
    GRL_DEFAULTS=(0,1,2,3,4,5,6,7 8 16 256,256,256,256,256,256,256,256,256,256,256,256,256 1,1,1,1,1,1,1,1,1,1,1,1,1 tetrisAgent_type_1_dim_4 simpleSokobanAgent,largeSokobanAgent,gsm8kAgent_single_turn,gsm8kAgent_5_turn,blocksworldAgent_text,blocksworldAgent_1d,blocksworldAgent_2d_sparse,tetrisAgent_type_1_dim_4,tetrisAgent_type_2_dim_3,tetrisAgent_type_2_dim_4,webshopAgent,birdAgent,birdAgent_5_turns 8 grl tetris_qwen_7b Qwen/Qwen2.5-7B-Instruct 0.5 200)
    GRL_HAS_MEM_FRACTION=1
    GRL_PRESET=a100_8x_7b
    # The CPU preset trains on Sokoban; this script's task replaces it there too.
    GRL_CPU_OVERRIDES=(rollout.training=[tetrisAgent_type_1_dim_4] rollout.validation=[tetrisAgent_type_1_dim_4])
    source "$(dirname "${BASH_SOURCE[0]}")/../launch_common.sh"
    grl_launch "$@"
)
