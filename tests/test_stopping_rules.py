"""The stopping-rule registry: every registered rule's contract, the new rules' hand cases, the signal rule's
risk-control guarantee, skipping the budgets where a rule cannot stop, and a rule added in a test running in the
trainer, the replay and a pipeline dry run."""

from __future__ import annotations

import json
import random
import textwrap

import pytest
import yaml
from datasets import Dataset

from cgrpo import CGRPOConfig, CGRPOTrainer
from cgrpo.calibration import Thresholds
from cgrpo.stopping import (
    RULES,
    Pools,
    StoppingRule,
    correct_flags,
    get_rule,
    next_budget,
    register,
    rule_names,
    sampling_path,
    stopping_budget,
)
from cgrpo.stopping.signal import reward_pattern

GRID = [2, 4, 8, 16, 32]


def _pools(rng: random.Random, prompts: int, score: str = "aps") -> Pools:
    """Pools of answers drawn from per-prompt solve rates spread over [0, 1]; the gold answer is "g"."""
    outcomes = []
    for _ in range(prompts):
        rate = rng.random()
        if score == "aps":
            outcomes.append([("g" if rng.random() < rate else rng.choice(["a", "b", None])) for _ in range(GRID[-1])])
        else:
            outcomes.append([rng.random() < rate for _ in range(GRID[-1])])
    golds = ["g"] * prompts if score == "aps" else None
    rewards = [correct_flags(score, row, "g") for row in outcomes]
    return Pools(score, GRID, outcomes, rewards, golds, random.Random(1))


# ---------------------------------------------------------------------- every registered rule
def test_the_registry_holds_the_six_rules_and_the_reference_line_in_order():
    assert rule_names()[:7] == ["conformal", "unanimous", "share", "esc", "adaptive", "signal", "fixed"]
    assert {name for name in rule_names() if get_rule(name).calibrated} >= {"conformal", "signal"}


@pytest.mark.parametrize("name", sorted(RULES))
@pytest.mark.parametrize("score", ["aps", "first_success"])
def test_every_rule_decides_on_prefixes_and_its_fit_survives_json(name, score):
    cls = get_rule(name)
    pools = _pools(random.Random(0), 40, score)
    for value in cls.sweep_for(GRID) or [None]:
        rule = cls(score, **({} if cls.parameter is None else {cls.parameter: value}))
        fit = rule.fit(pools) if cls.calibrated else None
        if cls.calibrated:
            restored = rule.fit_from_dict(json.loads(json.dumps(rule.fit_to_dict(fit))))
            assert rule.fit_to_dict(restored) == rule.fit_to_dict(fit)
        budgets = [
            stopping_budget(rule, fit, GRID, row, rewards, random.Random(2))
            for row, rewards in zip(pools.outcomes, pools.rewards)
        ]
        assert set(budgets) <= set(GRID)


def _rules_at_every_setting(score: str, pools: Pools):
    """Every registered rule at every setting of its sweep, with its fit on ``pools`` where it is calibrated."""
    for name in sorted(RULES):
        cls = get_rule(name)
        for value in cls.sweep_for(GRID) or [None]:
            rule = cls(score, **({} if cls.parameter is None else {cls.parameter: value}))
            yield rule, rule.fit(pools) if cls.calibrated else None


@pytest.mark.parametrize("score", ["aps", "first_success", "pass_rate"])
def test_skipping_impossible_budgets_stops_every_prompt_where_stepping_through_the_grid_does(score):
    """The exactness of `skip_impossible_budgets`: on the same outcomes every rule, at every setting, stops at the same
    budget whether it visits every budget or draws straight to the next where it could stop, in no more rounds."""
    pools = _pools(random.Random(0), 60, score)
    fresh = _pools(random.Random(1), 300, score)
    saved = 0
    for rule, fit in _rules_at_every_setting(score, pools):
        for row, rewards in zip(fresh.outcomes, fresh.rewards):
            rewards = rewards if rule.needs_rewards else None
            stepwise = sampling_path(rule, fit, GRID, row, rewards, random.Random(2), skip=False)
            skipping = sampling_path(rule, fit, GRID, row, rewards, random.Random(2))
            assert skipping[-1] == stepwise[-1] == stopping_budget(rule, fit, GRID, row, rewards, random.Random(2))
            assert set(skipping) <= set(stepwise)
            saved += len(stepwise) - len(skipping)
    assert saved > 0


