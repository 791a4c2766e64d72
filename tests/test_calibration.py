"""Tests for cgrpo.calibration: scoring, fitting, stopping, validation."""

from __future__ import annotations

import json
import random

import pytest

from cgrpo.calibration import (
    SCORES,
    Thresholds,
    calibration_scores,
    example_scores,
    fit_thresholds,
    should_stop,
    stopping_budget,
)
from cgrpo.conformal import aps_score, conformal_quantile

GRID = (2, 4, 8)


# ---------------------------------------------------------------- Thresholds


def test_thresholds_round_trip_through_json():
    t = Thresholds(delta=0.2, qhat={2: 0.5, 8: 0.25}, solve_rate=0.75, n_calibration=10)
    d = t.to_dict()
    assert d == {"delta": 0.2, "qhat": {2: 0.5, 8: 0.25}, "solve_rate": 0.75, "n_calibration": 10}
    assert Thresholds.from_dict(d) == t
    assert Thresholds.from_dict(json.loads(json.dumps(d))) == t


def test_thresholds_from_dict_missing_key():
    with pytest.raises(ValueError, match="qhat"):
        Thresholds.from_dict({"delta": 0.1, "solve_rate": 0.5, "n_calibration": 3})


# ---------------------------------------------------------------- example_scores


def test_example_scores_pass_based():
    passes = [False, True, False, False, True, False, False, False]
    assert example_scores("first_success", GRID, passes) == {2: 1.0, 4: 0.5, 8: 0.25}
    assert example_scores("pass_rate", GRID, passes) == {2: 0.5, 4: 0.75, 8: 0.75}


def test_example_scores_sorts_grid():
    passes = [True] * 8
    assert list(example_scores("first_success", [8, 2, 4], passes)) == [2, 4, 8]


def test_example_scores_aps_consumes_rng_k_ascending():
    answers = ["a", "b", "a", None, "a", "c", "b", "a"]
    got = example_scores("aps", [4, 2, 8], answers, gold="a", rng=random.Random(1))
    reference = random.Random(1)
    expected = {k: aps_score("a", answers, k, reference) for k in (2, 4, 8)}
    assert got == expected


def test_example_scores_aps_gold_missing_is_one():
    answers = [None] * 8
    assert example_scores("aps", GRID, answers, gold="a", rng=random.Random(0)) == {2: 1.0, 4: 1.0, 8: 1.0}


# ---------------------------------------------------------------- calibration_scores


def test_calibration_scores_collects_per_k_in_example_order():
    examples = [[True] * 8, [False] * 8, [False, False, False, True] + [False] * 4]
    assert calibration_scores("first_success", GRID, examples) == {
        2: [0.5, 1.0, 1.0],
        4: [0.25, 1.0, 1.0],
        8: [0.125, 1.0, 0.5],
    }


def test_calibration_scores_aps_matches_sequential_example_scores():
    examples = [["a", "b", "a", "a", None, "b", "c", "a"], ["x", "y", "z", "x", "y", "z", "x", "w"]]
    golds = ["a", "z"]
    got = calibration_scores("aps", GRID, examples, golds=golds, rng=random.Random(4))
    rng = random.Random(4)
    first = example_scores("aps", GRID, examples[0], gold="a", rng=rng)
    second = example_scores("aps", GRID, examples[1], gold="z", rng=rng)
    assert got == {k: [first[k], second[k]] for k in GRID}


def test_calibration_scores_deterministic():
    gen = random.Random(0)
    examples = [[gen.choice(["a", "b", "c", None]) for _ in range(8)] for _ in range(30)]
    golds = [gen.choice(["a", "b"]) for _ in range(30)]
    runs = [calibration_scores("aps", GRID, examples, golds=golds, rng=random.Random(99)) for _ in range(2)]
    assert runs[0] == runs[1]
    different = calibration_scores("aps", GRID, examples, golds=golds, rng=random.Random(100))
    assert different != runs[0]


def test_calibration_scores_empty():
    assert calibration_scores("pass_rate", GRID, []) == {2: [], 4: [], 8: []}


# ---------------------------------------------------------------- fit_thresholds


def _scores_by_k():
    # 10 examples; at k=8 four are unsolved (score 1.0).
    at8 = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 1.0, 1.0, 1.0, 1.0]
    at4 = [0.15, 0.25, 0.35, 0.45, 0.55, 1.0, 1.0, 1.0, 1.0, 1.0]
    return {4: at4, 8: at8}


def test_fit_thresholds_fixed_delta():
    t = fit_thresholds(_scores_by_k(), delta=0.5)
    # n = 10: rank ceil(11 * 0.5) = 6.
    assert t.qhat == {4: 1.0, 8: 0.6}
    assert t.delta == 0.5
    assert t.solve_rate == 0.6
    assert t.n_calibration == 10


