"""The stopping rules: hand cases of each rule, their checks, and tiny-model runs of the calibration-free ones."""

from __future__ import annotations

import json
import random

import pytest
from datasets import Dataset

from cgrpo import CGRPOConfig, CGRPOTrainer
from cgrpo.calibration import Thresholds, should_stop
from cgrpo.stopping import get_rule, stopping_budget, top_share
from cgrpo.trainer_state import CGRPOState

GRID = [2, 4, 8]


def rule_stops(name, score, k, outcomes, *, qhat_k=None, rng=None, rewards=None, fit=None, **options):
    """One decision of the registered rule ``name`` with ``options`` (the conformal rule's fit from ``qhat_k``)."""
    rule = get_rule(name)(score, **options)
    if qhat_k is not None:
        fit = Thresholds(delta=0.1, qhat={k: qhat_k}, solve_rate=1.0, n_calibration=10)
    return rule.stops(k, outcomes[:k], rewards, fit, rng)


def free_stopping_budgets(name, score, grid, prompts, **options):
    rule = get_rule(name)(score, **options)
    return [stopping_budget(rule, None, grid, outcomes, None, random.Random(0)) for outcomes in prompts]


# ---------------------------------------------------------------------- hand cases
@pytest.mark.parametrize(
    ("outcomes", "k", "share"),
    [
        (["a", "a", "b", None], 4, 0.5),
        ([None, None], 2, 0.0),
        (["a", None], 2, 0.5),
        (["a", "b", "c", "c"], 2, 0.5),
        (["a", "b", "c", "c"], 4, 0.5),
        (["7", "7", "7", "7"], 4, 1.0),
    ],
)
def test_top_share_counts_failed_extractions_in_the_denominator_only(outcomes, k, share):
    assert top_share("aps", k, outcomes) == share


def test_top_share_of_execution_outcomes_is_the_share_of_passes():
    assert top_share("first_success", 4, [True, False, True, True, False]) == 0.75
    assert top_share("pass_rate", 2, [False, False]) == 0.0
    with pytest.raises(ValueError, match="k must lie in"):
        top_share("aps", 3, ["a", "a"])
    with pytest.raises(ValueError, match="Unknown score"):
        top_share("bleu", 1, ["a"])


@pytest.mark.parametrize(
    ("outcomes", "k", "stops"),
    [
        (["a", "a"], 2, True),
        (["a", "b"], 2, False),
        (["a", None], 2, False),
        ([None, None], 2, False),
        (["a", "a", "a", "b"], 2, True),
        (["a", "a", "a", "b"], 4, False),
    ],
)
def test_unanimous_needs_one_extracted_answer_for_all_draws(outcomes, k, stops):
    assert rule_stops("unanimous", "aps", k, outcomes) is stops


@pytest.mark.parametrize(
    ("passes", "stops"),
    [([True, True], True), ([True, False], False), ([False, False], False)],
)
def test_unanimous_execution_outcomes_stop_only_when_all_pass(passes, stops):
    for score in ("first_success", "pass_rate"):
        assert rule_stops("unanimous", score, 2, passes) is stops


@pytest.mark.parametrize(
    ("outcomes", "k", "tau", "stops"),
    [
        (["a", "a", "a", "b"], 4, 0.75, True),  # 3 of 4
        (["a", "a", "b", "c"], 4, 0.75, False),  # 2 of 4
        (["a", "a", "a", None], 4, 0.75, True),  # a failure is one vote against, no more
        (["a", "a", None, None], 4, 0.75, False),
        (["a", "b"], 2, 0.75, False),  # any tau above 1/2 stops k = 2 only on agreement
        (["a", "b"], 2, 0.5, True),  # a tie reaches 1/2
        ([None, None], 2, 0.5, False),  # failures never form the most frequent answer
        (["a"] * 6 + ["b", "c"], 8, 0.75, True),
        (["a"] * 5 + ["b"] * 3, 8, 0.75, False),
    ],
)
def test_share_stops_once_the_most_frequent_answer_holds_tau(outcomes, k, tau, stops):
    assert rule_stops("share", "aps", k, outcomes, tau=tau) is stops


