"""Prompt allocators run over generation batches (`cgrpo.allocation.batch`) and in `CGRPOTrainer`: a batch keeps its
size, skipped prompts are replaced and counted, the total is never exceeded, planned rollouts cap the draws, a resumed
run plans as an uninterrupted one, two processes agree, and the refusals."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import yaml
from datasets import Dataset
from test_trainer import _config as trainer_config

from cgrpo import CGRPOConfig, CGRPOTrainer
from cgrpo.allocation import base, get_allocator
from cgrpo.allocation.batch import BatchAllocation, prompt_key
from cgrpo.pipeline.configuration.methods import parse_run_name, static_runs
from cgrpo.stopping import get_rule

GRID = [2, 4, 8]
REPO = Path(__file__).resolve().parents[1]
PROMPTS = [f"{i}+{i}=" for i in range(40)]


def _rewards(prompt: str, drawn: int) -> list[float]:
    """A fixed pattern by prompt: a third always right, a third always wrong, a third mixed."""
    kind = int(prompt.split("+")[0]) % 3
    return [1.0] * drawn if kind == 0 else [0.0] * drawn if kind == 1 else [float(i % 2) for i in range(drawn)]


def _allocation(name: str, rollouts_per_prompt: float = 8, rank: int = 0, processes: int = 1, gather=None, **options):
    dataset = [{"prompt": prompt} for prompt in PROMPTS]
    extra = {} if gather is None else {"gather": gather}
    allocator = get_allocator(name)(GRID, **options)
    return BatchAllocation(allocator, rollouts_per_prompt, dataset, 0, rank, processes, **extra)


def _run(allocation: BatchAllocation, batches: list[list[str]]) -> list[tuple[list[str], list[int]]]:
    """Plan and observe each batch of prompts; return each batch's prompts and planned rollouts."""
    plans = []
    for prompts in batches:
        examples, planned = allocation.plan([{"prompt": prompt} for prompt in prompts])
        drawn = [example["prompt"] for example in examples]
        allocation.observe([prompt_key(p) for p in drawn], [_rewards(p, k) for p, k in zip(drawn, planned)])
        plans.append((drawn, planned))
    return plans


# Four epochs of ten prompts, four per batch: every prompt recurs.
BATCHES = [PROMPTS[i : i + 4] for _ in range(4) for i in range(0, 8, 4)]


def test_skipped_prompts_are_replaced_and_every_one_is_counted():
    allocation = _allocation("greso")
    plans = _run(allocation, BATCHES)
    assert all(len(drawn) == 4 and planned == [8] * 4 for drawn, planned in plans)
    totals = allocation.totals
    # From the second epoch on, the agreeing prompts are skipped at half their rate or more.
    assert totals["skipped_prompts"] > 0
    assert totals["refill_prompts"] == totals["skipped_prompts"]
    assert totals["planned_rollouts"] == 8 * 4 * len(BATCHES)
    assert totals["batches"] == len(BATCHES)
    # A skipped prompt drawn again later is counted, and with it whether it carried signal then.
    assert 0 < totals["skipped_redrawn"] <= totals["skipped_prompts"]
    assert totals["skipped_redrawn_informative"] <= totals["skipped_redrawn"]


def test_a_skipped_prompt_that_later_carries_signal_is_counted():
    allocation = _allocation("greso", p_easy=0.0, floor=0.0)
    allocation.allocator.observe(prompt_key("0+0="), [1.0, 1.0])
    allocation.plan([{"prompt": "0+0="}])
    assert allocation.totals["skipped_prompts"] == 1
    allocation.observe([prompt_key("0+0=")], [[1.0, 0.0]])
    assert allocation.totals["skipped_redrawn"] == allocation.totals["skipped_redrawn_informative"] == 1