def test_a_budget_is_skipped_only_where_no_draw_could_stop_the_prompt():
    unanimous, share = get_rule("unanimous")("aps"), get_rule("share")("aps", tau=0.75)
    # After a-b, unanimity is dead at every budget; 3 of 4 can still agree.
    assert next_budget(unanimous, None, GRID, ["a", "b"], None) == 32
    assert next_budget(share, None, GRID, ["a", "b"], None) == 4
    # qhat_4 = 0.875 needs 4 of 4 after a-b, impossible; 7 of 8 is not.
    thresholds = Thresholds(
        delta=0.3, qhat={2: 1.0, 4: 0.875, 8: 0.875, 16: 0.4, 32: 1.0}, solve_rate=0.9, n_calibration=8
    )
    conformal = get_rule("conformal")("aps")
    assert next_budget(conformal, thresholds, GRID, ["a", "b"], None) == 8
    assert next_budget(conformal, thresholds, GRID, ["a", "b", None, None], None) == 16
    assert next_budget(conformal, thresholds, GRID, [], None) == 2
    # The window rule forgets: after a-b, four new agreeing draws fill a window of 4 at 8, not at 4.
    esc = get_rule("esc")("aps", window=4)
    assert next_budget(esc, None, GRID, ["a", "b"], None) == 8
    assert next_budget(esc, None, GRID, ["a", "a"], None) == 4
    assert next_budget(get_rule("fixed")("aps", size=16), None, GRID, [], None) == 16
    # The signal rule: a mixed prefix waits for mixed_stop; a uniform one stops where its cell allows or once mixed.
    signal = get_rule("signal")("aps", delta=0.2, mixed_stop=16)
    fit = {
        "lambda": 0.3,
        "p_informative": {
            "2": {"correct": 0.5, "wrong": 0.5},
            "4": {"correct": 0.5, "wrong": 0.5},
            "8": {"correct": 0.2, "wrong": 0.9},
            "16": {"correct": 0.5, "wrong": 0.5},
        },
    }
    assert next_budget(signal, fit, GRID, ["g", "a"], [1.0, 0.0]) == 16
    assert next_budget(signal, fit, GRID, ["g", "g"], [1.0, 1.0]) == 8
    assert next_budget(signal, fit, GRID, ["a", "a"], [0.0, 0.0]) == 16
    # A rule that says nothing of where it could stop is stepped through the grid.
    assert next_budget(_TwoHits("aps"), None, GRID, ["a", "b"], None) == 4


class _TwoHits(StoppingRule):
    """Unregistered: stops once two draws agree, with the interface's default `could_stop`."""

    name = "twohitsunregistered"

    def stops(self, k, outcomes, rewards, fit, rng) -> bool:
        return len(outcomes) - len(set(outcomes)) >= 1


def test_an_uncalibrated_rule_refuses_to_fit_and_options_are_checked():
    with pytest.raises(ValueError, match="not calibrated; it has nothing to fit"):
        get_rule("esc")("aps").fit(_pools(random.Random(0), 4))
    with pytest.raises(ValueError, match="confidence must lie in"):
        get_rule("adaptive")("aps", confidence=0.4)
    with pytest.raises(ValueError, match="Unknown score"):
        get_rule("esc")("bleu")
    with pytest.raises(ValueError, match="registered already"):

        @register
        class Again(StoppingRule):
            name = "share"


