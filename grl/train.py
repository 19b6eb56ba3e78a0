"""`python -m grl.train` / `grl-train`: compose the Hydra config, check it, train.

    grl-train preset=cpu
    grl-train model_path=Qwen/Qwen2.5-0.5B-Instruct rollout.agent_group_num=[8] trainer.logger=[console,wandb]
    grl-train --cfg preset=cpu          # print the resolved config and exit (Hydra's --cfg job)
    grl-train --list                    # the presets, task instances and engines (as `grl list`)
    grl-train --help                    # every key with its type, default and meaning (docs/CONFIG.md)

The config is checked completely before Ray or any model starts; a mistake
ends the program with one line naming the key and exit status 2.
"""

from __future__ import annotations

import argparse
import signal
import sys

from grl.algo.estimators import ESTIMATORS

USAGE_EPILOG = f"""\
overrides are Hydra's KEY=VALUE (every key is listed below and in docs/CONFIG.md; task instances are in
configs/agents.yaml, presets in configs/preset/; `grl list` shows them):
  preset=cpu                               a hardware preset from configs/preset/
  model_path=embedded                      hub id, local folder, `embedded` or `tiny`
  rollout.training=[simpleSokobanAgent]    training task instances (configs/agents.yaml)
  rollout.agent_group_num=[8] rollout.agent_group_size=[16]
  rollout.validation=[simpleSokobanAgent,gsm8kAgent_single_turn]
  algorithm.adv_estimator=gae              {" | ".join(ESTIMATORS)}
  trainer.logger=[console,jsonl,wandb]     W&B is online with WANDB_API_KEY, offline otherwise
  trainer.resume_mode=auto                 auto | disable | a checkpoints/.../global_step_N folder
"""


CFG_PARTS = ("job", "hydra", "all")  # what Hydra's --cfg prints


def _with_cfg_part(argv: list[str]) -> list[str]:
    """Hydra's `--cfg` takes an optional part (job, hydra, all); a bare `--cfg` is `--cfg job`, so that
    `--cfg preset=cpu` keeps preset=cpu an override."""
    bare = [
        i
        for i, arg in enumerate(argv)
        if arg in ("--cfg", "-c") and (i + 1 == len(argv) or argv[i + 1] not in CFG_PARTS)
    ]
    return [f"{arg}=job" if i in bare else arg for i, arg in enumerate(argv)]


