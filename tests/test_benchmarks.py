"""benchmarks/generation_schedule.py measures what it says: forced stopping regimes, and ratios to the right GRPO."""

from __future__ import annotations

import argparse
import shutil
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
from conftest import REPO, load_script

from cgrpo.pipeline.metrics.statistics import t_mean_ci

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "generation_schedule.py"


@pytest.fixture(scope="module")
def schedule():
    return load_script(SCRIPT, "generation_schedule")


def _args(**overrides) -> argparse.Namespace:
    options = dict(
        prompts=8,
        prompts_per_step=2,
        max_completion_length=4,
        calibration_prompts=2,
        prompts_per_calibration=160.0,
        device="cpu",
        use_vllm=False,
        seed=0,
    )
    return argparse.Namespace(**{**options, **overrides})


@pytest.mark.parametrize("regime", ["kmin", "walk", "mix"])
def test_forced_regimes_stop_every_prompt_where_drawn(schedule, tiny_model_dir, regime):
    mix = {2: 0.5, 8: 0.25, 32: 0.25}
    budgets = schedule.stopping_budgets(regime, 8, mix, seed=0)
    trainer = schedule.cgrpo_trainer(_args(), tiny_model_dir, round_prompts=4, stop_at=budgets)
    assert trainer.args.steps_per_generation == 2
    schedule.timed_training(trainer)
    assert trainer.budget_histogram == Counter(budgets)
    if regime == "mix":
        assert set(budgets) == {2, 8, 32}


def test_budget_mix_reads_a_summary_or_weights(schedule, tmp_path):
    summary = tmp_path / "summary.csv"
    pd.DataFrame(
        {
            "method": ["base", "cgrpo", "cgrpo", "grpo"],
            "train_budget_histogram": [None, "2:10, 32:5", "2:4, 16:1", "32:320"],
        }
    ).to_csv(summary, index=False)
    assert schedule.budget_mix(str(summary)) == {2: 14.0, 32: 5.0, 16: 1.0}
    assert schedule.budget_mix("2:0.5,32:0.5") == {2: 0.5, 32: 0.5}
    with pytest.raises(SystemExit, match="not in the grid"):
        schedule.budget_mix("3:1")
    with pytest.raises(SystemExit, match="neither a summary.csv"):
        schedule.budget_mix("missing.csv")


def test_ratios_compare_each_regime_with_its_grpo(schedule):
    rows = []
    for round_prompts, scale in ((2, 2.0), (16, 1.0)):
        rows += [
            {
                "model": "m",
                "round_prompts": round_prompts,
                "method": "GRPO G=2",
                "regime": None,
                "rollouts_per_prompt": 2,
                "generation_s": 1.0 * scale,
                "update_s": 1.0,
                "calibration_s": 0.0,
            },
            {
                "model": "m",
                "round_prompts": round_prompts,
                "method": "GRPO G=32",
                "regime": None,
                "rollouts_per_prompt": 32,
                "generation_s": 8.0 * scale,
                "update_s": 2.0,
                "calibration_s": 0.0,
            },
            {
                "model": "m",
                "round_prompts": round_prompts,
                "method": "C-GRPO",
                "regime": "kmin",
                "rollouts_per_prompt": 2,
                "calibration_rollouts_per_prompt": 3.2,
                "generation_s": 1.5,
                "update_s": 1.0,
                "calibration_s": 0.5,
            },
            {
                "model": "m",
                "round_prompts": round_prompts,
                "method": "C-GRPO",
                "regime": "mix",
                "rollouts_per_prompt": 16,
                "calibration_rollouts_per_prompt": 3.2,
                "generation_s": 4.0,
                "update_s": 1.5,
                "calibration_s": 0.5,
            },
        ]
    table = schedule.with_ratios(pd.DataFrame(rows)).set_index(["round_prompts", "regime"])
    assert table.loc[(16, "kmin"), "ratio"] == pytest.approx(3.0 / 2.0)
    assert table.loc[(16, "kmin"), "ratio_without_calibration"] == pytest.approx(2.5 / 2.0)
    assert table.loc[(16, "kmin"), "ratio_vs_grpo_one_step_rounds"] == pytest.approx(3.0 / 3.0)
    assert table.loc[(16, "mix"), "ratio"] == pytest.approx(6.0 / 10.0)
    assert table.loc[(16, "mix"), "mix_target"] == pytest.approx(1 - 0.7 * (1 - 19.2 / 32))


# ---------------------------------------------------------------------- benchmarks/rounds.py
@pytest.fixture(scope="module")
def rounds_script():
    return load_script(SCRIPT.parent / "rounds.py", "rounds")