# ---------------------------------------------------------------------- hand cases of the new rules
@pytest.mark.parametrize(
    ("outcomes", "k", "window", "stops"),
    [
        (["a", "b", "c", "c"], 4, 2, True),  # unanimity is dead after a-b, the window is not
        (["a", "b", "c", "c"], 4, 4, False),
        (["a", "a"], 2, 4, False),  # a budget below the window never stops
        (["a", "b", "a", "a", None, "a", "a", "a"], 8, 4, False),  # a failed extraction breaks agreement
        (["a", "b", "a", "a", "a", "a", "a", "a"], 8, 4, True),
    ],
)
def test_esc_stops_when_the_latest_window_agrees(outcomes, k, window, stops):
    assert get_rule("esc")("aps", window=window).stops(k, outcomes, None, None, None) is stops


def test_adaptive_consistency_uses_the_beta_posterior_of_the_two_leading_answers():
    rule = get_rule("adaptive")
    # Two agreeing answers: P(p1 > p2) under Beta(3, 1) is 1 - 0.5**3 = 0.875.
    assert rule("aps", confidence=0.87).stops(2, ["a", "a"], None, None, None)
    assert not rule("aps", confidence=0.88).stops(2, ["a", "a"], None, None, None)
    # Four a, no rival: 1 - 0.5**5 = 0.96875; with one rival b, Beta(5, 2) gives 0.890625.
    assert rule("aps", confidence=0.96).stops(4, ["a"] * 4, None, None, None)
    assert not rule("aps", confidence=0.9).stops(5, ["a", "a", "b", "a", "a"], None, None, None)
    assert not rule("aps", confidence=0.8).stops(4, [None] * 4, None, None, None)
    assert rule("first_success", confidence=0.8).stops(2, [True, True], None, None, None)
    assert not rule("first_success", confidence=0.8).stops(2, [False, False], None, None, None)


def test_fixed_stops_every_prompt_at_its_size():
    rule = get_rule("fixed")("aps", size=8)
    assert [stopping_budget(rule, None, GRID, ["a"] * 32, None, random.Random(0))] == [8]
    assert get_rule("fixed").sweep_for([8, 2, 4]) == [2, 4, 8]


# ---------------------------------------------------------------------- the signal rule
def test_reward_patterns():
    assert [reward_pattern(r) for r in ([1, 1], [0, 0], [1, 0], [])] == ["correct", "wrong", "mixed", "mixed"]


def test_signal_rule_stops_mixed_groups_at_mixed_stop_and_uniform_ones_by_the_fit():
    rule = get_rule("signal")("aps", delta=0.2, mixed_stop=4)
    fit = {"lambda": 0.3, "p_informative": {"2": {"correct": 0.2, "wrong": 0.5}, "4": {"correct": 0.1, "wrong": 0.1}}}
    assert not rule.stops(2, ["a", "b"], [1.0, 0.0], fit, None)  # mixed, below mixed_stop
    assert rule.stops(4, ["a", "b", "a", "a"], [1.0, 0.0, 1.0, 1.0], fit, None)
    assert rule.stops(2, ["g", "g"], [1.0, 1.0], fit, None)  # all correct: 0.2 <= 0.3
    assert not rule.stops(2, ["a", "b"], [0.0, 0.0], fit, None)  # all wrong: 0.5 > 0.3
    assert rule.stops(4, ["a"] * 4, [0.0] * 4, fit, None)  # hopeless so far: 0.1 <= 0.3


def test_signal_rule_without_enough_informative_prompts_never_stops_a_uniform_group():
    # 1 / (n + 1) > delta for n = 3 informative control prompts: no level is certified.
    rewards = [[1.0] * 32, [0.0] * 32, [1.0] + [0.0] * 31, [0.0, 1.0] * 16, [1.0, 0.0] * 16, [1.0] * 31 + [0.0]]
    pools = Pools("first_success", GRID, [[bool(r) for r in row] for row in rewards], rewards, None, random.Random(0))
    fit = get_rule("signal")("first_success", delta=0.2).fit(pools)
    assert fit["lambda"] == -1.0 and fit["n_informative"] == 3


