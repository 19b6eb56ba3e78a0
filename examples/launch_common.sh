# Shared by every launch script: turns the positional arguments into one `grl.train` command.
# Not meant to be run directly; the scripts call `grl_launch` inside a subshell, so nothing defined
# here (and no option or directory change) reaches the shell that sourced them.
#
# The positional arguments, their meaning and the checks on them are the table below; `--help` prints it
# with the calling script's defaults. Empty string = the script's default; anything after the last
# positional argument is passed through as Hydra overrides.
#
# The calling script sets GRL_DEFAULTS (an array of the defaults, same order), GRL_HAS_MEM_FRACTION,
# GRL_PRESET (the GPU preset) and GRL_CPU_OVERRIDES (what the CPU fallback adds, may be empty); its
# header comment (the lines after `#!`) is the description `--help` shows.
# DRY_RUN=1 prints the command instead of running it.

# name -> what `--help` says of it; the order of GRL_DEFAULTS is the order of _GRL_ARGS.
_GRL_ARGS=(cuda_devices group_num group_size val_group_num val_group_size train_tasks val_tasks
           n_gpus project experiment model_path mem_fraction total_steps)
declare -A _GRL_ABOUT=(
    [cuda_devices]="GPUs to use (CUDA_VISIBLE_DEVICES), comma list of indices"
    [group_num]="agent groups per training task (comma list: one per task)"
    [group_size]="agents per group (comma list: one per task)"
    [val_group_num]="validation groups per validation task (comma list)"
    [val_group_size]="agents per validation group (comma list)"
    [train_tasks]="training task instances (configs/agents.yaml), comma list"
    [val_tasks]="validation task instances (configs/agents.yaml), comma list"
    [n_gpus]="GPUs per node (n_gpus_per_node)"
    [project]="project name (W&B project)"
    [experiment]="experiment name (also logs/<name>.log)"
    [model_path]="model: hub id (owner/name), local folder, embedded or tiny"
    [mem_fraction]="vLLM GPU memory fraction, in (0, 1]"
    [total_steps]="training steps"
)

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

_grl_help() {  # script path, root, argument names...: usage, description, each argument with its default, an example
    local script="$1" root="$2" i=0 name
    shift 2
    printf 'Usage: bash %s [ARGUMENT ...] [KEY=VALUE ...]\n' "$script"
    sed -n '2,/^[^#]/{/^# \{0,1\}/s///p}' "$script" | sed '/^(/d; /^`--help`/d'
    printf '\nPositional arguments, in this order ("" keeps the default):\n'
    for name in "$@"; do
        printf '  %2d %-15s %s\n     %-15s default: %s\n' "$((i + 1))" "$name" "${_GRL_ABOUT[$name]}" "" "${GRL_DEFAULTS[$i]}"
        i=$((i + 1))
    done
    printf '\nAfter argument %d: Hydra overrides KEY=VALUE, passed to grl-train (grl-train --help lists the keys).\n' "$#"
    printf 'Without CUDA the script runs the CPU preset on the embedded model and says which arguments it ignores.\n'
    printf 'DRY_RUN=1 prints the command instead of running it.\n\n'
    printf 'Example: 4 groups of 8 agents, trained and validated on %s, as experiment my_run:\n' "${GRL_DEFAULTS[5]}"
    printf '  bash %s %s 4 8 "" "" %s %s %s grl my_run\n' \
        "$script" "${GRL_DEFAULTS[0]}" "${GRL_DEFAULTS[5]}" "${GRL_DEFAULTS[5]}" "${GRL_DEFAULTS[7]}"
}

_grl_bad() {  # position, name, message: one line on stderr, status 2
    echo "grl: argument $1 ($2): $3 (--help lists the arguments)" >&2
    return 2
}

