"""Wall clock and CPU time of one training run of the default experiment, split as `run.json` splits them.

Trains one C-GRPO or fixed-group GRPO run of `config/config.yaml` (seed, method and the shared generation schedule
chosen here) with `cgrpo.pipeline.jobs.runs.train_run`, on the base model and splits the default pipeline wrote. A C-GRPO
run's initial calibration is fitted and timed here too (`cgrpo.pipeline.jobs.runs.calibrate_initial`), not read from the
pipeline's, so every figure comes from this process. Torch uses the pipeline's thread count: one per training job.
Prints the training, generation, update and calibration seconds, the CPU seconds, and the generated rollouts and
tokens. Run from the repository root after `snakemake --cores 2`::

    HF_HUB_OFFLINE=1 python benchmarks/run_time.py --method cgrpo --seed 0
    HF_HUB_OFFLINE=1 python benchmarks/run_time.py --method grpo --seed 0
    HF_HUB_OFFLINE=1 python benchmarks/run_time.py --method grpo --seed 0 --steps-per-generation 1

`--steps-per-generation 1` is TRL's schedule (one generation per optimizer step) instead of the shared one.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
import yaml

from cgrpo.pipeline.configuration.methods import cgrpo_run_name, grpo_run_name
from cgrpo.pipeline.configuration.run_specs import train_spec
from cgrpo.pipeline.configuration.specs import calibration_spec, format_grid
from cgrpo.pipeline.jobs.runs import calibrate_initial, train_run

FIELDS = (
    "train_wall_s",
    "generation_wall_s",
    "update_wall_s",
    "calibration_wall_s",
    "total_wall_s",
    "train_cpu_s",
    "total_cpu_s",
    "train_rollouts_generated",
    "train_tokens_generated",
    "steps_per_generation",
)
# The training rules' `threads:` (workflow/rules/training.smk): one torch thread per job.
PIPELINE_THREADS = 1


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--method", choices=["cgrpo", "grpo"], default="cgrpo")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps-per-generation", type=int, help="every method's schedule; default: the config's")
    parser.add_argument("--config", default="config/config.yaml")
    parser.add_argument("--results", default="results/default", help="the default pipeline's output folder")
    parser.add_argument("--threads", type=int, default=PIPELINE_THREADS)
    return parser.parse_args()


def measure(config: dict, args: argparse.Namespace, results: Path, out: Path) -> dict:
    """Train the run the workflow would for this method and seed (first grid, delta and refit interval; GRPO at
    G = max(grid)), after a C-GRPO run's own initial calibration; return its `run.json` record."""
    grid = config["cgrpo"]["budget_grids"][0]
    # The base_model rule's record says where the model loads from: the bootstrapped folder or the configured path.
    record = json.loads((results / "base_model" / "source.json").read_text())
    model = str(results / "base_model") if record["bootstrap"] else record["path"]
    splits = str(results / "splits")
    if args.method == "grpo":
        spec = train_spec(config, grpo_run_name(args.seed, max(grid)), model, splits)
    else:
        calibrate_initial(
            calibration_spec(config, format_grid(grid), config["splits"]["seed"], model, splits), out / "calibration"
        )
        run = cgrpo_run_name(args.seed, grid, config["cgrpo"]["deltas"][0], config["cgrpo"]["recalibrate_every"][0])
        spec = train_spec(config, run, model, splits, str(out / "calibration" / "thresholds.json"))
    train_run(spec, out / "run")
    return json.loads((out / "run" / "run.json").read_text())


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    config = yaml.safe_load(Path(args.config).read_text())
    if args.steps_per_generation is not None:
        config["training"]["steps_per_generation"] = args.steps_per_generation
    with tempfile.TemporaryDirectory() as out:
        record = measure(config, args, Path(args.results), Path(out))
    print(
        " ".join(
            f"{name}={record[name]:.4g}" if isinstance(record[name], float) else f"{name}={record[name]}"
            for name in FIELDS
        )
    )


if __name__ == "__main__":
    main()
