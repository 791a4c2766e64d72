"""Print what a config's run will cost before anything runs: every GPU job's rollouts and tokens, totals per method,
the calibrations' share of G = max(grid)'s training rollouts, GPU-hours at the throughputs given (engine start-ups
included), each job's GPU memory against the GPU's, and warnings.

    python scripts/cost_plan.py --configfile config/gsm8k_qwen.yaml --gen-tokens-per-s 20000 --train-tokens-per-s 40000

`--configfile` takes one or more configs, merged in order as Snakemake merges them; the config is validated and
checked as the workflow's planning step does (docs/clusters.md, "The cost plan"). The model's size comes from its
config.json (its folder's, the Hugging Face cache's, or the published one of the shipped configs' Qwen models), or
`--model-config` / `--model-params`. `scripts/gpu_smoke.py` prints the throughput flags it measured, with
`--measured-on` naming its model, so that a plan for a larger model scales them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml
from snakemake.utils import update_config, validate

from cgrpo.pipeline.configuration.checks import ConfigError, check_config
from cgrpo.pipeline.configuration.plugins import import_plugins
from cgrpo.pipeline.configuration.specs import base_model_path
from cgrpo.pipeline.planning.cost_plan import Throughput, TokenCounts, plan_report
from cgrpo.pipeline.planning.model_size import find_model_size

SCHEMA = Path(__file__).resolve().parents[1] / "workflow" / "schemas" / "config.schema.yaml"
# Seconds to start a colocated or evaluation vLLM engine on a GPU the first time (weights loaded, torch.compile, CUDA
# graphs captured), not measured here: the sample start-up of a model of 6.2 GB of weights on an L40S logged 14 s of
# loading, 30 s of compiling and 18 s of graph capture (perf-test/server-startup/README.md of a fork of vLLM's
# production-stack, github.com/dumb0002/production-stack). A warm compile cache (~/.cache/vllm) shortens later starts.
ENGINE_STARTUP_S = 60.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configfile", nargs="+", required=True, type=Path, help="configs, merged in order")
    parser.add_argument("--gen-tokens-per-s", type=float, required=True, help="tokens generated per GPU-second")
    parser.add_argument("--train-tokens-per-s", type=float, required=True, help="tokens trained per GPU-second")
    parser.add_argument("--completion-tokens", type=float, help="expected tokens per completion (default: the maximum)")
    parser.add_argument("--prompt-tokens", type=float, default=0.0, help="prompt tokens per trained rollout")
    parser.add_argument("--mean-k", type=float, help="expected rollouts per prompt of stopping rules (default: max)")
    parser.add_argument(
        "--engine-startup-s", type=float, default=ENGINE_STARTUP_S, help="seconds per vLLM engine start (default: 60)"
    )
    parser.add_argument("--gpu-memory-gib", type=float, default=80.0, help="memory of one GPU in GiB (default: 80)")
    parser.add_argument("--model-config", type=Path, help="the config.json (or its folder) of the config's model")
    parser.add_argument("--model-params", type=int, help="the config's model's parameter count, if known better")
    parser.add_argument("--measured-on", help="the model (hub id or folder) the throughputs were measured on")
    args = parser.parse_args()
    if min(args.gen_tokens_per_s, args.train_tokens_per_s) <= 0:
        parser.error("throughputs must be positive tokens per second; measure them on your GPU (docs/clusters.md).")
    if args.model_config is not None and not args.model_config.exists():
        parser.error(f"--model-config {args.model_config} does not exist; give a config.json or the folder holding it.")
    config = {}
    for path in args.configfile:
        update_config(config, yaml.safe_load(path.read_text()))
    try:
        validate(config, schema=str(SCHEMA))
        import_plugins(config["plugins"])
        check_config(config)
        tokens = TokenCounts(args.completion_tokens, args.prompt_tokens)
        throughput = Throughput(args.gen_tokens_per_s, args.train_tokens_per_s, args.engine_startup_s)
        model = None
        if not config["base_model"]["bootstrap"]:
            model = find_model_size(base_model_path(config), args.model_config, args.model_params)
        measured_on = find_model_size(args.measured_on) if args.measured_on else None
        if args.measured_on and measured_on is None:
            raise ValueError(
                f"--measured-on {args.measured_on}: no config.json of it was found (a folder, the Hugging Face cache, "
                "or the published ones of the shipped configs' models); give a folder holding its config.json."
            )
        report = plan_report(config, throughput, tokens, args.mean_k, model, measured_on, args.gpu_memory_gib)
        print(report)
    except (ConfigError, ValueError) as error:
        print(f"cost plan: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
