#!/usr/bin/env bash
# GRL's current name for quick_train_qwen_halfb.sh: the same arguments and the same run.
# `--help` lists the arguments.
source "$(dirname "${BASH_SOURCE[0]}")/quick_train_qwen_halfb.sh" "$@"
