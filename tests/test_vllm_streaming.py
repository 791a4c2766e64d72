"""`stream_increments` on an engine with vLLM's `LLMEngine` interface, whose requests take as many steps as asked."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from cgrpo.vllm_streaming import BudgetStream, ServerEngine, replaced, server_rows, stream_increments


class StepEngine:
    """Runs every request at once; a request on prompt p finishes after `steps[p]` engine steps, and its one sample
    is the token ids [p, number of requests added before it]."""

    def __init__(self, steps: dict[str, int]):
        self.steps, self.running, self.added, self.clock = steps, {}, [], 0

    def add_request(self, request_id, prompt, params):
        self.running[request_id] = (prompt, self.clock + self.steps[prompt], len(self.added))
        self.added.append((self.clock, prompt))

    def has_unfinished_requests(self):
        return bool(self.running)

    def step(self):
        self.clock += 1
        done = [rid for rid, (_, end, _) in self.running.items() if end <= self.clock]
        outputs = []
        for rid in done:
            prompt, _, order = self.running.pop(rid)
            sample = SimpleNamespace(token_ids=(prompt, order))
            outputs.append(SimpleNamespace(request_id=rid, finished=True, outputs=[sample]))
        # Unfinished requests may be reported too (vLLM's cumulative outputs); they must be ignored.
        outputs += [SimpleNamespace(request_id=rid, finished=False, outputs=[]) for rid in self.running]
        return outputs[::-1]


def test_a_prompt_draws_its_next_increment_while_slower_prompts_are_still_running():
    engine = StepEngine({"fast": 1, "slow": 10})
    calls = []

    def decide(i, token_ids):
        calls.append((i, token_ids))
        have = sum(len(ids) for j, ids in calls if j == i)
        return {0: {2: 4, 4: 8}, 1: {2: None}}[i].get(have)

    streamed = stream_increments(engine, ["fast", "slow"], None, [2, 2], decide)
    assert streamed.budgets == [8, 2] and streamed.increments == [3, 1]
    # The fast prompt's three increments ran inside the slow prompt's first one: no round waited for it.
    fast_clocks = sorted({clock for clock, prompt in engine.added if prompt == "fast"})
    assert fast_clocks == [0, 1, 2] and engine.clock == 10
    # decide sees each increment's rows once, in request order, and the outputs keep that order.
    assert calls[:3] == [
        (0, [["fast", 0], ["fast", 1]]),
        (0, [["fast", 4], ["fast", 5]]),
        (0, [["fast", 6 + j] for j in range(4)]),
    ]
    assert [list(out.outputs[0].token_ids) for out in streamed.outputs[0]] == [
        ["fast", j] for j in (0, 1, 4, 5, 6, 7, 8, 9)
    ]


def test_an_increment_that_would_not_add_samples_is_an_error_and_the_requests_left_are_aborted():
    engine = StepEngine({"p": 1, "q": 3})
    engine.abort_request = lambda ids: [engine.running.pop(rid) for rid in ids]
    with pytest.raises(ValueError, match="reach 2 samples, but it already has 2"):
        stream_increments(engine, ["p", "q"], None, [2, 2], lambda i, ids: 2)
    assert not engine.running


def test_replaced_restores_an_instance_attribute_or_removes_it():
    owner = SimpleNamespace(kept="spy")
    with replaced(owner, "kept", "stream"), replaced(owner, "added", 1):
        assert (owner.kept, owner.added) == ("stream", 1)
    assert owner.kept == "spy" and not hasattr(owner, "added")


def test_the_server_engine_sends_each_increment_as_one_request_and_runs_them_concurrently():
    in_flight, most, calls = [0], [0], []
    lock = threading.Lock()

    def generate(prompts, n, temperature, logprobs):
        assert temperature == 0.5 and logprobs == 0
        with lock:
            calls.append((prompts[0][0], n))
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
        time.sleep(0.05 if prompts[0] == [1] else 0.01)
        with lock:
            in_flight[0] -= 1
        completions = [[prompts[0][0], j] for j in range(n)]
        return {"prompt_ids": prompts, "completion_ids": completions, "logprobs": [[[-0.5], [-0.1]]] * n}

    decided = []

    def decide(i, token_ids):
        # The slow prompt 1 stops at 2; prompt 2 draws 4 more once, while prompt 1's request still runs.
        decided.append(i)
        return 6 if decided == [1] else None

    with ServerEngine(generate, {"temperature": 0.5, "logprobs": 0}) as engine:
        streamed = stream_increments(engine, [[1], [2]], None, [2, 2], decide)
    assert streamed.budgets == [2, 6] and decided == [1, 1, 0]
    assert sorted(calls) == [(1, 2), (2, 2), (2, 4)] and most[0] == 2
    answer = server_rows(streamed, [[1], [2]], 6)
    assert answer["prompt_ids"] == [[1], [2]]
    first, second = [[1, j] for j in (0, 1)], [[2, j] for j in (0, 1, 0, 1, 2, 3)]
    assert answer["completion_ids"] == first + [first[-1]] * 4 + second
    assert answer["logprobs"] == [[[-0.5], [-0.1]]] * 12 and "logprob_token_ids" not in answer


def test_a_budget_stream_stops_each_prompt_where_its_rule_does_and_plans_each_process_part():
    # Answers are the prompt's name and the request's order; prompt "same" always answers alike, "mixed" never.
    grid = [2, 4, 8]
    engine = StepEngine({"same": 1, "mixed": 2})

    def outcomes(texts, example):
        return [example["answer"] if example["answer"] == "same" else text for text in texts]

    stream = BudgetStream(
        [{"answer": "same"}, {"answer": "mixed"}],
        grid[-1],
        decode=lambda ids: [f"{p}{order}" for p, order in ids],
        outcomes=outcomes,
        stops=lambda k, drawn, example: len(set(drawn)) == 1,
        next_budget=lambda drawn, example: next(k for k in grid if k > len(drawn)),
    )
    assert stream.plan() is None
    stream.run(engine, ["same", "mixed"], None)
    plan = stream.plan()
    assert plan.budgets == [2, 8] and plan.chain == 3
    assert plan.texts[0] == ["same0", "same1"] and len(plan.texts[1]) == 8
    assert plan.part(1, 2).budgets == [8] and plan.part(1, 2).chain == 3
