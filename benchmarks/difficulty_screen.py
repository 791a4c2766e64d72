"""Screen arithmetic task mixes for one where the rollout budget binds, on the base model's samples, before training.

For each candidate `difficulty` mix of the arithmetic task (`cgrpo.pipeline.tasks.arithmetic.STRATA`), the base
model draws `--samples` completions for `--prompts` problems of the mix; every registered stopping rule is replayed
on these pools at its default sweep (`cgrpo.pipeline.analysis.replay`), and its saving against fixed group sizes at
an equal share of informative prompts is computed (`cgrpo.pipeline.analysis.screen`). Run from the repository root:

    python benchmarks/difficulty_screen.py --out results/reference/budget/difficulty_screen.csv \
        --mix medium=1 --mix easy=0.3,medium=0.4,hard=0.3 --mix easy=0.4,medium=0.2,hard=0.4

It prints one line per mix (shares of trivial, hopeless and mixed prompts, the base model's accuracy, and each
rule's best saving) and writes every rule setting's row to `--out`. `medium=1` is the default experiment's mix.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import pandas as pd
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from cgrpo.pipeline.analysis.screen import screen_pools
from cgrpo.pipeline.jobs.sampling import generate_completions
from cgrpo.pipeline.tasks import get_task
from cgrpo.stopping import Pools, correct_flags


def parse_mix(text: str) -> dict[str, float]:
    """`easy=0.4,medium=0.2,hard=0.4` -> {"easy": 0.4, "medium": 0.2, "hard": 0.4}."""
    try:
        return {name: float(weight) for name, weight in (part.split("=") for part in text.split(","))}
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a mix; write stratum=weight pairs: easy=0.4,hard=0.6"
        ) from None


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mix", type=parse_mix, action="append", required=True, help="a difficulty mix (repeat)")
    parser.add_argument("--model", type=Path, default=Path("resources/base_model/arithmetic"))
    parser.add_argument("--prompts", type=int, default=128, help="problems per mix")
    parser.add_argument("--samples", type=int, default=32, help="samples per problem (the grid's largest budget)")
    parser.add_argument("--grid", default="2,4,8,16,32", help="the budget grid")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max-new-tokens", type=int, default=40)
    parser.add_argument("--resplits", type=int, default=10, help="cross-fitting re-splits of the calibrated rules")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, help="CSV of every rule setting's saving per mix")
    return parser.parse_args()


def sample_pools(model, tokenizer, task, args, grid: list[int]) -> Pools:
    """The base model's `args.samples` answers to `args.prompts` problems of `task`, as replay pools."""
    rows = task.load("train").select(range(args.prompts))
    prompts = [task.format_prompt(question) for question in rows["question"]]
    completions = generate_completions(
        model,
        tokenizer,
        prompts,
        num_samples=args.samples,
        temperature=args.temperature,
        max_new_tokens=args.max_new_tokens,
        batch_size=256,
        seed=args.seed,
    )
    golds = [task.gold(answer) for answer in rows["answer"]]
    outcomes = [[task.extract(text) for text in texts] for texts in completions]
    rewards = [correct_flags("aps", row, gold) for row, gold in zip(outcomes, golds)]
    return Pools("aps", grid, outcomes, rewards, golds, random.Random(args.seed))


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    grid = [int(k) for k in args.grid.split(",")]
    model = AutoModelForCausalLM.from_pretrained(args.model).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    tables = []
    for mix in args.mix:
        task = get_task("arithmetic", difficulty=mix)
        shares, savings = screen_pools(sample_pools(model, tokenizer, task, args, grid), args.resplits, args.seed)
        name = ",".join(f"{stratum}={weight:g}" for stratum, weight in mix.items())
        best = savings.groupby("rule")["saving"].max()
        print(
            f"{name}: trivial {shares['trivial']:.2f}, hopeless {shares['hopeless']:.2f}, mixed {shares['mixed']:.2f}, "
            f"accuracy {shares['accuracy']:.3f}; best saving per rule: "
            + ", ".join(f"{rule} {value:.2f}" for rule, value in best.items())
        )
        tables.append(savings.assign(mix=name, prompts=args.prompts, **shares))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        table = pd.concat(tables)
        table[["mix", *[c for c in table.columns if c != "mix"]]].to_csv(args.out, index=False)


if __name__ == "__main__":
    main()