def test_signal_rule_loses_at_most_delta_of_the_informative_prompts_on_fresh_prompts():
    """Conformal risk control, checked by simulation: over many calibration sets, the share of fresh informative
    prompts stopped on a uniform group stays below delta (its expectation is at most delta)."""
    delta, losses, informative = 0.2, 0, 0
    rng = random.Random(0)
    for _trial in range(60):
        rule = get_rule("signal")("aps", delta=delta, mixed_stop=32)
        fit = rule.fit(_pools(rng, 80))
        fresh = _pools(rng, 40)
        for row, rewards in zip(fresh.outcomes, fresh.rewards):
            if reward_pattern(rewards) != "mixed":
                continue
            informative += 1
            k = stopping_budget(rule, fit, GRID, row, rewards, rng)
            losses += reward_pattern(rewards[:k]) != "mixed"
    assert informative > 500
    assert losses / informative <= delta
    # The rule is not vacuous: it does stop informative prompts early at this level.
    assert losses > 0


# ---------------------------------------------------------------------- a rule added by a user
def _config(tmp_path, **rule) -> CGRPOConfig:
    """One step of one generation batch on the grid 2-4-8, scored by a verifier, with the stopping rule `rule`."""
    return CGRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        budget_grid=[2, 4, 8],
        per_device_train_batch_size=16,
        max_completion_length=4,
        max_steps=1,
        report_to=[],
        save_strategy="no",
        score="first_success",
        **rule,
    )


PLUGIN = textwrap.dedent(
    '''
    """A stopping rule registered from outside the package: stop once two passes (or two "7"s) were drawn."""
    from cgrpo.stopping import StoppingRule, register


    @register
    class TwoHits(StoppingRule):
        name = "twohits"
        label = "Two hits"
        parameter = "hits"
        sweep = (1, 2, 3)
        defaults = {"hits": 2}

        def stops(self, k, outcomes, rewards, fit, rng):
            hits = sum(1 for o in outcomes[:k] if o is True or o == "7")
            return hits >= self.options["hits"]
    '''
)


@pytest.fixture
def plugin_rule(tmp_path, monkeypatch):
    """The module above on sys.path, imported (registered), and unregistered afterwards."""
    import importlib

    (tmp_path / "twohits_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{__import__('os').environ.get('PYTHONPATH', '')}")
    module = importlib.import_module("twohits_plugin")
    yield module
    RULES.pop("twohits", None)
    from cgrpo.pipeline.configuration import methods

    methods.METHODS.pop("twohits", None)
    __import__("sys").modules.pop("twohits_plugin", None)


def test_a_rule_added_in_a_test_runs_in_the_trainer(plugin_rule, tiny_model_dir, tmp_path):
    seen = {}

    def verifier(completions, index, **kwargs):
        start = seen.get(index, 0)
        seen[index] = start + len(completions)
        # Prompt 0 passes every draw, prompt 1 none: the first stops at 2, the second runs the grid.
        return [index == 0] * len(completions)

    args = _config(tmp_path, stopping_rule="twohits", stopping_options={"hits": 2})
    trainer = CGRPOTrainer(
        model=tiny_model_dir,
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["1+1=", "2+2="], "index": [0, 1]}),
        verifier=verifier,
    )
    trainer.train()
    assert seen == {0: 2, 1: 8}
    assert trainer.budget_histogram == {2: 1, 8: 1}


def test_a_rule_added_in_a_test_runs_in_the_replay(plugin_rule):
    from cgrpo.pipeline.analysis.replay import replay_frontier, rule_settings

    pools = _pools(random.Random(3), 12, "first_success")
    rules = rule_settings(GRID, {}, {}, "first_success")
    assert [(name, value) for name, value, _ in rules if name == "twohits"] == [
        ("twohits", 1),
        ("twohits", 2),
        ("twohits", 3),
    ]
    keys, measures = replay_frontier(pools, rules, resplits=2, seed=0)
    rollouts = {key: measures[i, :, 0].mean() for i, key in enumerate(keys)}
    # More hits needed, more rollouts drawn.
    assert rollouts[("twohits", 1)] <= rollouts[("twohits", 2)] <= rollouts[("twohits", 3)]


