"""Generation rounds and wall clock of C-GRPO against fixed-group GRPO at the library's defaults, in two regimes.

C-GRPO samples in rounds along the budget grid; GRPO draws its group in one call. Two regimes bound the cost of the
rounds, each forced through the answer extractor, with the library's defaults and a random-weight model of the
default experiment's size (0.4M parameters, completions to `--max-completion-length`):

- ``stop2``: every answer agrees, so every prompt stops at the first budget; against GRPO at G = min(grid).
- ``walk``: every answer differs, so every threshold is 1 and no prompt stops before max(grid); against GRPO at
  G = max(grid). With `skip_impossible_budgets` (the default) a prompt draws straight to max(grid) after its first
  two answers differ; without it, it visits every budget.

Each C-GRPO run calibrates once, on `--calibration-prompts` prompts, inside `train()`: its wall clock includes the
calibration (`calibration_s_median`; `ratio_without_calibration` leaves its seconds out). The calibration is a fixed
cost (prompts x max(grid) rollouts) that GRPO does not pay, so its share of the ratio falls with `--steps`. Runs are
interleaved over `--repeats` and the median is reported, with the rounds per step (generation calls of the budget
sampler) and the ratio to GRPO's median. With both regimes, a least-squares fit of the seconds per step (calibration
left out) on rounds and rollouts per step is the cost model of docs/trainer.md, "Rounds and what they cost".
`trl-cgrpo`, the published peer, is not installed here (the project may not use its code), so its column is left out.

Run (offline, CPU; about 2 minutes and 1 minute on 2 cores), from the repository root::

    HF_HUB_OFFLINE=1 python benchmarks/rounds.py --repeats 5 --out results/reference/rounds
    HF_HUB_OFFLINE=1 python benchmarks/rounds.py --regimes stop2 --steps 24 --repeats 5 --out results/reference/rounds/stop2_24_steps
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from cgrpo import CGRPOConfig, CGRPOTrainer
from cgrpo.pipeline.jobs.base_model import BootstrapSettings, build_model, train_tokenizer

GRID = CGRPOConfig.__dataclass_fields__["budget_grid"].default_factory()
REGIMES = ("stop2", "walk")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts-per-step", type=int, default=4)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--calibration-prompts", type=int, default=4)
    parser.add_argument("--max-completion-length", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--regimes", nargs="+", choices=REGIMES, default=list(REGIMES), help="the regimes to run")
    parser.add_argument("--out", type=Path, help="folder for rounds.csv; printed only when left out")
    return parser.parse_args()


def random_model(folder: Path, seed: int) -> str:
    """A random-weight Llama of the default experiment's size with the bootstrap's tokenizer; returns its folder."""
    settings = BootstrapSettings(seed=seed)
    tokenizer = train_tokenizer([f"{question(i)} #### {i}" for i in range(2000)], settings.vocab_size, 256)
    model = build_model(tokenizer, settings)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def question(i: int) -> str:
    return f"Question: Tom has {i} pens and buys {i % 7} more. How many pens?\nAnswer:"


def prompts(count: int, offset: int = 0) -> Dataset:
    return Dataset.from_dict(
        {"prompt": [question(i) for i in range(offset, offset + count)], "answer": ["0"] * count},
    )


def length_reward(completions, **kwargs):
    return [float(len(c)) for c in completions]


def options(args, width: int) -> dict:
    return dict(
        output_dir=tempfile.mkdtemp(),
        use_cpu=True,
        bf16=False,
        report_to=[],
        disable_tqdm=True,
        save_strategy="no",
        logging_steps=args.steps,
        max_steps=args.steps,
        max_completion_length=args.max_completion_length,
        per_device_train_batch_size=args.prompts_per_step * width,
        seed=args.seed,
    )


def cgrpo_trainer(args, model: str, regime: str, skip: bool) -> CGRPOTrainer:
    # "walk": a new answer on every call, so no two answers ever agree.
    counter = itertools.count()
    extractor = (lambda text: "7") if regime == "stop2" else (lambda text: str(next(counter)))
    return CGRPOTrainer(
        model=model,
        reward_funcs=length_reward,
        args=CGRPOConfig(skip_impossible_budgets=skip, **options(args, GRID[-1])),
        train_dataset=prompts(args.prompts_per_step * args.steps),
        calibration_dataset=prompts(args.calibration_prompts, offset=10**6),
        answer_extractor=extractor,
    )


def grpo_trainer(args, model: str, width: int) -> GRPOTrainer:
    return GRPOTrainer(
        model=model,
        reward_funcs=length_reward,
        args=GRPOConfig(num_generations=width, **options(args, width)),
        train_dataset=prompts(args.prompts_per_step * args.steps),
    )


def timed(trainer: GRPOTrainer) -> float:
    torch.manual_seed(0)
    start = time.perf_counter()
    trainer.train()
    return time.perf_counter() - start


def measure(args, model: str) -> pd.DataFrame:
    runs = [
        ("stop2", "GRPO G = 2", lambda: grpo_trainer(args, model, GRID[0])),
        ("stop2", "C-GRPO", lambda: cgrpo_trainer(args, model, "stop2", True)),
        ("walk", "GRPO G = 32", lambda: grpo_trainer(args, model, GRID[-1])),
        ("walk", "C-GRPO", lambda: cgrpo_trainer(args, model, "walk", True)),
        ("walk", "C-GRPO, every budget", lambda: cgrpo_trainer(args, model, "walk", False)),
    ]
    runs = [run for run in runs if run[0] in args.regimes]
    seconds: dict[tuple[str, str], list[tuple[float, float]]] = {}
    rounds: dict[tuple[str, str], float] = {}
    for repeat in range(args.repeats + 1):  # the first pass warms up and is not counted
        for regime, name, build in runs:
            trainer = build()
            wall = timed(trainer)
            totals = getattr(trainer, "cgrpo_totals", None)
            if repeat:
                calibration = 0.0 if totals is None else totals["calibration_s"]
                seconds.setdefault((regime, name), []).append((wall, wall - calibration))
            rounds[(regime, name)] = 1.0 if totals is None else totals["generation_rounds"] / args.steps
    rows = []
    for (regime, name), walls in seconds.items():
        reference = statistics.median(
            w for w, _ in seconds[(regime, f"GRPO G = {GRID[0 if regime == 'stop2' else -1]}")]
        )
        median = statistics.median(w for w, _ in walls)
        rows.append(
            {
                "regime": regime,
                "trainer": name,
                "wall_s_median": round(median, 2),
                "wall_s_min": round(min(w for w, _ in walls), 2),
                "wall_s_max": round(max(w for w, _ in walls), 2),
                "ratio_to_grpo": round(median / reference, 3),
                "ratio_without_calibration": round(statistics.median(t for _, t in walls) / reference, 3),
                "calibration_s_median": round(statistics.median(w - t for w, t in walls), 3),
                "rounds_per_step": rounds[(regime, name)],
                "rollouts_per_step": args.prompts_per_step * (GRID[0] if regime == "stop2" else GRID[-1]),
                "seconds_per_step": round(statistics.median(t for _, t in walls) / args.steps, 4),
            }
        )
    return pd.DataFrame(rows)


def cost_model(table: pd.DataFrame) -> dict[str, float]:
    """Least-squares fit of the seconds per training step (calibration left out) on rounds and rollouts per step."""
    design = np.column_stack([np.ones(len(table)), table["rounds_per_step"], table["rollouts_per_step"]])
    (base, per_round, per_rollout), *_ = np.linalg.lstsq(design, table["seconds_per_step"].to_numpy(), rcond=None)
    return {"s_per_step": base, "s_per_round": per_round, "s_per_rollout": per_rollout}


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        table = measure(args, random_model(Path(folder) / "model", args.seed))
    print(table.to_string(index=False))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        table.to_csv(args.out / "rounds.csv", index=False)
        print(f"wrote {args.out / 'rounds.csv'}")
    # The fit needs both regimes: stop2 alone varies neither rounds nor rollouts.
    if set(args.regimes) != set(REGIMES):
        return
    fit = cost_model(table)
    print(
        "cost model: seconds per step = {s_per_step:.4f} + {s_per_round:.4f} x rounds + {s_per_rollout:.5f} x "
        "rollouts".format(**fit)
    )
    if args.out is not None:
        pd.DataFrame([fit]).to_csv(args.out / "rounds_cost_model.csv", index=False)
        print(f"wrote {args.out / 'rounds_cost_model.csv'}")


if __name__ == "__main__":
    main()