@pytest.mark.parametrize(
    ("regime", "skip", "budget", "rounds"), [("stop2", True, 2, 1), ("walk", True, 32, 2), ("walk", False, 32, 5)]
)
def test_the_rounds_regimes_stop_where_they_say_in_as_many_rounds(
    rounds_script, tiny_model_dir, regime, skip, budget, rounds
):
    args = argparse.Namespace(prompts_per_step=2, steps=2, calibration_prompts=2, max_completion_length=4, seed=0)
    trainer = rounds_script.cgrpo_trainer(args, tiny_model_dir, regime, skip)
    trainer.train()
    assert trainer.budget_histogram == Counter({budget: 4})
    assert trainer.cgrpo_totals["generation_rounds"] == rounds * args.steps


def test_the_rounds_table_times_the_calibration_apart_in_the_regimes_asked_for(rounds_script, tiny_model_dir):
    args = argparse.Namespace(
        prompts_per_step=2,
        steps=2,
        calibration_prompts=2,
        max_completion_length=4,
        seed=0,
        repeats=1,
        regimes=["stop2"],
    )
    table = rounds_script.measure(args, tiny_model_dir).set_index("trainer")
    assert list(table.index) == ["GRPO G = 2", "C-GRPO"]
    assert table.loc["GRPO G = 2", "calibration_s_median"] == 0.0
    assert table.loc["C-GRPO", "calibration_s_median"] > 0.0
    assert table.loc["C-GRPO", "ratio_to_grpo"] > table.loc["C-GRPO", "ratio_without_calibration"]


def test_the_cost_model_recovers_seconds_per_round_and_per_rollout(rounds_script):
    table = pd.DataFrame({"rounds_per_step": [1, 1, 1, 2, 5], "rollouts_per_step": [8, 8, 128, 128, 128]})
    table["seconds_per_step"] = 0.1 + 0.05 * table["rounds_per_step"] + 0.002 * table["rollouts_per_step"]
    fit = rounds_script.cost_model(table)
    assert fit == pytest.approx({"s_per_step": 0.1, "s_per_round": 0.05, "s_per_rollout": 0.002})


def test_prompt_cache_times_a_round_and_its_prefill_for_each_prompt_and_round_size(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))  # it imports the model and questions of rounds.py
    script = load_script(SCRIPT.parent / "prompt_cache.py", "prompt_cache")
    model, tokenizer = script.load("random", tmp_path / "model")
    args = argparse.Namespace(completion_length=4, prompts=2, rows="2,3", repeats=1)
    table = script.measure(args, model, tokenizer)
    assert list(zip(table["prompt"], table["rows"])) == [("short", 4), ("short", 6), ("long", 4), ("long", 6)]
    short, long = table.groupby("prompt")["prompt_tokens"].first()[["short", "long"]]
    assert long > 10 * short
    assert (table["prefill_s"] > 0).all() and (table["round_s"] > 0).all()
    assert ((table["prefill_share"] - table["prefill_s"] / table["round_s"]).abs() < 0.01).all()


# ---------------------------------------------------------------------- benchmarks/seed_intervals.py
def test_seed_intervals_rewrites_a_folder_with_the_paired_t_interval_of_its_summary(tmp_path):
    module = load_script(REPO / "benchmarks" / "seed_intervals.py", "seed_intervals")
    folder = tmp_path / "one_step_generation"
    shutil.copytree(REPO / "results" / "reference" / "one_step_generation", folder)
    assert module.rewrite(folder, resamples=200, seed=0) == ["by_method", "paired"]
    summary = pd.read_csv(folder / "summary.csv")
    cgrpo = summary[summary["method"] == "cgrpo"].set_index("seed")["eval_mean_at_k"]
    grpo = summary[(summary["method"] == "grpo") & (summary["setting"] == "G=32")].set_index("seed")["eval_mean_at_k"]
    paired = pd.read_csv(folder / "paired.csv").set_index("baseline").loc["GRPO G=32"]
    column = "sampled accuracy (mean@k) difference"
    expected = t_mean_ci((cgrpo - grpo).to_numpy())
    assert (paired[column], paired[f"{column} 95% CI low"], paired[f"{column} 95% CI high"]) == pytest.approx(expected)
    assert paired["interval"] == "Student's t over 3 seeds (paired for differences)"
    # The base model's row keeps its bootstrap over eval prompts, which the summary does not hold.
    base = pd.read_csv(folder / "by_method.csv").set_index("method").loc["base"]
    committed = pd.read_csv(REPO / "results" / "reference" / "one_step_generation" / "by_method.csv")
    assert base["greedy accuracy 95% CI low"] == committed.set_index("method").loc["base", "greedy accuracy 95% CI low"]