def test_fit_thresholds_fixed_delta_ignores_split():
    fixed = fit_thresholds(_scores_by_k(), delta=0.5)
    assert fit_thresholds(_scores_by_k(), delta=0.5, split_delta=True) == fixed


def test_fit_thresholds_auto_delta():
    t = fit_thresholds(_scores_by_k(), delta=None, delta_margin=0.1)
    # solve rate 0.6 -> delta = 1 - 0.6 + 0.1 = 0.5 -> rank 6.
    assert t.solve_rate == pytest.approx(0.6)
    assert t.delta == pytest.approx(0.5)
    assert t.qhat == {4: 1.0, 8: 0.6}
    assert t.n_calibration == 10


def test_fit_thresholds_split_delta():
    scores = _scores_by_k()
    t = fit_thresholds(scores, delta=None, delta_margin=0.05, split_delta=True)
    # First half at k=8 is [0.1, ..., 0.5], all solved: 1 - 1 + 0.05 is below what the 5 examples that fit the
    # thresholds support, so delta = 1 / 6.
    assert t.solve_rate == 1.0
    assert t.delta == pytest.approx(1 / 6)
    assert t.n_calibration == 5
    # Second half [0.6, 1, 1, 1, 1]: rank ceil(6 * 5 / 6) = 5 -> 1.0.
    assert t.qhat == {4: 1.0, 8: 1.0}
    assert t.qhat[8] == conformal_quantile(scores[8][5:], t.delta)


def test_fit_thresholds_auto_delta_never_goes_below_what_n_supports():
    scores = {2: [0.1 * i for i in range(1, 10)]}  # n = 9, all solved: 1 - 1 + margin would be 0.05 < 1/10
    t = fit_thresholds(scores, delta=None, delta_margin=0.05)
    assert t.delta == pytest.approx(0.1)
    assert t.qhat[2] == pytest.approx(0.9)  # rank ceil(10 * 0.9) = 9 exists, unlike at 0.05


def test_fit_thresholds_warns_when_fixed_delta_is_below_what_n_supports(caplog):
    # n = 16, delta = 0.05: ceil(17 * 0.95) = 17 > 16, the case that used to return the largest observed score.
    scores = {2: [0.475 * i / 16 for i in range(1, 17)]}
    with caplog.at_level("WARNING", logger="cgrpo.calibration"):
        t = fit_thresholds(scores, delta=0.05)
    assert t.qhat == {2: 1.0}
    assert "n=16" in caplog.text and "delta=0.05" in caplog.text and "0.0588" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="cgrpo.calibration"):
        fit_thresholds(scores, delta=1 / 17)
    assert caplog.text == ""


def test_fit_thresholds_split_delta_odd_count_gives_calibration_the_larger_half():
    scores = {2: [0.1, 0.2, 0.3]}
    t = fit_thresholds(scores, delta=None, split_delta=True)
    assert t.n_calibration == 2
    assert t.qhat[2] == conformal_quantile([0.2, 0.3], t.delta)


def test_fit_thresholds_split_delta_needs_two_examples():
    with pytest.raises(ValueError, match="at least 2"):
        fit_thresholds({2: [0.3]}, delta=None, split_delta=True)


def test_fit_thresholds_no_examples():
    t = fit_thresholds({2: [], 4: []}, delta=0.1)
    assert t.qhat == {2: 1.0, 4: 1.0}
    assert t.n_calibration == 0
    assert t.solve_rate == 0.0


@pytest.mark.parametrize(
    ("scores", "delta", "match"),
    [
        ({}, 0.1, "empty"),
        ({2: [0.1], 4: [0.1, 0.2]}, 0.1, "differ in length"),
        ({0: [0.1]}, 0.1, "positive integer"),
        ({2: [0.1]}, 1.0, "delta"),
        ({2: [0.1]}, 0.0, "delta"),
    ],
)
def test_fit_thresholds_errors(scores, delta, match):
    with pytest.raises(ValueError, match=match):
        fit_thresholds(scores, delta=delta)


# ---------------------------------------------------------------- should_stop / stopping_budget


def test_aps_always_agree_stops_at_first_budget():
    answers = ["42"] * 8
    for q in (1e-9, 0.5, 1.0):
        qhat = {k: q for k in GRID}
        assert stopping_budget("aps", GRID, qhat, answers, rng=random.Random(0)) == 2


def test_aps_all_failed_never_stops():
    answers = [None] * 8
    qhat = {k: 0.01 for k in GRID}
    assert not any(should_stop("aps", k, 0.01, answers, rng=random.Random(0)) for k in GRID)
    assert stopping_budget("aps", GRID, qhat, answers, rng=random.Random(0)) == 8


def test_aps_stops_once_majority_is_confident():
    # k=2: a, b tie at 1/2 < 0.7; k=4: a has 3/4 >= 0.7.
    answers = ["a", "b", "a", "a", "b", "b", "b", "b"]
    qhat = {k: 0.7 for k in GRID}
    assert stopping_budget("aps", GRID, qhat, answers, rng=random.Random(0)) == 4


