"""Tests of the evaluation metrics (accuracy, coverage, costs, statistics, compute matching) and of the dynamic-k
replay, on hand-built cases whose answers are derived in comments."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from cgrpo import calibration, costs
from cgrpo.pipeline.analysis import matching
from cgrpo.pipeline.metrics import accuracy, coverage, statistics

# --------------------------------------------------------------------------- #
# Shared hand-built data
# --------------------------------------------------------------------------- #

# Four math prompts, K = 8 samples each, already extracted.
GOLDS = ["4", "7", "1", "5"]
ANSWERS = [
    ["4"] * 8,  # P1: unanimous and right
    ["7", "3", "7", "7", "7", "7", "7", "7"],  # P2: 7 right out of 8, tie at k=2
    ["2", "2", "1", None, "1", "1", "1", "1"],  # P3: wrong early, right late, one failed
    [None] * 8,  # P4: every extraction failed
]
# Correct per sample: P1 8/8, P2 7/8, P3 5/8, P4 0/8.

# Four code prompts, K = 8 verifier outcomes each.
T, F = True, False
PASSES = [
    [T, F, F, F, F, F, F, F],  # A: first pass at position 1
    [F, F, T, F, F, F, F, F],  # B: first pass at position 3
    [F, T, F, F, F, F, F, F],  # C: first pass at position 2
    [F] * 8,  # D: never passes
]
GRID = [2, 4, 8]


# --------------------------------------------------------------------------- #
# 1. Accuracy
# --------------------------------------------------------------------------- #


def test_is_failed():
    assert accuracy.is_failed(None) and accuracy.is_failed("")
    assert not accuracy.is_failed("0") and not accuracy.is_failed(" ")


def test_majority_answer_basic_and_prefix():
    assert accuracy.majority_answer(ANSWERS[0], 2) == "4"
    # P3 first 4 = ["2","2","1",None] -> "2" (2 votes vs 1); all 8 -> "1" (5 vs 2).
    assert accuracy.majority_answer(ANSWERS[2], 4) == "2"
    assert accuracy.majority_answer(ANSWERS[2], 8) == "1"


def test_majority_ties_broken_by_first_appearance():
    assert accuracy.majority_answer(["7", "3"], 2) == "7"
    assert accuracy.majority_answer(["3", "7"], 2) == "3"
    # "b" and "a" both have 2 votes; "b" appeared first.
    assert accuracy.majority_answer(["b", "a", "a", "b", "c"], 5) == "b"


def test_majority_failed_extractions_never_win():
    # Three failures outnumber the single "x", but failures never win.
    assert accuracy.majority_answer([None, "", None, "x"], 4) == "x"
    assert accuracy.majority_answer([None, "", None], 3) is None
    # Only the first k count: "x" is at position 4.
    assert accuracy.majority_answer([None, "", None, "x"], 3) is None


def test_majority_answer_rejects_bad_k():
    with pytest.raises(ValueError):
        accuracy.majority_answer(["a", "b"], 3)
    with pytest.raises(ValueError):
        accuracy.majority_answer(["a", "b"], 0)


def test_maj_at_k_hand_case():
    # k=2: P1 "4" ok; P2 tie 7/3 -> "7" ok; P3 "2" wrong; P4 None wrong -> 2/4.
    assert accuracy.maj_at_k(ANSWERS, GOLDS, 2) == 0.5
    # k=4: P3 still "2" -> 2/4.
    assert accuracy.maj_at_k(ANSWERS, GOLDS, 4) == 0.5
    # k=8: P3 becomes "1" -> 3/4.
    assert accuracy.maj_at_k(ANSWERS, GOLDS, 8) == 0.75


def test_maj_at_k_errors():
    with pytest.raises(ValueError):
        accuracy.maj_at_k(ANSWERS, GOLDS[:3], 2)
    with pytest.raises(ValueError):
        accuracy.maj_at_k([], [], 2)
    with pytest.raises(ValueError):
        accuracy.maj_at_k([["a", "a"]], [None], 2)


def test_correct_flags():
    assert accuracy.correct_flags(["1", None, "", "2", "1"], "1") == [True, False, False, False, True]
    with pytest.raises(ValueError):
        accuracy.correct_flags(["1"], "")


@pytest.mark.parametrize("n", range(1, 21))
def test_pass_at_k_matches_combinatorial_formula(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            expected = 1.0 - math.comb(n - c, k) / math.comb(n, k)
            assert accuracy.pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_large_n_is_stable():
    for n, c, k in [(500, 3, 50), (1000, 1, 1), (2000, 17, 100)]:
        expected = 1.0 - math.comb(n - c, k) / math.comb(n, k)
        assert accuracy.pass_at_k(n, c, k) == pytest.approx(expected, rel=1e-10)


def test_pass_at_k_edge_values():
    assert accuracy.pass_at_k(8, 0, 4) == 0.0
    assert accuracy.pass_at_k(8, 8, 1) == 1.0
    assert accuracy.pass_at_k(8, 5, 4) == 1.0  # n - c = 3 < k: every 4-subset has a hit
    assert accuracy.pass_at_k(8, 2, 1) == pytest.approx(0.25)  # pass@1 = c / n


@pytest.mark.parametrize("n,c,k", [(0, 0, 1), (4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5), (4.0, 2, 1)])
def test_pass_at_k_errors(n, c, k):
    with pytest.raises(ValueError):
        accuracy.pass_at_k(n, c, k)


def test_mean_pass_at_k_and_mean_accuracy_hand_case():
    correct = [accuracy.correct_flags(a, g) for a, g in zip(ANSWERS, GOLDS)]
    assert [sum(f) for f in correct] == [8, 7, 5, 0]
    # pass@1 = mean(c/n) = (8/8 + 7/8 + 5/8 + 0/8) / 4 = 20/32 = 0.625.
    assert accuracy.mean_pass_at_k(correct, 1) == pytest.approx(0.625)
    assert accuracy.mean_accuracy(correct) == pytest.approx(0.625)
    # pass@2: P1 1; P2 n-c=1<2 -> 1; P3 1 - C(3,2)/C(8,2) = 1 - 3/28 = 25/28; P4 0.
    # Mean = (2 + 25/28) / 4 = 81/112.
    assert accuracy.mean_pass_at_k(correct, 2) == pytest.approx(81 / 112)


def test_mean_accuracy_weights_prompts_equally():
    # Prompt means 1/2 and 1/1 -> 0.75 (pooled would be 2/3).
    assert accuracy.mean_accuracy([[True, False], [True]]) == pytest.approx(0.75)
    with pytest.raises(ValueError):
        accuracy.mean_accuracy([[True], []])
    with pytest.raises(ValueError):
        accuracy.mean_accuracy([])


def test_greedy_accuracy():
    # "4" right, None wrong, "" wrong, "5" right -> 2/4.
    assert accuracy.greedy_accuracy(["4", None, "", "5"], GOLDS) == 0.5
    with pytest.raises(ValueError):
        accuracy.greedy_accuracy(["4"], GOLDS)


# --------------------------------------------------------------------------- #
# 2. Dynamic k
# --------------------------------------------------------------------------- #


def test_dynamic_k_execution_hand_case():
    # first_success score at k is j*/k (1.0 without a pass); stop when a pass
    # exists in the first k and the score <= qhat_k = 0.5.
    # A: k=2 score 1/2 -> stop at 2.
    # B: k=2 no pass; k=4 score 3/4 > .5; k=8 score 3/8 -> stop at 8.
    # C: k=2 score 2/2 > .5; k=4 score 2/4 -> stop at 4.
    # D: never passes -> max(grid) = 8.
    qhat = {2: 0.5, 4: 0.5, 8: 0.5}
    assert calibration.stopping_budgets("first_success", GRID, qhat, PASSES, None) == [2, 8, 4, 8]
    summary = accuracy.dynamic_k_summary("first_success", GRID, qhat, PASSES, None)
    # Pass among first chosen k: A yes, B yes, C yes, D no -> 3/4; mean k = 22/4.
    assert summary["accuracy"] == 0.75
    assert summary["mean_k"] == 5.5
    assert summary["histogram"] == {2: 1, 4: 1, 8: 2}
    assert summary["chosen_k"] == [2, 8, 4, 8]
    assert summary["n_prompts"] == 4


def test_dynamic_k_aps_hand_case():
    # With qhat = 0.75 > 1/2 a singleton needs one answer holding >= 75% of
    # the first k, so random tie-breaks cannot change the outcome.
    # P1: k=2 "4" x2 -> stop 2.  P2: k=2 "7","3" -> no; k=4 "7" x3 -> stop 4.
    # P3: k=2 "2" x2 -> stop 2 (confidently wrong).  P4: nothing extracted -> 8.
    qhat = {2: 0.75, 4: 0.75, 8: 0.75}
    summary = accuracy.dynamic_k_summary("aps", GRID, qhat, ANSWERS, random.Random(0), golds=GOLDS)
    assert summary["chosen_k"] == [2, 4, 2, 8]
    # Majority at chosen k: P1 "4" ok, P2 "7" ok, P3 "2" wrong, P4 None wrong.
    assert summary["accuracy"] == 0.5
    assert summary["mean_k"] == 4.0  # (2 + 4 + 2 + 8) / 4
    assert summary["histogram"] == {2: 2, 4: 1, 8: 1}


def test_dynamic_k_aps_failed_extractions_do_not_stop_early():
    # k=2: "9" is alone in the set but holds only 1/2 < 0.75 -> continue;
    # k=4: "9" holds 3/4 -> stop at 4.
    answers = [["9", None, "9", "9", "9", "9", "9", "9"]]
    qhat = {2: 0.75, 4: 0.75, 8: 0.75}
    assert calibration.stopping_budgets("aps", GRID, qhat, answers, random.Random(0)) == [4]


def test_dynamic_k_always_agree_stops_at_first_budget():
    grid = [2, 4, 8, 16, 32]
    qhat = {k: 1.0 for k in grid}
    agree = [["x"] * 32, ["y"] * 32]
    assert calibration.stopping_budgets("aps", grid, qhat, agree, random.Random(1)) == [2, 2]
    all_pass = [[True] * 32] * 3
    # first_success = 1/2 <= 0.5 at k=2.
    assert calibration.stopping_budgets("first_success", grid, {k: 0.5 for k in grid}, all_pass, None) == [2, 2, 2]
    # pass_rate = 1 - 2/2 = 0 <= 0 at k=2.
    assert calibration.stopping_budgets("pass_rate", grid, {k: 0.0 for k in grid}, all_pass, None) == [2, 2, 2]


def test_dynamic_k_all_failed_goes_to_max():
    grid = [2, 4, 8, 16, 32]
    qhat = {k: 1.0 for k in grid}
    failed = [[None] * 32, [""] * 32]
    assert calibration.stopping_budgets("aps", grid, qhat, failed, random.Random(2)) == [32, 32]
    # Even with qhat = 1 an all-fail prefix must not stop.
    for score in ("first_success", "pass_rate"):
        assert calibration.stopping_budgets(score, grid, qhat, [[False] * 32], None) == [32]
    summary = accuracy.dynamic_k_summary("first_success", grid, qhat, [[False] * 32], None)
    assert summary["histogram"] == {2: 0, 4: 0, 8: 0, 16: 0, 32: 1}
    assert summary["accuracy"] == 0.0


def test_dynamic_k_is_reproducible_with_seeded_rng():
    # qhat = 0.5 makes 1:1 ties depend on the random tie-break.
    gen = random.Random(123)
    answers = [[gen.choice("ab") for _ in range(8)] for _ in range(30)]
    qhat = {2: 0.5, 4: 0.5, 8: 0.5}
    first = calibration.stopping_budgets("aps", GRID, qhat, answers, random.Random(7))
    second = calibration.stopping_budgets("aps", GRID, qhat, answers, random.Random(7))
    assert first == second


def test_dynamic_k_matches_stopping_budget():
    rng_a, rng_b = random.Random(5), random.Random(5)
    qhat = {2: 0.6, 4: 0.6, 8: 0.6}
    expected = [calibration.stopping_budget("aps", GRID, qhat, a, rng=rng_b) for a in ANSWERS]
    assert calibration.stopping_budgets("aps", GRID, qhat, ANSWERS, rng_a) == expected


def test_dynamic_k_errors():
    qhat = {2: 0.5, 4: 0.5, 8: 0.5}
    with pytest.raises(ValueError):
        calibration.stopping_budgets("entropy", GRID, qhat, PASSES, None)
    with pytest.raises(ValueError):
        calibration.stopping_budgets("first_success", GRID, {2: 0.5}, PASSES, None)
    with pytest.raises(ValueError):
        calibration.stopping_budgets("first_success", GRID, qhat, [[True] * 4], None)
    with pytest.raises(ValueError):
        calibration.stopping_budgets("first_success", [2, 2, 4], qhat, PASSES, None)
    with pytest.raises(ValueError):
        calibration.stopping_budgets("first_success", GRID, qhat, [], None)
    with pytest.raises(ValueError):
        accuracy.dynamic_k_summary("aps", GRID, qhat, ANSWERS, random.Random(0))  # no golds
    with pytest.raises(ValueError):
        accuracy.dynamic_k_summary("aps", GRID, qhat, ANSWERS, random.Random(0), golds=GOLDS[:2])


# --------------------------------------------------------------------------- #
# 3. Coverage
# --------------------------------------------------------------------------- #

# first_success scores of PASSES, by hand (j*/k, 1.0 without a pass):
#   k=2: A 1/2, B 1, C 2/2, D 1      k=4: A 1/4, B 3/4, C 2/4, D 1
#   k=8: A 1/8, B 3/8, C 2/8, D 1
EVAL_SCORES = {
    2: [0.5, 1.0, 1.0, 1.0],
    4: [0.25, 0.75, 0.5, 1.0],
    8: [0.125, 0.375, 0.25, 1.0],
}


def test_eval_scores_fixture_matches_calibration():
    assert calibration.calibration_scores("first_success", GRID, PASSES) == EVAL_SCORES


def test_coverage_at_k_band_arithmetic():
    # qhat 0.5 at k=4 covers A (.25) and C (.5, inclusive) -> 2/4.
    c = coverage.coverage_at_k(EVAL_SCORES[4], 0.5, delta=0.2, n_cal=9)
    assert c["coverage"] == 0.5
    assert c["n_covered"] == 2 and c["n_eval"] == 4
    assert c["nominal"] == pytest.approx(0.8)
    # Band [1 - .2, 1 - .2 + 1/10] = [0.8, 0.9]; ceil(10 * .8) = 8 <= 9 so it applies.
    assert c["band_low"] == pytest.approx(0.8)
    assert c["band_high"] == pytest.approx(0.9)
    assert c["band_valid"] is True


def test_coverage_band_clipped_and_clamped():
    # 1 - .05 + 1/(4+1) = 1.15 -> clipped to 1; ceil(5 * .95) = 5 > 4 -> clamped.
    c = coverage.coverage_at_k([0.1, 0.2], 0.5, delta=0.05, n_cal=4)
    assert c["band_high"] == 1.0
    assert c["band_valid"] is False
    # n_cal = 19, delta = .05: ceil(20 * .95) = 19 <= 19 -> applies.
    assert coverage.coverage_at_k([0.1], 0.5, delta=0.05, n_cal=19)["band_valid"] is True


def test_clopper_pearson_closed_forms_and_containment():
    # 0 of 4 covered: exact interval [0, 1 - 0.025**(1/4)] = [0, 0.60236...].
    c0 = coverage.coverage_at_k([1.0] * 4, 0.5, 0.1, 50)
    assert c0["coverage"] == 0.0
    assert c0["ci_low"] == 0.0
    assert c0["ci_high"] == pytest.approx(1 - 0.025**0.25)
    # 4 of 4 covered: [0.025**(1/4), 1] = [0.39764..., 1].
    c4 = coverage.coverage_at_k([0.0] * 4, 0.5, 0.1, 50)
    assert c4["ci_low"] == pytest.approx(0.025**0.25)
    assert c4["ci_high"] == 1.0
    for n_cov in range(11):
        c = coverage.coverage_at_k([0.0] * n_cov + [1.0] * (10 - n_cov), 0.5, 0.1, 50)
        assert c["ci_low"] <= c["coverage"] <= c["ci_high"]


def test_post_selection_coverage_hand_case():
    # Chosen k from test_dynamic_k_execution_hand_case: [2, 8, 4, 8].
    # A at 2: .5 <= .5 ok; B at 8: .375 ok; C at 4: .5 ok; D at 8: 1 > .5 -> 3/4.
    qhat = {2: 0.5, 4: 0.5, 8: 0.5}
    post = coverage.post_selection_coverage(EVAL_SCORES, qhat, [2, 8, 4, 8])
    assert post["coverage_post_selection"] == 0.75
    assert post["n_covered"] == 3 and post["n_eval"] == 4
    assert post["covered_by_theorem"] is False
    assert post["ci_low"] <= 0.75 <= post["ci_high"]
    assert "coverage" not in post  # kept apart from the per-k quantity


def test_coverage_errors():
    with pytest.raises(ValueError):
        coverage.coverage_at_k([], 0.5, 0.1, 10)
    with pytest.raises(ValueError):
        coverage.coverage_at_k([0.1, float("nan")], 0.5, 0.1, 10)
    with pytest.raises(ValueError):
        coverage.coverage_at_k([0.1], 0.5, 1.0, 10)
    with pytest.raises(ValueError):
        coverage.coverage_at_k([0.1], 0.5, 0.1, 0)
    with pytest.raises(ValueError):
        coverage.coverage_at_k([0.1], float("nan"), 0.1, 10)
    with pytest.raises(ValueError):
        coverage.post_selection_coverage(EVAL_SCORES, {2: 0.5, 4: 0.5, 8: 0.5}, [2, 16, 4, 8])
    with pytest.raises(ValueError):
        coverage.post_selection_coverage(EVAL_SCORES, {2: 0.5, 4: 0.5, 8: 0.5}, [2, 8])
    with pytest.raises(ValueError):
        coverage.post_selection_coverage(EVAL_SCORES, {2: 0.5, 4: 0.5, 8: 0.5}, [])


# --------------------------------------------------------------------------- #
# 4. Cost accounting
# --------------------------------------------------------------------------- #


def test_savings_formulas():
    # 3 steps x 8 groups, k_max = 8: fixed-G cost = 24 * 8 = 192 rollouts.
    # Generated per step 40 + 24 + 32 = 96 -> savings 1 - 96/192 = 0.5.
    steps = [40, 24, 32]
    assert costs.rollout_savings(steps, [8, 8, 8], 8) == 0.5
    assert costs.rollout_savings(96, 24, 8) == 0.5
    # Plus 48 calibration rollouts: 1 - 144/192 = 0.25; per prompt 144/24 = 6.
    assert costs.rollout_savings_with_calibration(steps, 48, 24, 8) == 0.25
    assert costs.rollouts_per_prompt(steps, 48, 24) == 6.0
    # Calibration can cost more than training saved: 1 - 296/192 = -104/192.
    assert costs.rollout_savings_with_calibration(96, 200, 24, 8) == pytest.approx(-104 / 192)
    # Nothing saved when every group used the full budget.
    assert costs.rollout_savings(192, 24, 8) == 0.0


def test_cost_errors():
    with pytest.raises(ValueError):
        costs.rollout_savings(10, 0, 8)
    with pytest.raises(ValueError):
        costs.rollout_savings(-1, 2, 8)
    with pytest.raises(ValueError):
        costs.rollout_savings(10, 2, 0)
    with pytest.raises(ValueError):
        costs.rollout_savings(10.5, 2, 8)
    with pytest.raises(ValueError):
        costs.rollout_savings([3, -2], 2, 8)
    with pytest.raises(ValueError):
        costs.rollouts_per_prompt(10, 0, [])


# --------------------------------------------------------------------------- #
# 5. Bootstrap intervals over seeds and prompts; coverage over re-splits
# --------------------------------------------------------------------------- #


def test_bootstrap_single_constant_and_errors():
    mean, lo, hi = statistics.bootstrap_mean_ci([0.7], 100, 0)
    assert mean == 0.7 and math.isnan(lo) and math.isnan(hi)
    assert statistics.bootstrap_mean_ci([[0.5, 0.5], [0.5, 0.5]], 100, 0) == (0.5, 0.5, 0.5)
    for values in ([], [1.0, float("nan")]):
        with pytest.raises(ValueError):
            statistics.bootstrap_mean_ci(values, 100, 0)
    with pytest.raises(ValueError, match="confidence"):
        statistics.bootstrap_mean_ci([1.0, 2.0], 100, 0, confidence=1.0)
    with pytest.raises(ValueError, match="resamples"):
        statistics.bootstrap_mean_ci([1.0, 2.0], 0, 0)


def test_bootstrap_is_seeded_and_stays_within_the_values():
    values = [0.2, 0.5, 0.9]
    first = statistics.bootstrap_mean_ci(values, 1000, [0, 7])
    assert first == statistics.bootstrap_mean_ci(values, 1000, [0, 7])
    assert first != statistics.bootstrap_mean_ci(values, 1000, [1, 7])
    mean, lo, hi = first
    assert mean == pytest.approx(np.mean(values)) and 0.2 <= lo < mean < hi <= 0.9


def test_bootstrap_over_prompts_matches_the_binomial_standard_error():
    # One seed, 400 prompts at 0.4: the interval's half-width is about 1.96 * sqrt(0.4 * 0.6 / 400) = 0.048.
    flags = [[1.0] * 160 + [0.0] * 240]
    mean, lo, hi = statistics.bootstrap_mean_ci(flags, 4000, 0)
    assert mean == pytest.approx(0.4) and (hi - lo) / 2 == pytest.approx(0.048, abs=0.006)


def test_bootstrap_interval_covers_the_true_mean_about_95_percent_of_the_time():
    rng = np.random.default_rng(0)
    trials = 300
    # 3 seeds whose accuracies differ (sd 0.03) on 100 prompts each: both sources of noise.
    covered = 0
    for trial in range(trials):
        seed_means = 0.5 + rng.normal(0, 0.03, size=3)
        table = (rng.random((3, 100)) < seed_means[:, None]).astype(float)
        _, lo, hi = statistics.bootstrap_mean_ci(table, 500, [1, trial])
        covered += lo <= 0.5 <= hi
    # Three seeds make a percentile bootstrap of the seed effect somewhat narrow; it still covers most draws.
    assert 0.8 <= covered / trials <= 0.99


def test_split_coverage_distribution_matches_theory_on_continuous_scores():
    rng = np.random.default_rng(0)
    scores = rng.random(160)
    result = coverage.split_coverage_distribution(scores[:32], scores[32:], 0.2, 400, rng)
    # n = 32, r = ceil(33 * 0.8) = 27: Beta(27, 6) has mean 27/33.
    assert result["theory_mean"] == pytest.approx(27 / 33)
    assert result["mean"] == pytest.approx(27 / 33, abs=0.02)
    assert result["theory_q05"] < result["mean"] < result["theory_q95"]
    assert result["within_theory_90"] >= 0.85 and result["repeats"] == 400


def test_split_coverage_distribution_without_a_certifying_score_has_no_theory():
    rng = np.random.default_rng(0)
    result = coverage.split_coverage_distribution([0.5] * 4, [0.1, 0.9], 0.1, 10, rng)
    # n = 4 cannot certify 0.9 coverage (r = 5 > 4): qhat = 1 covers everything.
    assert result["mean"] == 1.0 and math.isnan(result["theory_mean"]) and math.isnan(result["within_theory_90"])


@pytest.mark.parametrize("module", [accuracy, costs, coverage, matching, statistics], ids=lambda m: m.__name__)
def test_metric_modules_are_torch_free(module):
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(module))
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")])
    }
    assert "torch" not in imported