def test_the_knapsack_plan_stays_within_the_batch_total():
    allocation = _allocation("knapsack", rollouts_per_prompt=4)
    for _, planned in _run(allocation, BATCHES):
        assert sum(planned) <= 4 * 4 and set(planned) <= set(GRID)
    # Once every prompt has a rate, the always-right ones get the smallest budget and the mixed ones more.
    drawn, planned = _run(allocation, [["0+0=", "2+2=", "3+3=", "5+5="]])[0]
    assert planned[drawn.index("3+3=")] == 2 and planned[drawn.index("2+2=")] > 2


def test_an_allocator_that_skips_everything_is_a_clear_error():
    allocation = _allocation("greso", p_easy=0.0, p_hard=0.0, floor=0.0)
    for prompt in PROMPTS:
        allocation.allocator.observe(prompt_key(prompt), [1.0, 1.0])
    with pytest.raises(RuntimeError, match="raise its keep probability's floor"):
        allocation.plan([{"prompt": "0+0="}])


def test_a_resumed_allocation_plans_as_an_uninterrupted_one():
    uninterrupted = _run(_allocation("greso"), BATCHES)
    first = _allocation("greso")
    before = _run(first, BATCHES[:4])
    resumed = _allocation("greso")
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert before + _run(resumed, BATCHES[4:]) == uninterrupted
    assert resumed.state_dict()["totals"]["skipped_prompts"] > first.state_dict()["totals"]["skipped_prompts"]


class _ThreadGather:
    """All-gather between threads that stand in for processes."""

    def __init__(self, processes: int):
        self.barrier = threading.Barrier(processes)
        self.values: list = [None] * processes

    def for_rank(self, rank: int):
        def gather(value):
            self.values[rank] = value
            self.barrier.wait()
            every = list(self.values)
            self.barrier.wait()
            return every

        return gather


