"""The replay frontier: exact measures on hand-made pools, cross-fitting, the equal-cost comparison, the tables and
plot, and the committed default run's frontier."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from cgrpo.pipeline.analysis.replay import (
    MEASURES,
    frontier_at_reference,
    pools_of_record,
    replay_frontier,
    replay_table,
    rule_settings,
    run_replay,
)
from cgrpo.stopping import Pools, correct_flags, get_rule, rule_names

REPO = Path(__file__).resolve().parents[1]
GRID = [2, 4, 8]


def _record(rng: random.Random, prompts: int = 24) -> dict:
    """An evaluation record's pools: half the prompts calibration, half eval, solve rates spread over [0, 1]."""
    rows, golds = [], []
    for _ in range(prompts):
        rate = rng.random()
        rows.append([("7" if rng.random() < rate else rng.choice(["1", "2", None])) for _ in range(GRID[-1])])
        golds.append("7")
    half = prompts // 2
    return {
        "run": "base",
        "pools": {
            "calibration": {"outcomes": rows[:half], "golds": golds[:half]},
            "eval": {"outcomes": rows[half:], "golds": golds[half:]},
        },
    }


def test_measures_of_a_fixed_group_are_exact():
    # Prompt 0 always right (never informative), 1 mixed only after 4 draws, 2 mixed from the start.
    outcomes = [["7"] * 8, ["7"] * 4 + ["1"] * 4, ["7", "1"] * 4, ["1"] * 8]
    rewards = [correct_flags("aps", row, "7") for row in outcomes]
    pools = Pools("aps", GRID, outcomes, rewards, ["7"] * 4, random.Random(0))
    rules = [("fixed", size, get_rule("fixed")("aps", size=size)) for size in GRID]
    keys, measures = replay_frontier(pools, rules, resplits=3, seed=0)
    assert keys == [("fixed", 2), ("fixed", 4), ("fixed", 8)]
    assert measures.shape == (3, 4, len(MEASURES))
    at = {name: MEASURES.index(name) for name in MEASURES}
    # At G = 2: rollouts 2 each; informative prompts 1 and 2; only prompt 2's group of 2 kept its signal.
    np.testing.assert_array_equal(measures[0, :, at["rollouts"]], [2, 2, 2, 2])
    np.testing.assert_array_equal(measures[0, :, at["informative"]], [0, 1, 1, 0])
    np.testing.assert_array_equal(measures[0, :, at["kept"]], [0, 0, 1, 0])
    np.testing.assert_array_equal(measures[2, :, at["signal_rows"]], [0, 8, 8, 0])
    table = replay_table(keys, measures, resamples=50, seed=0, labels={"fixed": "Fixed G"})
    assert table["informative_kept"].tolist() == [0.5, 0.5, 1.0]
    assert table["signal_per_rollout"].tolist() == [2 / 8, 2 / 8, 16 / 32]
    assert table["rollouts_per_prompt"].tolist() == [2, 4, 8]
    assert (table["informative_kept_low"] <= table["informative_kept"]).all()


def test_cross_fitting_is_seeded_and_every_prompt_is_replayed():
    pools = pools_of_record(_record(random.Random(0)), "aps", GRID)
    rules = rule_settings(GRID, {}, {}, "aps")
    first = replay_frontier(pools, rules, resplits=3, seed=5)[1]
    again = replay_frontier(pools, rules, resplits=3, seed=5)[1]
    other = replay_frontier(pools, rules, resplits=3, seed=6)[1]
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)  # calibrated rules see other folds
    assert (first[:, :, MEASURES.index("rollouts")] >= 2).all()


def test_every_registered_rule_is_replayed_at_its_sweep_and_settings_override_it():
    settings = rule_settings(GRID, {"esc": [2]}, {"signal": {"mixed_stop": 4}}, "aps")
    names = [name for name, _, _ in settings]
    assert set(names) == set(rule_names())
    assert [value for name, value, _ in settings if name == "esc"] == [2]
    assert [value for name, value, _ in settings if name == "fixed"] == GRID
    assert {rule.options["mixed_stop"] for name, _, rule in settings if name == "signal"} == {4}
    # C-GRPO's own delta is replayed, to pair every rule against, whatever the sweep.
    settings = rule_settings(GRID, {"conformal": [None, 0.2]}, {}, "aps", reference=0.35)
    assert [value for name, value, _ in settings if name == "conformal"] == [None, 0.2, 0.35]
    assert [value for name, value, _ in rule_settings(GRID, {}, {}, "aps") if name == "conformal"].count(None) == 1