_grl_check() {  # position, name, value, root: a mistake in the value -> one line, status 2
    local pos="$1" name="$2" value="$3" root="$4" list="${3#[}"
    list="${list%]}"
    local count='^[1-9][0-9]*$' counts='^[1-9][0-9]*(,[1-9][0-9]*)*$' names='^[A-Za-z_][A-Za-z0-9_]*(,[A-Za-z_][A-Za-z0-9_]*)*$'
    case "$name" in
        cuda_devices)
            [[ "$list" =~ ^[0-9]+(,[0-9]+)*$ ]] || _grl_bad "$pos" "$name" "'$value' is not a comma list of GPU indices, like 0,1" ;;
        group_num|group_size|val_group_num|val_group_size)
            [[ "$list" =~ $counts ]] || _grl_bad "$pos" "$name" "'$value' is not a comma list of positive whole numbers, like 8 or 8,4" ;;
        n_gpus|total_steps)
            [[ "$value" =~ $count ]] || _grl_bad "$pos" "$name" "'$value' is not a positive whole number" ;;
        mem_fraction)
            [[ "$value" =~ ^[0-9]*\.?[0-9]+$ ]] && awk -v v="$value" 'BEGIN { exit !(v > 0 && v <= 1) }' \
                || _grl_bad "$pos" "$name" "'$value' is not a fraction in (0, 1], like 0.5" ;;
        project|experiment)
            [[ "$value" =~ ^[A-Za-z0-9._-]+$ ]] || _grl_bad "$pos" "$name" "'$value' is not a name of letters, digits and ._-" ;;
        train_tasks|val_tasks)
            [[ "$list" =~ $names ]] || { _grl_bad "$pos" "$name" "'$value' is not a comma list of task names"; return; }
            local task
            for task in ${list//,/ }; do
                grep -q "^$task:" "$root/configs/agents.yaml" \
                    || { _grl_bad "$pos" "$name" "'$task' is not a task instance of configs/agents.yaml"; return; }
            done ;;
        model_path)
            case "$value" in
                embedded|tiny) ;;
                /*|./*|../*|~*) ;;  # a local folder: checked when the GPU command uses it
                *) [[ "$value" =~ ^[A-Za-z0-9._-]*[A-Za-z][A-Za-z0-9._-]*(/[A-Za-z0-9._-]+)?$ ]] \
                       || _grl_bad "$pos" "$name" "'$value' is neither a hub id (owner/name), a local folder, embedded nor tiny" ;;
            esac ;;
    esac
}

_grl_check_gpu_command() {  # what only the GPU command uses, against each other (grl_launch's arg, given, names)
    local devices="${arg[cuda_devices]//[^,]/}"
    devices=$((${#devices} + 1))
    if [ "${arg[n_gpus]}" -gt "$devices" ]; then
        _grl_bad 8 n_gpus "${arg[n_gpus]} GPUs per node, but argument 1 (cuda_devices) '${arg[cuda_devices]}' names $devices"
        return
    fi
    case "${arg[model_path]}" in
        /*|./*|../*|~*) [ -d "${arg[model_path]/#\~/$HOME}" ] \
            || _grl_bad 11 model_path "'${arg[model_path]}' is not a folder on this machine" ;;
    esac
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
    local root script="${BASH_SOURCE[1]}"
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    local names=() name
    for name in "${_GRL_ARGS[@]}"; do
        [ "$name" = mem_fraction ] && [ "${GRL_HAS_MEM_FRACTION:-0}" != 1 ] && continue
        names+=("$name")
    done

    local word
    for word in "${@:1:${#names[@]}}"; do
        case "$word" in -h|--help) _grl_help "$script" "$root" "${names[@]}"; return 0 ;; esac
    done

    local -A arg=() given=()
    local i
    for i in "${!names[@]}"; do
        local value="${GRL_DEFAULTS[$i]}"
        if [ $# -gt 0 ]; then
            if [ -n "$1" ]; then
                _grl_check "$((i + 1))" "${names[$i]}" "$1" "$root" || return 2
                value="$1"
                given[${names[$i]}]=1
            fi
            shift
        fi
        arg[${names[$i]}]="$value"
    done
    for i in $(seq 1 $#); do
        case "${!i}" in
            *=*|~*|-*) ;;
            *) _grl_bad "$((${#names[@]} + i))" override "'${!i}' is not KEY=VALUE; this script takes ${#names[@]} positional arguments" \
                   || return 2 ;;
        esac
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
        _grl_check_gpu_command || return 2
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
