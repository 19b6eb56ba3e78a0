#!/usr/bin/env bash
# GRL's current name for quick_train_qwen_halfb.sh: the same arguments and the same run.
# Usage: bash verl_quick_training_example.sh [arguments of quick_train_qwen_halfb.sh]
source "$(dirname "${BASH_SOURCE[0]}")/quick_train_qwen_halfb.sh" "$@"