def test_share_of_passes_for_the_execution_scores():
    assert rule_stops("share", "first_success", 4, [False, True, True, True], tau=0.75)
    assert not rule_stops("share", "first_success", 4, [False, True, False, True], tau=0.75)
    assert not rule_stops("share", "pass_rate", 2, [False, False], tau=0.5)


def test_share_at_tau_one_is_unanimous_and_neither_rule_draws_random_numbers():
    rng = random.Random(0)
    answers = ["a", "b", None]
    for _ in range(200):
        outcomes = [rng.choice(answers) for _ in range(8)]
        for k in GRID:
            assert rule_stops("share", "aps", k, outcomes, tau=1.0) == rule_stops("unanimous", "aps", k, outcomes)
    untouched = random.Random(1)
    state = untouched.getstate()
    rule_stops("share", "aps", 2, ["a", "b"], tau=0.5, rng=untouched)
    assert untouched.getstate() == state


def test_conformal_rule_is_should_stop_with_the_budgets_threshold():
    outcomes = ["a", "a", "b", "a"]
    for qhat in (0.4, 0.7, 1.0):
        assert rule_stops("conformal", "aps", 4, outcomes, qhat_k=qhat, rng=random.Random(3)) == should_stop(
            "aps", 4, qhat, outcomes, random.Random(3)
        )
    with pytest.raises(ValueError, match="Unknown stopping rule 'majority'"):
        rule_stops("majority", "aps", 2, outcomes)
    with pytest.raises(ValueError, match="has no option window; its options are: tau"):
        get_rule("share")("aps", window=2)


def test_free_stopping_budgets_replays_the_rule_on_prefixes():
    prompts = [
        ["a"] * 8,
        ["a", "b", "a", "a", "a", "a", "a", "a"],
        ["a", "b", "c", "d", "a", "a", "a", "a"],
        [None] * 8,
    ]
    assert free_stopping_budgets("unanimous", "aps", GRID, prompts) == [2, 8, 8, 8]
    assert free_stopping_budgets("share", "aps", GRID, prompts, tau=0.75) == [2, 4, 8, 8]
    with pytest.raises(ValueError, match="largest budget is 8"):
        free_stopping_budgets("share", "aps", GRID, [["a"] * 4])


def test_state_without_thresholds_round_trips_through_json():
    state = CGRPOState(stopping_rng=random.Random(5))
    state.totals["train_rollouts"] = 12.0
    state.budget_histogram.update([2, 2, 8])
    restored = CGRPOState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert restored.thresholds is None and restored.calibration_history == []
    assert restored.to_dict() == state.to_dict()


