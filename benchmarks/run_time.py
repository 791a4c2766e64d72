"""Wall clock of one training run of the default experiment, alone on the machine, split as `run.json` splits it.

Trains one C-GRPO or fixed-group GRPO run of `config/config.yaml` (seed, method and C-GRPO's generation schedule
chosen here) with `cgrpo.pipeline.runs.train_run`, on the base model, splits and initial calibration the default
pipeline wrote, and prints its training, generation, update and calibration seconds and its generated rollouts and tokens.
Run from the repository root after `snakemake --cores 2`::

    HF_HUB_OFFLINE=1 python benchmarks/run_time.py --method cgrpo --seed 0
    HF_HUB_OFFLINE=1 python benchmarks/run_time.py --method cgrpo --seed 0 --min-generation-prompts 1
    HF_HUB_OFFLINE=1 python benchmarks/run_time.py --method grpo --seed 0

`--min-generation-prompts 1` is C-GRPO's schedule before generation batches were shared: one per optimizer step.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import replace
from pathlib import Path

import torch
import yaml

from cgrpo.pipeline.runs import train_run
from cgrpo.pipeline.methods import cgrpo_run_name, grpo_run_name, train_spec
from cgrpo.pipeline.specs import TrainSpec, format_grid

FIELDS = ("train_wall_s", "generation_wall_s", "update_wall_s", "calibration_wall_s", "total_wall_s",
          "train_rollouts_generated", "train_tokens_generated", "steps_per_generation")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--method", choices=["cgrpo", "grpo"], default="cgrpo")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-generation-prompts", type=int, help="C-GRPO only; default: the config's")
    parser.add_argument("--config", default="config/config.yaml")
    parser.add_argument("--results", default="results/default", help="the default pipeline's output folder")
    parser.add_argument("--threads", type=int, default=2)
    return parser.parse_args()


def run_spec(config: dict, args: argparse.Namespace, results: Path) -> TrainSpec:
    """The spec the workflow gives `train_run` for this method and seed (first grid, delta and refit interval;
    GRPO at G = max(grid)), with C-GRPO's generation schedule overridden when asked."""
    grid = config["cgrpo"]["budget_grids"][0]
    # The base_model rule's record says where the model loads from: the bootstrapped folder or the configured path.
    record = json.loads((results / "base_model" / "source.json").read_text())
    model = str(results / "base_model") if record["bootstrap"] else record["path"]
    splits = str(results / "splits")
    if args.method == "grpo":
        return train_spec(config, grpo_run_name(args.seed, max(grid)), model, splits)
    run = cgrpo_run_name(args.seed, grid, config["cgrpo"]["deltas"][0], config["cgrpo"]["recalibrate_every"][0])
    calibration = str(results / "calibration" / format_grid(grid) / "thresholds.json")
    spec = train_spec(config, run, model, splits, calibration)
    if args.min_generation_prompts is None:
        return spec
    return replace(spec, cgrpo={**spec.cgrpo, "min_generation_prompts": args.min_generation_prompts})


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    config = yaml.safe_load(Path(args.config).read_text())
    spec = run_spec(config, args, Path(args.results))
    with tempfile.TemporaryDirectory() as out:
        train_run(spec, out)
        record = json.loads((Path(out) / "run.json").read_text())
    print(" ".join(f"{name}={record[name]:.4g}" if isinstance(record[name], float) else f"{name}={record[name]}"
                   for name in FIELDS))


if __name__ == "__main__":
    main()