def test_two_processes_agree_on_the_allocators_state_and_draw_different_refills():
    gather = _ThreadGather(2)
    allocations = [_allocation("greso", rank=rank, processes=2, gather=gather.for_rank(rank)) for rank in (0, 1)]
    plans: list = [None, None]

    def run(rank):
        # Each process holds two of every batch's four prompts.
        plans[rank] = _run(allocations[rank], [batch[2 * rank : 2 * rank + 2] for batch in BATCHES])

    threads = [threading.Thread(target=run, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    states = [allocation.state_dict() for allocation in allocations]
    assert states[0]["allocator"] == states[1]["allocator"] and states[0]["allocator"]["streaks"]
    assert states[0]["totals"] == states[1]["totals"] and states[0]["totals"]["skipped_prompts"] > 0
    # Every skip freed one slot that one refill prompt, planned on some process, filled.
    assert states[0]["totals"]["refill_prompts"] == states[0]["totals"]["skipped_prompts"]
    assert states[0]["stream_position"] == states[1]["stream_position"] > 0
    assert all(len(drawn) == 2 and planned == [8, 8] for rank in plans for drawn, planned in rank)


# ---------------------------------------------------------------------- in the trainer
def _data(n: int) -> Dataset:
    # Every gold answer is "1", which the extractor always returns: every group is all right.
    return Dataset.from_dict({"prompt": [f"{i}+{i}=" for i in range(n)], "answer": ["1"] * n})


def _config(tmp_path, **overrides) -> CGRPOConfig:
    # Six steps of two prompts, the fixed rule drawing every prompt to the grid's largest budget unless capped.
    options = dict(max_steps=6, max_completion_length=4, stopping_rule="fixed", stopping_options={"size": 8})
    return trainer_config(tmp_path, **{**options, **overrides})


def _trainer(model_dir, tmp_path, data: Dataset, **overrides) -> CGRPOTrainer:
    return CGRPOTrainer(
        model=model_dir,
        reward_funcs=lambda completions, **kw: [float(len(c) % 2) for c in completions],
        args=_config(tmp_path, **overrides),
        train_dataset=data,
        answer_extractor=lambda text: "1",
    )


def test_greso_in_the_trainer_skips_agreeing_prompts_and_keeps_every_batch_full(tiny_model_dir, tmp_path):
    # Four prompts, two per step: from the third step on every prompt has agreed before.
    trainer = _trainer(tiny_model_dir, tmp_path, _data(4), prompt_allocator="greso")
    trainer.train()
    totals, allocation = trainer.cgrpo_totals, trainer.allocation_totals
    assert totals["groups"] == 2 * 6
    assert allocation["skipped_prompts"] > 0 and allocation["refill_prompts"] == allocation["skipped_prompts"]
    assert totals["train_rollouts"] == allocation["planned_rollouts"] == 8 * 2 * 6
    logged = [entry for entry in trainer.state.log_history if "allocation/skipped_prompts_total" in entry]
    assert logged[-1]["allocation/skipped_prompts_total"] == allocation["skipped_prompts"]


def test_planned_rollouts_cap_what_a_prompt_draws(tiny_model_dir, tmp_path):
    trainer = _trainer(
        tiny_model_dir, tmp_path, _data(8), prompt_allocator="knapsack", allocation_rollouts_per_prompt=4, max_steps=2
    )
    trainer.train()
    # Unseen prompts share the total evenly: 4 each, below the fixed rule's 8.
    assert dict(trainer.budget_histogram) == {4: 4}
    assert trainer.cgrpo_totals["train_rollouts"] == trainer.allocation_totals["planned_rollouts"] == 16


def test_the_allocators_state_is_checkpointed_and_restored(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path / "a", _data(4), prompt_allocator="greso", max_steps=3)
    trainer.train()
    trainer.save_own_state(tmp_path)
    fresh = _trainer(tiny_model_dir, tmp_path / "b", _data(4), prompt_allocator="greso")
    fresh.load_own_state(tmp_path)
    assert fresh._allocation.state_dict() == trainer._allocation.state_dict()
    assert fresh._allocation.state_dict()["allocator"]["streaks"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"prompt_allocator": "gresso"}, "did you mean 'greso'"),
        ({"prompt_allocator": "greso", "allocator_options": {"floors": 0.1}}, "no option 'floors'"),
        ({"prompt_allocator": "knapsack", "allocation_rollouts_per_prompt": 1}, "between the grid's smallest"),
        ({"prompt_allocator": "greso", "drop_unanimous": True}, "use one of them"),
        ({"allocation_rollouts_per_prompt": 4}, "set prompt_allocator"),
    ],
)
def test_bad_allocation_options_are_refused(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        _config(tmp_path, **overrides)


def test_an_allocator_needs_the_gold_answers(tiny_model_dir, tmp_path):
    data = Dataset.from_dict({"prompt": ["1+1="]})
    with pytest.raises(ValueError, match="prompt_allocator='greso' reads each training prompt's reward"):
        _trainer(tiny_model_dir, tmp_path, data, prompt_allocator="greso")


def test_the_docs_recipe_for_an_allocator_runs(monkeypatch):
    text = (REPO / "docs" / "method.md").read_text()
    recipe = text.split("**Your own allocator**")[1].split("```python\n")[1].split("```")[0]
    monkeypatch.setattr(base, "ALLOCATORS", dict(base.ALLOCATORS))
    exec(compile(recipe, "docs/method.md", "exec"), {})
    allocation = _allocation("skip_solved")
    plans = _run(allocation, BATCHES[:4])
    # The always-right prompts (0, 3, 6) are skipped once solved and replaced.
    assert all(len(drawn) == 4 for drawn, _ in plans) and allocation.totals["skipped_prompts"] >= 2


# ---------------------------------------------------------------------- Reinforce-Ada in the trainer
def test_the_balanced_rule_stops_once_both_sides_are_there():
    rule = get_rule("balanced")("aps", count=2)
    assert not rule.stops(4, [None] * 4, [1.0, 1.0, 1.0, 0.0], None, None)
    assert rule.stops(4, [None] * 4, [1.0, 0.0, 1.0, 0.0], None, None)
    # Two right so far: two more draws could bring the two wrong ones at 4, not at 3.
    assert rule.could_stop(4, [None] * 2, [1.0, 1.0], None) and not rule.could_stop(3, [None] * 2, [1.0, 1.0], None)


@pytest.mark.parametrize(("weighting", "factor"), [("none", 1.0), ("inverse_rate", 4.0)])
def test_a_balanced_group_trains_on_its_chosen_answers_against_the_pools_mean(
    tiny_model_dir, tmp_path, weighting, factor
):
    drawn: dict[int, int] = {}

    def third_draw_passes(completions, key):
        # Each prompt's third answer is its only right one: [wrong, wrong] at 2, then [right, wrong] at 4, where one
        # right and one wrong answer end the sampling.
        start = drawn.get(key, 0)
        drawn[key] = start + len(completions)
        return [start + i == 2 for i in range(len(completions))]

    def third_row_rewarded(completions, **kwargs):
        return [float(i % 4 == 2) for i in range(len(completions))]

    data = Dataset.from_dict({"prompt": [f"{i}+{i}=" for i in range(4)], "key": list(range(4))})
    trainer = CGRPOTrainer(
        model=tiny_model_dir,
        reward_funcs=third_row_rewarded,
        args=trainer_config(
            tmp_path,
            score="first_success",
            stopping_rule="balanced",
            stopping_options={"count": 1},
            balanced_group_size=2,
            balanced_weighting=weighting,
            scale_rewards="none",
        ),
        train_dataset=data,
        verifier=third_draw_passes,
    )
    trainer.model.train()
    rows = [dict(row) for row in data.select(range(2)) for _ in range(trainer.args.max_budget)]
    output = trainer._generate_and_score_completions(rows)
    assert dict(trainer.budget_histogram) == {4: 2} and trainer.cgrpo_totals["train_rollouts"] == 8
    # The learning signal counts the trained rows only: 4 with an advantage, of the 8 rollouts drawn.
    assert trainer.cgrpo_totals["signal_rows"] == 4 and trainer.cgrpo_totals["signal_rollouts"] == 8
    # Two rows per group trained on: the right answer at 1 - 1/4 and one wrong one at -1/4, times the factor.
    real = output["advantages"][~output["filler_rows"]]
    assert len(real) == 4
    for group in real.view(2, 2):
        assert sorted(group.tolist()) == pytest.approx([-0.25 * factor, 0.75 * factor])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"balanced_group_size": 4}, "set scale_rewards='none'"),
        ({"balanced_group_size": 16, "scale_rewards": "none"}, "between 2 and max"),
        ({"balanced_group_size": 4, "scale_rewards": "none", "prompt_allocator": "greso"}, "use one of them"),
        ({"balanced_weighting": "inverse"}, "balanced_weighting must be one of"),
        ({"stopping_rule": "balanced", "stopping_options": {"count": 0}}, "count must be a positive integer"),
    ],
)
def test_bad_balanced_group_options_are_refused(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        _config(tmp_path, **{"stopping_options": None, **overrides})


def test_the_allocators_budget_config_plans_and_its_prompts_recur():
    from snakemake.utils import update_config
    from test_config_checks import planned

    config = yaml.safe_load((REPO / "config" / "budget.yaml").read_text())
    update_config(config, yaml.safe_load((REPO / "config" / "overrides" / "budget_allocators.yaml").read_text()))
    planned(config)
    # GRPO at G = 4 visits every training prompt at least 4 times within the budget.
    assert config["budget"]["rollouts"] / (4 * config["splits"]["sizes"]["train"]) >= 4
    methods = {parse_run_name(run).method for run in static_runs(config)}
    assert {"grpo", "cgrpo", "esc", "balanced", "greso", "knapsack"} <= methods