# ---------------------------------------------------------------------- options
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"stopping_rule": "majority"}, "stopping_rule must be one of conformal, unanimous, share, esc"),
        ({"stopping_rule": "esc", "stopping_options": {"window": 1}}, "window must be an integer of at least 2"),
        ({"stopping_rule": "adaptive", "stopping_options": {"tau": 0.9}}, "has no option tau"),
        ({"stopping_rule": "share", "stop_share": 0.0}, r"stop_share must lie in \(0, 1\]"),
        ({"stop_share": 1.5}, r"stop_share must lie in \(0, 1\]"),
        ({"calibration_holdout": -1}, "calibration_holdout must be a non-negative integer"),
        ({"stopping_rule": "unanimous", "calibration_holdout": 4}, "calibration_holdout checks conformal thresholds"),
    ],
)
def test_invalid_stopping_options_raise(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        _config(tmp_path, **overrides)


def test_calibration_set_is_required_by_the_conformal_rule_only(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="calibration_dataset is required by stopping_rule='conformal'"):
        _trainer(tiny_model_dir, tmp_path, stopping_rule="conformal")
    given = Thresholds(delta=0.2, qhat={k: 1.0 for k in GRID}, solve_rate=1.0, n_calibration=4)
    with pytest.raises(ValueError, match="stopping_rule='share' uses no thresholds; drop initial_thresholds"):
        _trainer(tiny_model_dir, tmp_path, stopping_rule="share", initial_thresholds=given)
    trainer = _trainer(tiny_model_dir, tmp_path, stopping_rule="unanimous")
    with pytest.raises(ValueError, match="uses no calibration"):
        trainer.score_calibration_set()


# ---------------------------------------------------------------------- tiny-model runs
# Each prompt's verifier outcomes, in draw order: a pass is "1".
PATTERNS = {0: "11111111", 1: "10111111", 2: "00000000", 3: "11000000"}
WHERE = {"unanimous": {0: 2, 1: 8, 2: 8, 3: 2}, "share": {0: 2, 1: 4, 2: 8, 3: 2}}


class PatternVerifier:
    """Passes each prompt's completions by its pattern, continuing where its previous call stopped."""

    def __init__(self):
        self.drawn: dict[int, int] = {}

    def __call__(self, completions, index, **kwargs):
        start = self.drawn.get(index, 0)
        self.drawn[index] = start + len(completions)
        return [PATTERNS[index][(start + j) % 8] == "1" for j in range(len(completions))]


def _config(tmp_path, **overrides) -> CGRPOConfig:
    options = {
        "output_dir": str(tmp_path),
        "use_cpu": True,
        "bf16": False,
        "budget_grid": GRID,
        "per_device_train_batch_size": 32,
        "max_completion_length": 4,
        "max_steps": 1,
        "logging_steps": 1,
        "report_to": [],
        "save_strategy": "no",
        "seed": 0,
        "score": "first_success",
    }
    return CGRPOConfig(**{**options, **overrides})


def _trainer(model_dir, tmp_path, verifier=None, initial_thresholds=None, **overrides) -> CGRPOTrainer:
    data = Dataset.from_dict({"prompt": [f"{i}+{i}=" for i in PATTERNS], "index": list(PATTERNS)})
    return CGRPOTrainer(
        model=model_dir,
        reward_funcs=lambda completions, **kw: [float(len(c) % 2) for c in completions],
        args=_config(tmp_path, **overrides),
        train_dataset=data,
        verifier=verifier or PatternVerifier(),
        initial_thresholds=initial_thresholds,
    )


@pytest.mark.parametrize("rule", ["unanimous", "share"])
def test_calibration_free_rules_stop_where_the_rule_says_and_never_calibrate(tiny_model_dir, tmp_path, rule):
    verifier = PatternVerifier()
    trainer = _trainer(tiny_model_dir, tmp_path, verifier=verifier, stopping_rule=rule)
    trainer.train()
    # One generation batch of all four prompts: each drew exactly the budget its rule stops it at, and nothing else
    # (a calibration would have drawn max(budget_grid) more for calibration prompts).
    assert verifier.drawn == WHERE[rule]
    assert trainer.budget_histogram == {k: list(WHERE[rule].values()).count(k) for k in set(WHERE[rule].values())}
    assert trainer.thresholds is None and trainer.calibration_history == []
    assert trainer.cgrpo_totals["calibration_rollouts"] == trainer.cgrpo_totals["calibration_s"] == 0
    assert trainer.cgrpo_totals["train_rollouts"] == sum(WHERE[rule].values())
    logged = next(entry for entry in trainer.state.log_history if "cgrpo/mean_k" in entry)
    assert logged["cgrpo/mean_k"] == sum(WHERE[rule].values()) / 4
    assert not any(key.startswith(("cgrpo/qhat", "cgrpo/delta", "cgrpo/calibration")) for key in logged)


def test_unanimous_answers_stop_at_the_first_budget_with_the_aps_score(tiny_model_dir, tmp_path):
    trainer = CGRPOTrainer(
        model=tiny_model_dir,
        reward_funcs=lambda completions, **kw: [1.0] * len(completions),
        args=_config(tmp_path, score="aps", stopping_rule="unanimous"),
        train_dataset=Dataset.from_dict({"prompt": ["1+1=", "2+2=", "3+3=", "4+4="]}),
        answer_extractor=lambda text: "2",
    )
    trainer.train()
    assert trainer.budget_histogram == {2: 4} and trainer.calibration_history == []