def test_a_rule_added_in_a_test_runs_in_a_pipeline_dry_run(plugin_rule, tmp_path):
    from test_workflow import job_counts, snakemake, workdir_like_repo

    (tmp_path / "work").mkdir()
    workdir = workdir_like_repo(tmp_path / "work")
    override = tmp_path / "plugin.yaml"
    override.write_text(
        yaml.safe_dump(
            {
                "plugins": ["twohits_plugin"],
                "cgrpo": {"ablations": {"rules": ["twohits"], "settings": {"twohits": [3]}}},
            }
        )
    )
    config = workdir / "config" / "config.yaml"
    result = snakemake(workdir, "-n", "--cores", "1", "--configfile", str(config), str(override))
    assert result.returncode == 0, result.stdout
    assert "twohits_s0_g2-4-8-16-32_t3" in result.stdout
    counts = job_counts(result.stdout)
    seeds = len(yaml.safe_load(config.read_text())["seeds"])
    grpo = len(yaml.safe_load(config.read_text())["grpo"]["num_generations"])
    assert counts["train"] == seeds * (1 + grpo) and counts["replay"] == 1
    missing = tmp_path / "missing.yaml"
    missing.write_text(yaml.safe_dump({"cgrpo": {"ablations": {"rules": ["twohits"]}}}))
    result = snakemake(workdir, "-n", "--cores", "1", "--configfile", str(config), str(missing))
    assert result.returncode != 0
    assert "names 'twohits', which is no registered stopping rule" in result.stdout


def test_the_signal_rule_calibrates_in_the_trainer_and_decides_on_rewards(tiny_model_dir, tmp_path):
    """A calibrated rule other than the conformal one: the trainer samples its pools, fits it, logs the calibration
    and keeps the fit in its checkpointable state; stops follow the rewards of the training prompts."""

    # Even calibration prompts are solved on every draw, odd ones on alternate draws (informative, mixed from k = 2).
    # Training prompt 100 is solved on every draw; 101 never.
    def verifier(completions, index, **kwargs):
        if index >= 100:
            return [index == 100] * len(completions)
        return [index % 2 == 0 or j % 2 == 0 for j in range(len(completions))]

    args = _config(
        tmp_path, stopping_rule="signal", stopping_options={"delta": 0.3, "mixed_stop": 2}, recalibrate_every=0
    )
    calibration = Dataset.from_dict({"prompt": [f"{i}-{i}=" for i in range(16)], "index": list(range(16))})
    trainer = CGRPOTrainer(
        model=tiny_model_dir,
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["1+1=", "2+2="], "index": [100, 101]}),
        calibration_dataset=calibration,
        verifier=verifier,
    )
    trainer.train()
    fit = trainer.stopping_fit
    assert trainer.thresholds is None and fit is trainer.cgrpo_state.rule_fit
    assert fit["n_estimate"] == 8 and fit["n_control"] == 8 and fit["n_informative"] == 4
    # The 4 estimate prompts all correct at 2 were never informative: (0 + 1) / (4 + 2).
    assert fit["p_informative"]["2"]["correct"] == pytest.approx(1 / 6)
    # The informative control prompts stop mixed at 2 (mixed_stop), so none is lost: (0 + 1) / 5 <= 0.3 certifies
    # every candidate, up to the unseen cells' 1/2, and both training prompts stop at 2.
    assert fit["lambda"] == 0.5
    assert trainer.budget_histogram == {2: 2}
    assert trainer.calibration_history[0]["lambda"] == fit["lambda"]
    assert trainer.cgrpo_totals["calibration_rollouts"] == 16 * 8
    restored = type(trainer.cgrpo_state).from_dict(json.loads(json.dumps(trainer.cgrpo_state.to_dict())))
    assert restored.rule_fit == fit and restored.calibration_history == trainer.calibration_history
