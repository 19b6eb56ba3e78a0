"""The `grl` command: small tools around training.

    grl play <task instance> [--seed N] [--config-dir DIR] [key=value ...]
        play a task in the terminal, seeing exactly the messages the model sees;
        a reply of `help` or `?` lists the valid actions where the env has a list (e.g. TextWorld);
        in a task with tools, a reply holding <python>code</python> runs it in the sandbox and shows its
        output
    grl list [--config-dir DIR]
        the presets, task instances (with their env) and rollout engines a config can name
    grl plot ...
        plot logged curves (grl.tracking.plot)
    grl plan [key=value ...] [--seq-len N] [--config-dir DIR]
        predicted memory per GPU and phase (grl.planner); exits 2 with one line when it does not fit
    grl serve <model or checkpoint folder> [--port N] [--host 127.0.0.1] [--engine auto|hf|vllm] [--dtype
    auto]
              [--tool-parser hermes|llama3_json|mistral|qwen3_coder] [--chat-template FILE]
        an OpenAI-compatible endpoint (/v1/models, /v1/chat/completions, /v1/responses) for the model
        (grl.gateway)

Training itself is `grl-train` / `python -m grl.train`.
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

RULE = "-" * 72
HELP_REPLIES = ("help", "?")


def load_task(task: str, overrides: list[str], config_dir: str | None):
    """A task instance block, composed and validated exactly as training would, and the limits of
    its tool calls."""
    from grl import config
    from grl.tools import SandboxLimits

    # Put the task in the rollout lists so the validator checks its env keys too.
    forced = [f"rollout.training=[{task}]", f"rollout.validation=[{task}]"]
    cfg = config.load_config(forced + list(overrides), config_dir=config_dir)
    return config.task_instance(cfg, task), SandboxLimits(**cfg.tools.python)


def _show(message: dict, out: TextIO) -> None:
    out.write(f"{RULE}\n[{message['role']}]\n{message['content']}\n")


def _show_end(agent, info: dict, out: TextIO) -> None:
    """The final state and why the episode ended."""
    out.write(f"{RULE}\n[final state]\n{agent.observation}\n")
    if info["success"]:
        why = "the task is solved"
    elif info["env_error"]:
        why = f"the environment failed ({info['env_error']})"
    elif info["env_done"]:
        why = "the environment ended the episode"
    else:
        why = f"the turn or action budget ({agent.max_turns} turn(s)) is spent"
    out.write(f"{RULE}\nverdict: {'SUCCESS' if info['success'] else 'FAILED'}: {why}\n")


def _read_reply(inp: TextIO, out: TextIO) -> str | None:
    """One reply: a line, or several when each but the last ends with a backslash."""
    out.write(f"{RULE}\n[assistant] (your reply; a line ending in \\ continues; Ctrl-D quits)\n> ")
    out.flush()
    lines = []
    while True:
        line = inp.readline()
        if not line:
            return "\n".join(lines) if lines else None
        line = line.rstrip("\n")
        if line.endswith("\\"):
            lines.append(line[:-1])
            out.write("> ")
            out.flush()
            continue
        lines.append(line)
        return "\n".join(lines)


def _show_valid_actions(env, out: TextIO) -> None:
    valid = env.valid_actions()
    if valid is None:
        out.write("(this task has no list of valid actions; any answer is accepted)\n")
    else:
        out.write(
            "valid actions (answer with one, e.g. <answer>"
            + (valid[0] if valid else "...")
            + "</answer>):\n  "
            + "\n  ".join(valid)
            + "\n"
        )


def play(
    task: str,
    seed: int,
    overrides: list[str],
    config_dir: str | None,
    inp: TextIO = sys.stdin,
    out: TextIO = sys.stdout,
) -> dict[str, float]:
    """Run one episode of a task with a human (or a pipe) writing the replies."""
    import grl.agents

    agent = grl.agents.make_agent(task, *load_task(task, overrides, config_dir))
    try:
        out.write(
            f"task {task}, seed {seed}: up to {agent.max_turns} turn(s), {agent.max_tokens} tokens per "
            "reply\n"
        )
        for message in agent.reset(seed):
            _show(message, out)
        total, done = 0.0, False
        while not done:
            reply = _read_reply(inp, out)
            if reply is None:
                out.write("\n(no more input; episode stopped)\n")
                break
            if reply.strip().lower() in HELP_REPLIES:
                _show_valid_actions(agent.env, out)
                continue
            result = agent.step(reply)
            total += result.reward
            done = result.done
            info = result.info
            out.write(
                f"\n=> reward {result.reward:g}  done {done}  actions {info['actions']}  "
                f"format_ok {info['format_ok']}  success {info['success']}"
                f"{'  env_error ' + info['env_error'] if info['env_error'] else ''}"
                f"{'  (tool turn: the env was not stepped)' if 'tool_output' in info else ''}\n"
            )
            if done and "tool_output" in info:  # the last turn's tool output has no next message to show it
                _show({"role": "tool", "content": info["tool_output"]}, out)
            if not done:
                _show(agent.messages[-1], out)
            else:
                _show_end(agent, info, out)
        metrics = agent.episode_metrics()
        out.write(
            f"{RULE}\nepisode reward {total:g}; " + ", ".join(f"{k} {v:g}" for k, v in metrics.items()) + "\n"
        )
        return metrics
    finally:
        agent.close()


def usage(command: str) -> str:
    """The usage line of `command` as `grl --help` gives it (this module's docstring), for its parser."""
    return next(line.strip() for line in __doc__.splitlines() if line.strip().startswith(f"grl {command} "))


def _play_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="grl play", usage=usage("play"), description="Play a task instance in the terminal."
    )
    parser.add_argument(
        "words",
        nargs="*",
        metavar="task [key=value ...]",
        help="a task instance of configs/agents.yaml (`grl list`), e.g. simpleSokobanAgent, then Hydra "
        "overrides, "
        "e.g. simpleSokobanAgent.env_config.num_boxes=2",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--config-dir", default=None, help="folder holding base.yaml (default: the repo's configs/)"
    )
    args = parser.parse_intermixed_args(argv)  # flags between overrides, as in `grl plan`
    if not args.words or "=" in args.words[0]:
        parser.error("name a task instance first, e.g. `grl play simpleSokobanAgent` (`grl list` shows them)")
    task, overrides = args.words[0], args.words[1:]
    from grl.config import ConfigError

    try:
        play(task, args.seed, overrides, args.config_dir)
    except (ConfigError, ValueError, KeyError, OSError, RuntimeError) as err:
        print(f"grl play: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


def _list_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="grl list", usage=usage("list"), description="What a config can name."
    )
    parser.add_argument(
        "--config-dir", default=None, help="folder holding base.yaml (default: the repo's configs/)"
    )
    args = parser.parse_args(argv)
    from grl.catalog import catalog
    from grl.config import ConfigError, load_config, task_blocks

    try:
        print(catalog(args.config_dir, task_blocks(load_config(config_dir=args.config_dir))))
    except ConfigError as err:
        print(f"grl list: {err}", file=sys.stderr)
        return 2
    return 0


def _plot_main(argv: list[str]) -> int:
    from grl.tracking.plot import main as plot_main

    return plot_main(argv) or 0


def _plan_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="grl plan", usage=usage("plan"), description="Predict memory per GPU for each phase of a step."
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. preset=a100_8x_7b")
    parser.add_argument(
        "--seq-len",
        type=int,
        default=None,
        help="tokens per episode (default: rollout.max_episode_length, the longest kept)",
    )
    parser.add_argument(
        "--config-dir", default=None, help="folder holding base.yaml (default: the repo's configs/)"
    )
    args = parser.parse_args(argv)
    from grl.config import ConfigError, load_config, run_sections
    from grl.planner import PlanError, format_plan, plan_run

    try:
        memory = plan_run(
            run_sections(load_config(args.overrides, config_dir=args.config_dir)), seq_len=args.seq_len
        )
    except (ConfigError, PlanError) as err:
        print(f"grl plan: {err}", file=sys.stderr)
        return 2
    print(format_plan(memory))
    problem = memory.overflow()
    if problem:
        print(f"grl plan: {problem}", file=sys.stderr)
        return 2
    return 0


def _serve_main(argv: list[str]) -> int:
    from grl.gateway.serving import serve_main

    return serve_main(argv)


COMMANDS = {
    "play": _play_main,
    "list": _list_main,
    "plot": _plot_main,
    "plan": _plan_main,
    "serve": _serve_main,
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    if argv[0] not in COMMANDS:
        print(f"grl: unknown command {argv[0]!r}; commands: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