def test_aps_stopping_budget_deterministic():
    gen = random.Random(3)
    answers = [gen.choice(["a", "b"]) for _ in range(8)]
    qhat = {2: 0.5, 4: 0.5, 8: 0.5}
    results = {stopping_budget("aps", GRID, qhat, answers, rng=random.Random(8)) for _ in range(3)}
    assert len(results) == 1


def test_first_success_all_pass_fits_one_over_k_and_stops_first():
    examples = [[True] * 8 for _ in range(20)]
    t = fit_thresholds(calibration_scores("first_success", GRID, examples), delta=0.1)
    assert t.qhat == {k: 1 / k for k in GRID}
    assert stopping_budget("first_success", GRID, t.qhat, [True] * 8) == 2


def test_first_success_stopping_rule():
    qhat = {2: 0.5, 4: 0.5, 8: 0.5}
    # First pass at position 3: score 1.0 at k=2, 0.75 at k=4, 0.375 at k=8.
    passes = [False, False, True] + [False] * 5
    assert [should_stop("first_success", k, qhat[k], passes) for k in GRID] == [False, False, True]
    assert stopping_budget("first_success", GRID, qhat, passes) == 8


def test_pass_based_needs_a_pass_even_when_qhat_is_one():
    passes = [False] * 8
    for score in ("first_success", "pass_rate"):
        assert not should_stop(score, 4, 1.0, passes)
        assert stopping_budget(score, GRID, {k: 1.0 for k in GRID}, passes) == 8


def test_pass_rate_stopping_rule():
    passes = [True, False, True, True, True, True, True, True]
    # pass_rate scores: k=2 0.5, k=4 0.25, k=8 0.125.
    qhat = {2: 0.4, 4: 0.3, 8: 0.3}
    assert stopping_budget("pass_rate", GRID, qhat, passes) == 4


# ---------------------------------------------------------------- validation


def test_unknown_score_lists_allowed_names():
    for call in (
        lambda: example_scores("brier", GRID, [True] * 8),
        lambda: calibration_scores("brier", GRID, []),
        lambda: should_stop("brier", 2, 0.5, [True] * 8),
        lambda: stopping_budget("brier", GRID, {k: 0.5 for k in GRID}, [True] * 8),
    ):
        with pytest.raises(ValueError, match="aps, first_success, pass_rate"):
            call()
    assert SCORES == ("aps", "first_success", "pass_rate")


@pytest.mark.parametrize(
    ("grid", "match"),
    [([], "empty"), ([2, 2], "repeats"), ([0, 2], "positive integer"), ([2.5], "positive integer")],
)
def test_bad_grid(grid, match):
    with pytest.raises(ValueError, match=match):
        example_scores("pass_rate", grid, [True] * 8)
    with pytest.raises(ValueError, match=match):
        stopping_budget("pass_rate", grid, {2: 0.5}, [True] * 8)


def test_too_few_outcomes():
    with pytest.raises(ValueError, match="largest budget is 8"):
        example_scores("first_success", GRID, [True] * 7)
    with pytest.raises(ValueError, match="largest budget is 8"):
        calibration_scores("first_success", GRID, [[True] * 8, [True] * 4])
    with pytest.raises(ValueError, match="largest budget is 8"):
        stopping_budget("first_success", GRID, {k: 0.5 for k in GRID}, [True] * 7)


def test_aps_requires_rng_and_gold():
    answers = ["a"] * 8
    with pytest.raises(ValueError, match="rng"):
        example_scores("aps", GRID, answers, gold="a")
    with pytest.raises(ValueError, match="gold"):
        example_scores("aps", GRID, answers, rng=random.Random(0))
    with pytest.raises(ValueError, match="rng"):
        calibration_scores("aps", GRID, [answers], golds=["a"])
    with pytest.raises(ValueError, match="golds"):
        calibration_scores("aps", GRID, [answers], rng=random.Random(0))
    with pytest.raises(ValueError, match="one gold per example"):
        calibration_scores("aps", GRID, [answers], golds=["a", "b"], rng=random.Random(0))
    with pytest.raises(ValueError, match="rng"):
        should_stop("aps", 2, 0.5, answers)
    with pytest.raises(ValueError, match="rng"):
        stopping_budget("aps", GRID, {k: 0.5 for k in GRID}, answers)


def test_stopping_budget_missing_threshold():
    with pytest.raises(ValueError, match=r"no threshold for budgets \[8\]"):
        stopping_budget("pass_rate", GRID, {2: 0.5, 4: 0.5}, [True] * 8)


def test_should_stop_bad_k():
    with pytest.raises(ValueError, match="k"):
        should_stop("first_success", 9, 0.5, [True] * 8)
    with pytest.raises(ValueError, match="k"):
        should_stop("aps", 0, 0.5, ["a"] * 8, rng=random.Random(0))
