"""Print what a config's run will cost before anything runs: every GPU job's rollouts and tokens, totals per method,
the calibrations' share of G = max(grid)'s training rollouts, GPU-hours at the throughputs given, and warnings.

    python scripts/cost_plan.py --configfile config/gsm8k_qwen.yaml --gen-tokens-per-s 20000 --train-tokens-per-s 40000

`--configfile` takes one or more configs, merged in order as Snakemake merges them; the config is validated and
checked as the workflow's planning step does (docs/clusters.md, "The cost plan").
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml
from snakemake.utils import update_config, validate

from cgrpo.pipeline.analysis.cost_plan import Throughput, TokenCounts, plan_report
from cgrpo.pipeline.configuration.checks import ConfigError, check_config
from cgrpo.pipeline.configuration.plugins import import_plugins

SCHEMA = Path(__file__).resolve().parents[1] / "workflow" / "schemas" / "config.schema.yaml"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configfile", nargs="+", required=True, type=Path, help="configs, merged in order")
    parser.add_argument("--gen-tokens-per-s", type=float, required=True, help="tokens generated per GPU-second")
    parser.add_argument("--train-tokens-per-s", type=float, required=True, help="tokens trained per GPU-second")
    parser.add_argument("--completion-tokens", type=float, help="expected tokens per completion (default: the maximum)")
    parser.add_argument("--prompt-tokens", type=float, default=0.0, help="prompt tokens per trained rollout")
    parser.add_argument("--mean-k", type=float, help="expected rollouts per prompt of stopping rules (default: max)")
    args = parser.parse_args()
    if min(args.gen_tokens_per_s, args.train_tokens_per_s) <= 0:
        parser.error("throughputs must be positive tokens per second; measure them on your GPU (docs/clusters.md).")
    config = {}
    for path in args.configfile:
        update_config(config, yaml.safe_load(path.read_text()))
    try:
        validate(config, schema=str(SCHEMA))
        import_plugins(config["plugins"])
        check_config(config)
        tokens = TokenCounts(args.completion_tokens, args.prompt_tokens)
        print(plan_report(config, Throughput(args.gen_tokens_per_s, args.train_tokens_per_s), tokens, args.mean_k))
    except (ConfigError, ValueError) as error:
        print(f"cost plan: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