def parse_args(argv: list[str]) -> argparse.Namespace:
    from grl.schema.doc import help_text

    parser = argparse.ArgumentParser(
        prog="grl-train",
        description="Train a language-model agent with multi-turn PPO.",
        epilog=f"{USAGE_EPILOG}\n{help_text()}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config-name", default="base", help="config file in the config dir (default: base)")
    parser.add_argument(
        "--config-dir", default=None, help="config folder (default: the repository's configs/)"
    )
    parser.add_argument(
        "--cfg",
        "-c",
        choices=CFG_PARTS,
        help="print the resolved, checked config and exit (alone: job, as in Hydra)",
    )
    parser.add_argument(
        "--list",
        action="store_true",
        help="list the presets, task instances (overrides applied) and engines, and exit",
    )
    parser.add_argument(
        "--multirun",
        "-m",
        action="store_true",
        help="Hydra's sweeps: refused, GRL runs one config per command",
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides KEY=VALUE")
    return parser.parse_intermixed_args(_with_cfg_part(argv))


def refused_flag(args: argparse.Namespace) -> str | None:
    """The one line for a Hydra flag GRL does not offer, naming what it offers instead."""
    if args.multirun:
        return (
            "-m/--multirun: GRL runs one config per command (each run starts its own Ray workers); run each "
            "value of a sweep as its own command, e.g. for lr in 1e-6 3e-6; do grl-train "
            "actor_rollout_ref.actor.optim.lr=$lr experiment_name=lr_$lr; done"
        )
    if args.cfg in ("hydra", "all"):
        return (
            f"--cfg {args.cfg}: GRL runs no Hydra job, so there is no Hydra config (hydra.*) to show; "
            "--cfg job (or --cfg) prints the run's whole config, resolved and checked"
        )
    return None


def _stop(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the driver at once
    raise KeyboardInterrupt


def check_device(cfg, overrides: list[str], gpus: int) -> None:
    """A GPU run where there is no GPU stops here, pointing at the CPU preset: `trainer.device: cuda` (set,
    or by a GPU preset) where this machine (or the Ray cluster the run joins) has none, and bare
    `grl-train`, whose default config is sized for a GPU, where `auto` found none (it would take days)."""
    from grl.machine import ray_address
    from grl.preflight import PreflightError

    given = {name.lstrip("+~"): value for name, _, value in (o.partition("=") for o in overrides)}
    remote = ray_address(cfg.trainer.ray_address)
    if gpus or cfg.trainer.device == "cpu":
        return
    if cfg.trainer.device == "cuda":
        source = (
            f" (set by preset={given['preset']})"
            if "preset" in given and "trainer.device" not in given
            else ""
        )
        where = f"the Ray cluster at {remote}" if remote and remote != "local" else "this machine"
        raise PreflightError(
            f"trainer.device: cuda{source}, but {where} has no CUDA device; run `grl-train preset=cpu` (a "
            "small "
            "CPU run), or set trainer.device=cpu to run this config on the CPU"
        )
    if "preset" in given or "trainer.device" in given or remote:
        return
    raise PreflightError(
        "trainer.device: auto, but this machine has no CUDA device and the default config "
        "is sized for a GPU; run `grl-train preset=cpu` (a small CPU run), or set "
        "trainer.device=cpu to run this config anyway"
    )


def build(cfg, overrides: list[str] = ()):
    """The run (grl.run_plan.Run), built once: its typed sections and its plan, with `auto` device and
    engine resolved once (grl/machine.py) on the machine the ranks run on: the Ray cluster the run joins
    (whose address preflight checks first), else this one. A GPU run where there is no GPU stops first
    (`check_device`), before the engine probe (a child that imports vLLM)."""
    import os

    from grl.machine import machine_facts, ray_address
    from grl.preflight import check_ray_address
    from grl.run_plan import build_run

    trainer, engine = cfg.trainer, cfg.actor_rollout_ref.rollout
    address = ray_address(trainer.ray_address)
    cluster = None
    if address and address != "local" and trainer.device != "cpu":
        from grl.workers.runtime import cluster_gpus

        check_ray_address(cfg, os.environ)
        cluster = cluster_gpus(address)
    # The GPUs alone first: a named engine ("hf") asks no vLLM probe, which takes seconds.
    check_device(
        cfg, list(overrides), machine_facts(trainer.device, "hf", trainer.gpu_memory_gb, cluster).gpus
    )
    return build_run(cfg, machine_facts(trainer.device, engine.name, trainer.gpu_memory_gb, cluster))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    refused = refused_flag(args)
    if refused:
        print(f"grl-train: {refused}", file=sys.stderr)
        return 2

    from omegaconf import OmegaConf

    from grl import preflight
    from grl.config import ConfigError, load_config

    try:
        cfg = load_config(args.overrides, args.config_name, args.config_dir)
    except ConfigError as err:
        print(f"grl-train: config error: {err}", file=sys.stderr)
        return 2
    if args.cfg:
        print(OmegaConf.to_yaml(cfg))
        return 0
    if args.list:
        from grl.catalog import catalog
        from grl.config import task_blocks

        print(catalog(args.config_dir, task_blocks(cfg)))
        return 0
    try:
        built = build(cfg, args.overrides)
        notes = preflight.check(cfg, run=built)
    except ConfigError as err:
        print(f"grl-train: {err}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"grl-train: note: {note}", file=sys.stderr)

    from grl.trainer import RunAborted, run

    signal.signal(
        signal.SIGTERM, _stop
    )  # `timeout`, a scheduler: unwind like Ctrl-C so workers are shut down
    try:
        run(built)
    except KeyboardInterrupt:
        print("grl-train: stopped; every worker was shut down", file=sys.stderr)
        return 130
    except RunAborted as err:  # a worker died: the message names it and the checkpoint to resume from
        print(f"grl-train: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
