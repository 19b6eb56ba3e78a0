"""`python -m grl.train` / `grl-train`: compose the Hydra config, check it, train.

    grl-train preset=cpu
    grl-train model_path=Qwen/Qwen2.5-0.5B-Instruct rollout.agent_group_num=[8] trainer.logger=[console,wandb]
    grl-train --cfg preset=cpu          # print the resolved config and exit
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
configs/agents.yaml, presets in configs/preset/):
  preset=cpu                               a hardware preset from configs/preset/
  model_path=embedded                      hub id, local folder, `embedded` or `tiny`
  rollout.training=[simpleSokobanAgent]    training task instances (configs/agents.yaml)
  rollout.agent_group_num=[8] rollout.agent_group_size=[16]
  rollout.validation=[simpleSokobanAgent,gsm8kAgent_single_turn]
  algorithm.adv_estimator=gae              {" | ".join(ESTIMATORS)}
  trainer.logger=[console,jsonl,wandb]     W&B is online with WANDB_API_KEY, offline otherwise
  trainer.resume_mode=auto                 auto | disable | a checkpoints/.../global_step_N folder
"""


def parse_args(argv: list[str]) -> argparse.Namespace:
    from grl.schema.doc import help_text

    parser = argparse.ArgumentParser(
        prog="grl-train",
        description="Train a language-model agent with multi-turn PPO.",
        epilog=f"{USAGE_EPILOG}\n{help_text()}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config-name", default="base", help="config file in the config dir (default: base)")
    parser.add_argument("--config-dir", default=None, help="config folder (default: the repository's configs/)")
    parser.add_argument("--cfg", action="store_true", help="print the resolved, checked config and exit")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides KEY=VALUE")
    return parser.parse_args(argv)


def _stop(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the driver at once
    raise KeyboardInterrupt


def check_gpu_sized(cfg, overrides: list[str], plan) -> None:
    """Bare `grl-train` is sized for a GPU; where `auto` found none, point at the CPU preset
    instead of starting a run that would take days."""
    import os

    from grl.preflight import PreflightError

    chose = any(o.split("=", 1)[0].lstrip("+~") in ("preset", "trainer.device") for o in overrides)
    remote = cfg.trainer.ray_address or os.environ.get("RAY_ADDRESS")
    if chose or remote or cfg.trainer.device != "auto" or plan.device != "cpu":
        return
    raise PreflightError(
        "trainer.device: auto, but this machine has no CUDA device and the default config "
        "is sized for a GPU; run `grl-train preset=cpu` (a small CPU run), or set "
        "trainer.device=cpu to run this config anyway"
    )


def resolve_run_plan(cfg):
    """The run plan, with `auto` device and engine resolved once (grl/machine.py) on the machine the ranks
    run on: the Ray cluster the run joins (whose address preflight checks first), else this one."""
    import os

    from grl.machine import machine_facts
    from grl.preflight import check_ray_address
    from grl.run_plan import RunPlan

    trainer, engine = cfg.trainer, cfg.actor_rollout_ref.rollout
    address = trainer.ray_address or os.environ.get("RAY_ADDRESS")
    cluster = None
    if address and address != "local" and trainer.device == "auto":
        from grl.workers.runtime import cluster_gpus

        check_ray_address(cfg, os.environ)
        cluster = cluster_gpus(address)
    return RunPlan.from_config(cfg, machine_facts(trainer.device, engine.name, trainer.gpu_memory_gb, cluster))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)

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
    try:
        plan = resolve_run_plan(cfg)
        check_gpu_sized(cfg, args.overrides, plan)
        notes = preflight.check(cfg, run=plan)
    except ConfigError as err:
        print(f"grl-train: {err}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"grl-train: note: {note}", file=sys.stderr)

    from grl.trainer import RunAborted, run

    signal.signal(signal.SIGTERM, _stop)  # `timeout`, a scheduler: unwind like Ctrl-C so workers are shut down
    try:
        run(cfg, plan)
    except KeyboardInterrupt:
        print("grl-train: stopped; every worker was shut down", file=sys.stderr)
        return 130
    except RunAborted as err:  # a worker died: the message names it and the checkpoint to resume from
        print(f"grl-train: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
