# Shared by every launch script: turns the positional arguments into one `grl.train` command.
# Not meant to be run directly; the scripts call `grl_launch` inside a subshell, so nothing defined
# here (and no option or directory change) reaches the shell that sourced them.
#
# Positional arguments (empty string = the script's default):
#   1 CUDA_VISIBLE_DEVICES   2 agent group number   3 agent group size
#   4 validation group numbers (comma list)   5 validation group sizes (comma list)
#   6 training tasks (comma list)   7 validation tasks (comma list)   8 GPUs per node
#   9 project name   10 experiment name   11 model path
#   12 vLLM memory fraction (scripts with GRL_HAS_MEM_FRACTION=1), then total training steps
#   anything after: extra Hydra overrides, passed through
#
# The calling script sets GRL_DEFAULTS (an array of the defaults, same order), GRL_HAS_MEM_FRACTION,
# GRL_PRESET (the GPU preset) and GRL_CPU_OVERRIDES (what the CPU fallback adds, may be empty).
# DRY_RUN=1 prints the command instead of running it.

_grl_list() {  # "a,b" -> "[a,b]"
    local value="$1"
    case "$value" in
        \[*) printf '%s' "$value" ;;
        *) printf '[%s]' "$value" ;;
    esac
}

_grl_first() {  # "a,b" or "[a,b]" -> "a"
    local value="${1#[}"
    printf '%s' "${value%%[],]*}"
}

_grl_repeat() {  # value, "t1,t2,t3" -> "[value,value,value]": one entry per task
    local value="$1" tasks="${2#[}" out="" task
    tasks="${tasks%]}"
    local IFS=,
    for task in $tasks; do out="${out:+$out,}$value"; done
    printf '[%s]' "$out"
}

_grl_has_cuda() {
    command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1
}