def test_a_rule_is_compared_with_cgrpo_at_equal_rollouts_by_interpolation():
    keys = [("conformal", None), ("fixed", 2), ("fixed", 8), ("esc", 4)]
    # Three prompts, all informative; C-GRPO draws 5 per prompt and keeps 2 of 3.
    measures = np.zeros((4, 3, len(MEASURES)))
    measures[..., MEASURES.index("informative")] = 1
    for s, (rollouts, kept) in enumerate([(5, [1, 1, 0]), (2, [0, 0, 0]), (8, [1, 1, 1]), (4, [1, 1, 1])]):
        measures[s, :, MEASURES.index("rollouts")] = rollouts
        measures[s, :, MEASURES.index("kept")] = kept
        measures[s, :, MEASURES.index("signal_rows")] = np.array(kept) * rollouts
    labels = {"conformal": "C-GRPO", "fixed": "Fixed G", "esc": "ESC"}
    table = frontier_at_reference(keys, measures, resamples=20, seed=0, labels=labels).set_index("rule")
    # Fixed G at 5 rollouts: halfway from 0 to 1 kept, minus C-GRPO's 2/3.
    assert table.loc["fixed", "informative_kept_at_equal_rollouts_diff"] == pytest.approx(0.5 - 2 / 3)
    # It keeps C-GRPO's 2/3 at 2 + 6 * 2/3 = 6 rollouts: one more than C-GRPO.
    assert table.loc["fixed", "rollouts_at_equal_kept_diff"] == pytest.approx(1.0)
    # ESC has one setting: nothing to interpolate, but its closest setting is compared as is.
    assert np.isnan(table.loc["esc", "informative_kept_at_equal_rollouts_diff"])
    assert table.loc["esc", "closest_rollouts_per_prompt_diff"] == -1
    assert table.loc["esc", "closest_informative_kept_diff"] == pytest.approx(1 / 3)


def test_run_replay_writes_the_tables_and_plot_and_refuses_a_record_without_samples(tmp_path):
    record = tmp_path / "base.json"
    record.write_text(json.dumps(_record(random.Random(1))))
    spec = {
        "records": [str(record)],
        "grid": GRID,
        "score": "aps",
        "resplits": 2,
        "seed": 0,
        "resamples": 30,
        "settings": {},
        "options": {},
        "plugins": [],
    }
    outputs = {name: str(tmp_path / f"{name}.csv") for name in ("table", "at_cgrpo")}
    outputs.update(table_md=str(tmp_path / "table.md"), at_cgrpo_md=str(tmp_path / "at.md"))
    outputs["plot"] = str(tmp_path / "replay.png")
    run_replay(spec, outputs)
    table = pd.read_csv(outputs["table"])
    assert table["model"].unique().tolist() == ["base"]
    assert set(table["rule"]) == set(rule_names())
    assert Path(outputs["plot"]).stat().st_size > 10_000
    assert "informative_kept" in Path(outputs["table_md"]).read_text()
    (tmp_path / "old.json").write_text(json.dumps({"run": "base"}))
    with pytest.raises(ValueError, match="keeps no samples"):
        run_replay({**spec, "records": [str(tmp_path / "old.json")]}, outputs)
    # Pools of 8 cannot be replayed to 16: the answers past the 8th were never drawn.
    with pytest.raises(ValueError, match="keeps 8 samples per prompt, fewer than the replay grid's largest budget 16"):
        run_replay({**spec, "grid": [*GRID, 16]}, outputs)
    # Paired against C-GRPO at the config's delta.
    run_replay({**spec, "reference": 0.35}, outputs)
    conformal = pd.read_csv(outputs["table"], dtype={"setting": str}).query("rule == 'conformal'")
    rollouts = conformal.set_index("setting")["rollouts_per_prompt"]
    assert rollouts["0.35"] != rollouts["auto"]
    assert (pd.read_csv(outputs["at_cgrpo"])["cgrpo_rollouts_per_prompt"] == rollouts["0.35"]).all()


def test_the_default_runs_frontier_holds_every_rule_and_fixed_g_at_every_budget():
    """The committed default run's replay (results/reference/replay.csv, `snakemake --cores 2`)."""
    table = pd.read_csv(REPO / "results" / "reference" / "replay.csv")
    settings = table.groupby("rule")["setting"].nunique(dropna=False)
    assert len(settings) >= 5 and (settings >= 3).sum() >= 4
    fixed = table[table["rule"] == "fixed"]
    assert sorted(fixed["rollouts_per_prompt"]) == [2, 4, 8, 16, 32]
    assert {"rule", "rollouts_per_prompt", "informative_kept"} <= set(table.columns)
    assert fixed.loc[fixed["rollouts_per_prompt"] == 32, "informative_kept"].item() == 1.0
    # Tied to the default config: its replayed models, re-splits and every registered rule.
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    replay = config.get("replay", {})
    assert set(table["model"]) == set(replay.get("models", ["base"]))
    assert set(table["resplits"]) == {replay.get("resplits", 10)}
    assert set(table["rule"]) == set(rule_names())
