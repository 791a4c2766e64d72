"""The prompt allocators' own logic against hand-computed cases: GRESO's skip probability and its exploration update,
the knapsack allocation within its batch total (against a brute-force search), Reinforce-Ada's exit, balanced group and
advantages, their state's round trip, and the registry's refusals."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from cgrpo.allocation import allocator_names, get_allocator
from cgrpo.allocation.greso import GresoAllocator
from cgrpo.allocation.knapsack import KnapsackAllocator, rollout_value
from cgrpo.allocation.reinforce_ada import balanced_exit, balanced_group, pool_advantages

GRID = [2, 4, 8]


def test_greso_keeps_a_prompt_with_probability_p_to_its_streak():
    greso = GresoAllocator(GRID)
    assert greso.keep_probability("new") == 1.0
    for _ in range(3):
        greso.observe("easy", [1, 1, 1, 1])
    greso.observe("hard", [0, 0])
    greso.observe("mixed", [0, 1])
    assert greso.keep_probability("easy") == pytest.approx(0.5**3)
    assert greso.keep_probability("hard") == pytest.approx(0.5)
    assert greso.keep_probability("mixed") == 1.0
    # A group with differing rewards ends the streak.
    greso.observe("easy", [1, 0, 1, 1])
    assert greso.keep_probability("easy") == 1.0
    # Never below the floor: after 10 agreeing groups 0.5**10 < 0.05.
    for _ in range(10):
        greso.observe("hard", [0, 0])
    assert greso.keep_probability("hard") == pytest.approx(0.05)


def test_greso_skips_at_its_rate_and_never_plans_past_the_total():
    greso = GresoAllocator(GRID)
    for _ in range(2):
        greso.observe("agreed", [1, 1])
    rng = random.Random(0)
    kept = sum(greso.plan(["agreed"], 8, rng)[0] == 8 for _ in range(4000))
    assert kept / 4000 == pytest.approx(0.25, abs=0.03)
    assert greso.plan(["a", "b", "c"], 16, rng) == [8, 8, 0]


def test_greso_moves_each_kinds_exploration_toward_its_target():
    greso = GresoAllocator(GRID)
    # 4 groups: 1 all right (0.25 > 1/12: skip more easy ones), none all wrong (0 < 1/6: explore more hard ones).
    for prompt, rewards in (("a", [1, 1]), ("b", [1, 0]), ("c", [0, 1]), ("d", [1, 0])):
        greso.observe(prompt, rewards)
    greso.end_batch()
    assert greso.p == pytest.approx({"easy": 0.49, "hard": 0.51})
    # The next batch counts afresh.
    greso.observe("e", [0, 0])
    greso.end_batch()
    assert greso.p == pytest.approx({"easy": 0.50, "hard": 0.50})


def test_knapsack_value_is_the_chance_of_signal_times_what_a_success_teaches():
    assert rollout_value(4, 0.5) == pytest.approx((1 - 2 * 0.5**4) * 0.5 * 0.25)
    assert rollout_value(8, 0.0) == 0.0 and rollout_value(8, 1.0) == 0.0
    # Harder prompts are worth more: p (1 - p)^2 peaks at 1/3.
    assert rollout_value(8, 1 / 3) > rollout_value(8, 2 / 3)


def test_knapsack_finds_the_best_budgets_within_the_total():
    knapsack = KnapsackAllocator(GRID)
    rates = {"a": 0.1, "b": 0.5, "c": 0.9, "d": 0.3}
    for prompt, rate in rates.items():
        knapsack.observe(prompt, [1] * round(rate * 10) + [0] * round((1 - rate) * 10))
    prompts = list(rates)
    plan = knapsack.plan(prompts, 20, random.Random(0))
    assert sum(plan) <= 20 and all(size in GRID for size in plan)
    best = max(
        (sizes for sizes in itertools.product(GRID, repeat=4) if sum(sizes) <= 20),
        key=lambda sizes: sum(rollout_value(n, rates[p]) for n, p in zip(sizes, prompts)),
    )
    value = sum(rollout_value(n, rates[p]) for n, p in zip(plan, prompts))
    assert value == pytest.approx(sum(rollout_value(n, rates[p]) for n, p in zip(best, prompts)))


def test_knapsack_gives_the_solved_the_least_and_the_leftover_to_the_hopeless():
    knapsack = KnapsackAllocator(GRID)
    knapsack.observe("solved", [1, 1, 1, 1])
    knapsack.observe("hopeless", [0, 0, 0, 0])
    knapsack.observe("half", [1, 0, 1, 0])
    plan = knapsack.plan(["solved", "hopeless", "half", "never drawn"], 24, random.Random(0))
    # The prompt never drawn takes the even share (the largest grid size 4 prompts can all have: 4); the solved one
    # the smallest; "half" its best (8, the most valuable); the hopeless one what remains, in grid steps.
    assert plan == [2, 8, 8, 4] and sum(plan) <= 24
    # Below the smallest budget for every prompt, the last ones are skipped.
    assert knapsack.plan(["a", "b", "c"], 5, random.Random(0)) == [2, 2, 0]


def test_reinforce_ada_exits_once_balanced_and_trains_on_a_balanced_group():
    assert not balanced_exit([1, 1, 1, 0], positives=2, negatives=2)
    assert balanced_exit([1, 1, 0, 1, 0], positives=2, negatives=2)
    rewards = [1, 0, 0, 0, 1, 0, 0, 0]
    chosen = balanced_group(rewards, 4, random.Random(0))
    assert len(chosen) == 4 and sum(rewards[i] for i in chosen) == 2
    # One right answer in the pool: it joins three wrong ones.
    pool = [0, 0, 1, 0, 0]
    assert sum(pool[i] for i in balanced_group(pool, 4, random.Random(0))) == 1
    with pytest.raises(ValueError, match="needs a pool of at least 4"):
        balanced_group([1, 0], 4, random.Random(0))


def test_reinforce_ada_advantages_take_the_whole_pools_mean_as_baseline():
    rewards = [1, 0, 0, 0, 1, 0, 0, 0]  # pool mean and success rate 0.25
    assert pool_advantages(rewards, [0, 1]) == pytest.approx([0.75, -0.25])
    assert pool_advantages(rewards, [0, 1], "inverse_rate") == pytest.approx([3.0, -1.0])
    assert pool_advantages(rewards, [0, 1], "inverse_sqrt_rate") == pytest.approx([1.5, -0.5])
    assert pool_advantages([0, 0, 0, 0], [0, 1], "inverse_rate") == [0.0, 0.0]


@pytest.mark.parametrize("name", ["greso", "knapsack"])
def test_an_allocators_state_survives_a_json_round_trip(name):
    first, second = get_allocator(name)(GRID), get_allocator(name)(GRID)
    for prompt, rewards in (("a", [1, 1]), ("b", [0, 1]), ("a", [1, 1])):
        first.observe(prompt, rewards)
    first.end_batch()
    second.load_state_dict(json.loads(json.dumps(first.state_dict())))
    prompts = ["a", "b", "c"]
    assert first.plan(prompts, 16, random.Random(1)) == second.plan(prompts, 16, random.Random(1))
    assert second.state_dict() == first.state_dict()


def test_the_registry_refuses_unknown_names_and_options():
    assert allocator_names()[:2] == ["greso", "knapsack"]
    with pytest.raises(ValueError, match="did you mean 'greso'"):
        get_allocator("gresso")
    with pytest.raises(ValueError, match="has no option 'p'; its options are size, p_easy"):
        GresoAllocator(GRID, p=0.3)
    with pytest.raises(ValueError, match="size must be a budget of the grid"):
        GresoAllocator(GRID, size=5)