grl_launch() {
    set -u
    # `source script.sh` with no arguments hands the script the caller's positional parameters. Bash then
    # records the source call as the innermost argument frame (the script's path alone), which a source
    # with arguments and a plain `bash script.sh` do not: in that case the caller's parameters are not ours.
    if [ "${BASH_SOURCE[1]:-}" != "$0" ] && [ "${BASH_ARGC[0]:-0}" = 1 ] \
        && [ "${BASH_ARGV[0]:-}" = "${BASH_SOURCE[1]:-}" ]; then
        set --
    fi
    local root
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    local names=(cuda_devices group_num group_size val_group_num val_group_size train_tasks val_tasks
                 n_gpus project experiment model_path)
    [ "${GRL_HAS_MEM_FRACTION:-0}" = 1 ] && names+=(mem_fraction)
    names+=(total_steps)

    local -A arg=() given=()
    local i
    for i in "${!names[@]}"; do
        local value="${GRL_DEFAULTS[$i]}"
        if [ $# -gt 0 ]; then
            [ -n "$1" ] && { value="$1"; given[${names[$i]}]=1; }
            shift
        fi
        arg[${names[$i]}]="$value"
    done
    local extra=("$@")
    # Only validation tasks given: the default group lists have one entry per default task; repeat their
    # first entry once per given task so that the lists match.
    if [ -n "${given[val_tasks]:-}" ]; then
        [ -z "${given[val_group_num]:-}" ] && arg[val_group_num]="$(_grl_repeat "$(_grl_first "${arg[val_group_num]}")" "${arg[val_tasks]}")"
        [ -z "${given[val_group_size]:-}" ] && arg[val_group_size]="$(_grl_repeat "$(_grl_first "${arg[val_group_size]}")" "${arg[val_tasks]}")"
    fi

    local python="python"
    [ -x "$root/.venv/bin/python" ] && python="$root/.venv/bin/python"
    local cmd=("$python" -m grl.train)

    local mode=cpu
    if _grl_has_cuda || [ "${GRL_FORCE_GPU:-0}" = 1 ]; then
        mode=gpu
        export CUDA_VISIBLE_DEVICES="${arg[cuda_devices]}"
        cmd+=(
            "model_path=${arg[model_path]}"
            "rollout.agent_group_num=$(_grl_list "${arg[group_num]}")"
            "rollout.agent_group_size=$(_grl_list "${arg[group_size]}")"
            "rollout.validation_agent_group_num=$(_grl_list "${arg[val_group_num]}")"
            "rollout.validation_agent_group_size=$(_grl_list "${arg[val_group_size]}")"
            "rollout.training=$(_grl_list "${arg[train_tasks]}")"
            "rollout.validation=$(_grl_list "${arg[val_tasks]}")"
            "n_gpus_per_node=${arg[n_gpus]}"
            "project_name=${arg[project]}"
            "experiment_name=${arg[experiment]}"
            "total_training_steps=${arg[total_steps]}"
        )
        [ -n "${arg[mem_fraction]:-}" ] && cmd+=("gpu_memory_utilization=${arg[mem_fraction]}")
        [ -n "${GRL_PRESET:-}" ] && cmd+=("preset=$GRL_PRESET")
        _grl_has_cuda || echo "grl: GRL_FORCE_GPU=1: building the GPU command without a visible GPU"
        echo "grl: GPUs ${arg[cuda_devices]} (${arg[n_gpus]} per node), model ${arg[model_path]}"
    else
        # Without CUDA the GPU-sized defaults would not fit: run the CPU preset on the embedded model and
        # keep only what the caller asked for explicitly.
        echo "grl: no CUDA on this machine: running the CPU preset on the embedded model (SmolLM2-135M-Instruct)"
        cmd+=(preset=cpu model_path=embedded "project_name=${arg[project]}" "experiment_name=${arg[experiment]}_cpu"
              "${GRL_CPU_OVERRIDES[@]}")
        [ -n "${given[group_num]:-}" ] && cmd+=("rollout.agent_group_num=$(_grl_list "${arg[group_num]}")")
        [ -n "${given[group_size]:-}" ] && cmd+=("rollout.agent_group_size=$(_grl_list "${arg[group_size]}")")
        [ -n "${given[train_tasks]:-}" ] && cmd+=("rollout.training=$(_grl_list "${arg[train_tasks]}")")
        [ -n "${given[val_tasks]:-}" ] && cmd+=("rollout.validation=$(_grl_list "${arg[val_tasks]}")")
        [ -n "${given[val_group_num]:-}" ] && cmd+=("rollout.validation_agent_group_num=$(_grl_list "${arg[val_group_num]}")")
        [ -n "${given[val_group_size]:-}" ] && cmd+=("rollout.validation_agent_group_size=$(_grl_list "${arg[val_group_size]}")")
        [ -n "${given[total_steps]:-}" ] && cmd+=("total_training_steps=${arg[total_steps]}")
        # Only validation tasks given: one validation group entry per task, the size the CPU preset uses.
        if [ -n "${given[val_tasks]:-}" ] && [ -z "${given[val_group_num]:-}" ]; then
            local preset_num
            preset_num="$(sed -n 's/^ *validation_agent_group_num: *\[\([0-9]*\).*/\1/p' "$root/configs/preset/cpu.yaml")"
            cmd+=("rollout.validation_agent_group_num=$(_grl_repeat "$preset_num" "${arg[val_tasks]}")")
        fi
        if [ -n "${given[val_tasks]:-}" ] && [ -z "${given[val_group_size]:-}" ]; then
            cmd+=("rollout.validation_agent_group_size=$(_grl_repeat 1 "${arg[val_tasks]}")")
        fi
        local ignored=() key
        for key in cuda_devices n_gpus model_path mem_fraction; do
            [ -n "${given[$key]:-}" ] && ignored+=("$key=${arg[$key]}")
        done
        [ ${#ignored[@]} -gt 0 ] && echo "grl: the CPU fallback does not use these arguments you gave: ${ignored[*]}"
    fi
    cmd+=("${extra[@]}")

    local key
    echo "grl: settings:"
    for key in "${names[@]}"; do
        local note=""
        if [ -z "${given[$key]:-}" ]; then
            note="  (default)"
            case "$key" in project|experiment) ;; *) [ "$mode" = cpu ] && note="  (default; not used: the CPU preset decides)" ;; esac
        elif [ "$mode" = cpu ]; then
            case "$key" in cuda_devices|n_gpus|model_path|mem_fraction) note="  (given; NOT used by the CPU fallback)" ;; esac
        fi
        printf '  %-15s %s%s\n' "$key" "${arg[$key]}" "$note"
    done
    [ ${#extra[@]} -gt 0 ] && echo "  overrides       ${extra[*]}"

    if [ "${DRY_RUN:-0}" = 1 ]; then
        printf 'grl: dry run, would run (in %s):\n' "$root"
        printf '%q ' "${cmd[@]}"
        printf '\n'
        return 0
    fi
    local log_dir="$root/logs"
    mkdir -p "$log_dir"
    local log="$log_dir/${arg[experiment]}.log"
    echo "grl: logging to $log"
    cd "$root" && "${cmd[@]}" 2>&1 | tee "$log"
    return "${PIPESTATUS[0]}"
}
