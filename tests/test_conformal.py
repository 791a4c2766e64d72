"""Tests for cgrpo.conformal: hand-worked rules, coverage by Monte Carlo, determinism."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from cgrpo.conformal import (
    aps_score,
    conformal_quantile,
    first_success_score,
    pass_rate_score,
    prediction_set,
    resolves_singleton,
    select_delta_auto,
    smallest_supported_delta,
)


class ScriptedRandom(random.Random):
    """random.Random whose random() replays a fixed script, to pin tie-breaks by hand."""

    def __init__(self, values):
        super().__init__(0)
        self._values = list(values)
        self.calls = 0

    def random(self):
        value = self._values[self.calls]
        self.calls += 1
        return value


# ---------------------------------------------------------------- conformal_quantile


@pytest.mark.parametrize(
    ("n", "delta", "rank"),
    [
        (9, 0.1, 9),  # ceil(10 * 0.9) = 9
        (10, 0.1, 10),  # ceil(11 * 0.9) = ceil(9.9) = 10
        (19, 0.05, 19),  # ceil(20 * 0.95) = 19 exactly
        # 10 * (1 - 0.7) is 3.0000000000000004 in floating point: without the rounding guard the rank would be 4.
        (9, 0.7, 3),
        (20, 0.1, 19),  # ceil(21 * 0.9) = ceil(18.9) = 19
        (4, 0.9, 1),  # ceil(5 * 0.1) = 1
        (3, 0.99, 1),  # ceil(4 * 0.01) = 1
    ],
)
def test_conformal_quantile_rank(n, delta, rank):
    scores = [(i + 1) / 100 for i in range(n)]
    shuffled = scores[::-1]
    assert conformal_quantile(shuffled, delta) == scores[rank - 1]


@pytest.mark.parametrize(("n", "delta"), [(4, 0.1), (3, 0.01), (16, 0.05)])
def test_conformal_quantile_without_a_covering_rank_is_the_largest_possible_score(n, delta):
    # ceil((n + 1)(1 - delta)) > n: no observed score certifies 1 - delta, so none may stand in for it.
    scores = [(i + 1) * 0.475 / n for i in range(n)]
    assert conformal_quantile(scores, delta) == 1.0
    assert delta < smallest_supported_delta(n)
    assert conformal_quantile(scores, smallest_supported_delta(n)) == max(scores)


def test_conformal_quantile_single_score():
    assert conformal_quantile([0.42], 0.5) == 0.42


def test_conformal_quantile_empty_is_one():
    assert conformal_quantile([], 0.1) == 1.0


@pytest.mark.parametrize("delta", [0.0, 1.0, -0.1, 1.5, float("nan"), "0.1", None, True])
def test_conformal_quantile_bad_delta(delta):
    with pytest.raises(ValueError, match="delta"):
        conformal_quantile([0.1, 0.2], delta)


def test_conformal_quantile_bad_delta_even_when_empty():
    with pytest.raises(ValueError, match="delta"):
        conformal_quantile([], 0.0)


def test_conformal_quantile_nan_score():
    with pytest.raises(ValueError, match="NaN"):
        conformal_quantile([0.1, float("nan")], 0.1)


@pytest.mark.parametrize(("n", "delta"), [(20, 0.1), (9, 0.2), (50, 0.05)])
def test_conformal_quantile_finite_sample_coverage(n, delta):
    rng = np.random.default_rng(1234 + n)
    trials = 4000
    draws = rng.random((trials, n + 1))
    covered = np.array([draws[t, n] <= conformal_quantile(draws[t, :n], delta) for t in range(trials)])
    coverage = covered.mean()
    # With continuous exchangeable scores the coverage is exactly rank/(n+1).
    lower, upper = 1 - delta, 1 - delta + 1 / (n + 1)
    tol = 3 * math.sqrt(lower * (1 - lower) / trials)
    assert lower - tol <= coverage <= upper + tol


# ---------------------------------------------------------------- aps_score


def test_aps_score_no_ties_hand_worked():
    # k = 6: a has 3/6, b has 2/6, c has 1/6; no ties, so draws only matter for U.
    answers = ["a", "b", "a", "c", "b", "a"]
    rng = ScriptedRandom([0.9, 0.1, 0.5, 0.25])  # draws for a, b, c, then U
    assert aps_score("b", answers, 6, rng) == pytest.approx(3 / 6 + 0.25 * 2 / 6)
    assert rng.calls == 4
    assert aps_score("a", answers, 6, ScriptedRandom([0.9, 0.1, 0.5, 0.5])) == pytest.approx(0.5 * 3 / 6)
    assert aps_score("c", answers, 6, ScriptedRandom([0.9, 0.1, 0.5, 1 / 3])) == pytest.approx(5 / 6 + 1 / 18)


def test_aps_score_failed_extractions_count_in_k_but_carry_no_mass():
    # k = 5 with two failures: a has 2/5, b has 1/5, failures hold the remaining 2/5.
    answers = ["a", None, "b", "", "a"]
    assert aps_score("a", answers, 5, ScriptedRandom([0.5, 0.5, 0.5])) == pytest.approx(0.5 * 2 / 5)
    assert aps_score("b", answers, 5, ScriptedRandom([0.5, 0.5, 0.5])) == pytest.approx(2 / 5 + 0.5 / 5)


def test_aps_score_scripted_tie_break():
    # a and b tie at 2/6; the smaller draw ranks first.
    answers = ["a", "b", "a", "b", "c", None]
    b_first = ScriptedRandom([0.8, 0.2, 0.5, 0.5])
    assert aps_score("a", answers, 6, b_first) == pytest.approx(2 / 6 + 0.5 * 2 / 6)
    a_first = ScriptedRandom([0.2, 0.8, 0.5, 0.5])
    assert aps_score("a", answers, 6, a_first) == pytest.approx(0.5 * 2 / 6)
    # c (1/6) ranks after both ties regardless of its small draw.
    assert aps_score("c", answers, 6, ScriptedRandom([0.8, 0.2, 0.0, 0.5])) == pytest.approx(4 / 6 + 0.5 / 6)


def _independent_aps(gold, answers, k, seed):
    """Tiny re-derivation of the APS rule for seeded-rng cross-checks."""
    r = random.Random(seed)
    distinct = []
    for a in answers[:k]:
        if a not in (None, "") and a not in distinct:
            distinct.append(a)
    draws = [r.random() for _ in distinct]
    u = r.random()
    count = {a: answers[:k].count(a) for a in distinct}
    order = sorted(range(len(distinct)), key=lambda i: (-count[distinct[i]], draws[i]))
    ahead = 0.0
    for i in order:
        if distinct[i] == gold:
            return min(1.0, ahead + u * count[gold] / k), draws
        ahead += count[distinct[i]] / k
    return 1.0, draws


def test_aps_score_seeded_tie_break_matches_rederivation_both_orders():
    answers = ["a", "b", "a", "b", "c", None]
    seen_orders = set()
    for seed in range(20):
        expected, draws = _independent_aps("a", answers, 6, seed)
        seen_orders.add(draws[0] < draws[1])
        assert aps_score("a", answers, 6, random.Random(seed)) == pytest.approx(expected)
    # The seeds must exercise both tie orders for the check to mean anything.
    assert seen_orders == {True, False}


def test_aps_score_matches_rederivation_on_random_cases():
    gen = random.Random(7)
    for case in range(200):
        k = gen.randint(1, 10)
        answers = [gen.choice(["x", "y", "z", "w", None, ""]) for _ in range(k + gen.randint(0, 3))]
        gold = gen.choice(["x", "y", "z", "w"])
        expected, _ = _independent_aps(gold, answers, k, case)
        assert aps_score(gold, answers, k, random.Random(case)) == pytest.approx(expected)


def test_aps_score_gold_missing_is_exactly_one_and_consumes_same_draws():
    answers = ["a", "b", "a", None, "gold"]
    rng = random.Random(3)
    assert aps_score("gold", answers, 4, rng) == 1.0  # gold only appears after k
    # One draw per distinct answer (a, b) plus U, just as if gold were present.
    reference = random.Random(3)
    for _ in range(3):
        reference.random()
    assert rng.random() == reference.random()


def test_aps_score_all_failed_is_one():
    rng = ScriptedRandom([0.5])
    assert aps_score("a", [None, "", None], 3, rng) == 1.0
    assert rng.calls == 1  # only U: there are no distinct answers to rank


def test_aps_score_empty_gold_never_matches():
    assert aps_score("", ["", "a"], 2, random.Random(0)) == 1.0


def test_aps_score_capped_at_one():
    # A generator outside [0, 1) is the only way to push the sum past 1.
    assert aps_score("b", ["a", "b"], 2, ScriptedRandom([0.1, 0.2, 5.0])) == 1.0


def test_aps_score_uses_only_first_k():
    answers = ["a", "a", "b", "b", "b", "b"]
    assert aps_score("a", answers, 2, ScriptedRandom([0.5, 0.3])) == pytest.approx(0.3)


@pytest.mark.parametrize("k", [0, -1, 7, 2.0, True])
def test_aps_score_bad_k(k):
    with pytest.raises(ValueError, match="k"):
        aps_score("a", ["a"] * 6, k, random.Random(0))


def test_aps_score_deterministic():
    answers = ["a", "b", "c", "a", "b", "c", None, "d"]
    assert aps_score("c", answers, 8, random.Random(11)) == aps_score("c", answers, 8, random.Random(11))


# ---------------------------------------------------------------- prediction_set


def test_prediction_set_includes_crossing_answer():
    answers = ["a", "a", "a", "b", "b", "c"]  # 3/6, 2/6, 1/6
    draws = [0.5, 0.5, 0.5]
    assert prediction_set(answers, 6, 0.5, ScriptedRandom(draws)) == ["a"]  # a reaches 0.5 exactly
    assert prediction_set(answers, 6, 0.51, ScriptedRandom(draws)) == ["a", "b"]  # b crosses
    assert prediction_set(answers, 6, 5 / 6, ScriptedRandom(draws)) == ["a", "b"]
    assert prediction_set(answers, 6, 0.9, ScriptedRandom(draws)) == ["a", "b", "c"]


def test_prediction_set_excludes_failed_extractions():
    answers = ["a", None, "", "b"]  # extracted mass 1/2 never reaches 0.9
    assert prediction_set(answers, 4, 0.9, ScriptedRandom([0.1, 0.2])) == ["a", "b"]
    assert prediction_set([None, ""], 2, 0.5, ScriptedRandom([])) == []


def test_prediction_set_tie_order_follows_draws():
    answers = ["a", "b"]
    assert prediction_set(answers, 2, 0.5, ScriptedRandom([0.7, 0.3])) == ["b"]
    assert prediction_set(answers, 2, 0.5, ScriptedRandom([0.3, 0.7])) == ["a"]


def test_prediction_set_zero_threshold_keeps_top_answer():
    assert prediction_set(["a", "b", "b"], 3, 0.0, ScriptedRandom([0.1, 0.9])) == ["b"]


def test_prediction_set_uses_same_ranking_as_aps_score():
    # Same seed -> same tie-breaks, so a score <= qhat puts gold in the set.
    gen = random.Random(5)
    for seed in range(300):
        k = gen.randint(1, 8)
        answers = [gen.choice(["x", "y", "z", None]) for _ in range(k)]
        gold = gen.choice(["x", "y", "z"])
        qhat = gen.random()
        if aps_score(gold, answers, k, random.Random(seed)) <= qhat:
            assert gold in prediction_set(answers, k, qhat, random.Random(seed))


def test_prediction_set_deterministic():
    answers = ["a", "b", "c", "d", "a", "b", "c", "d"]
    sets = {tuple(prediction_set(answers, 8, 0.6, random.Random(9))) for _ in range(3)}
    assert len(sets) == 1


def test_prediction_set_bad_inputs():
    with pytest.raises(ValueError, match="qhat"):
        prediction_set(["a"], 1, float("nan"), random.Random(0))
    with pytest.raises(ValueError, match="qhat"):
        prediction_set(["a"], 1, "0.5", random.Random(0))
    with pytest.raises(ValueError, match="k"):
        prediction_set(["a"], 2, 0.5, random.Random(0))


# ---------------------------------------------------------------- resolves_singleton


def test_resolves_singleton_majority_answer():
    answers = ["a", "a", "a", "b"]
    assert resolves_singleton(answers, 4, 0.75, ScriptedRandom([0.5, 0.5]))
    assert not resolves_singleton(answers, 4, 0.8, ScriptedRandom([0.5, 0.5]))


def test_resolves_singleton_lone_answer_among_failures_is_false():
    answers = ["a", None, None, ""]
    assert prediction_set(answers, 4, 0.5, ScriptedRandom([0.5])) == ["a"]
    assert not resolves_singleton(answers, 4, 0.5, ScriptedRandom([0.5]))
    assert resolves_singleton(answers, 4, 0.25, ScriptedRandom([0.5]))


def test_resolves_singleton_qhat_one_needs_unanimity():
    assert resolves_singleton(["a"] * 5, 5, 1.0, random.Random(0))
    assert not resolves_singleton(["a"] * 4 + ["b"], 5, 1.0, random.Random(0))
    assert not resolves_singleton(["a"] * 4 + [None], 5, 1.0, random.Random(0))


def test_resolves_singleton_all_failed_is_false():
    assert not resolves_singleton([None] * 4, 4, 0.1, random.Random(0))


# ---------------------------------------------------------------- pass-based scores


def test_first_success_score():
    assert first_success_score([False, False, True, True], 4) == 3 / 4
    assert first_success_score([True, False], 2) == 1 / 2
    assert first_success_score([False, False, True], 2) == 1.0  # pass lies beyond k
    assert first_success_score([False, False], 2) == 1.0


def test_pass_rate_score():
    assert pass_rate_score([True, False, True, False], 4) == 0.5
    assert pass_rate_score([True, True, False], 2) == 0.0
    assert pass_rate_score([False, False, True], 2) == 1.0
    assert pass_rate_score([True, False, False, False, True], 4) == 0.75


@pytest.mark.parametrize("fn", [first_success_score, pass_rate_score])
@pytest.mark.parametrize("k", [0, 4, 1.5])
def test_pass_scores_bad_k(fn, k):
    with pytest.raises(ValueError, match="k"):
        fn([True, False, True], k)


# ---------------------------------------------------------------- select_delta_auto


def test_select_delta_auto_hand_worked():
    delta, solve_rate = select_delta_auto([0.2, 1.0, 0.5, 1.0])
    assert solve_rate == 0.5
    assert delta == pytest.approx(0.55)


def test_select_delta_auto_clips():
    assert select_delta_auto([0.1] * 10) == (0.05, 1.0)  # 1 - 1 + 0.05
    assert select_delta_auto([0.1] * 10, margin=0.0) == (0.05, 1.0)  # clipped up to low
    assert select_delta_auto([1.0] * 3) == (0.95, 0.0)  # clipped down to high
    assert select_delta_auto([0.1, 1.0], margin=0.1, low=0.2, high=0.5) == (0.5, 0.5)


def test_select_delta_auto_empty():
    assert select_delta_auto([]) == (0.95, 0.0)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"low": 0.0}, "low"),
        ({"high": 1.0}, "high"),
        ({"low": 0.6, "high": 0.4}, "low"),
        ({"margin": float("nan")}, "margin"),
        ({"margin": "0.1"}, "margin"),
    ],
)
def test_select_delta_auto_bad_args(kwargs, match):
    with pytest.raises(ValueError, match=match):
        select_delta_auto([0.5], **kwargs)


# ---------------------------------------------------------------- APS coverage


def _simulate_answers(gen: np.random.Generator, n_prompts: int, k: int):
    """Prompts with Dirichlet answer distributions over 4 answers plus a failure mode; gold = '0'."""
    probs = gen.dirichlet([4.0, 1.0, 1.0, 1.0, 0.5], size=n_prompts)
    labels = np.array(["0", "1", "2", "3", ""], dtype=object)
    prompts = []
    for p in probs:
        draws = gen.choice(5, size=k, p=p)
        prompts.append([labels[d] or None for d in draws])
    return prompts


@pytest.mark.parametrize("delta", [0.1, 0.3])
def test_aps_threshold_coverage_on_simulated_prompts(delta):
    gen = np.random.default_rng(2024)
    rng = random.Random(2024)
    k, n_cal, n_test, repeats = 8, 100, 100, 20
    covered = 0
    qhats = []
    for _ in range(repeats):
        cal = _simulate_answers(gen, n_cal, k)
        test = _simulate_answers(gen, n_test, k)
        qhat = conformal_quantile([aps_score("0", a, k, rng) for a in cal], delta)
        qhats.append(qhat)
        covered += sum(aps_score("0", a, k, rng) <= qhat for a in test)
    total = repeats * n_test
    coverage = covered / total
    # Prompts are i.i.d., so calibration and test scores are exchangeable.
    # Coverage given one calibration set is roughly Beta with variance
    # delta(1-delta)/(n_cal+2); add the binomial noise of the test draws.
    var = delta * (1 - delta) * (1 / ((n_cal + 2) * repeats) + 1 / total)
    assert coverage >= 1 - delta - 3 * math.sqrt(var)
    # qhat == 1 would cover trivially; the simulation must keep it informative.
    assert max(qhats) < 1.0
