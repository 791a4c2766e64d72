"""`stream_increments` on an engine with vLLM's `LLMEngine` interface, whose requests take as many steps as asked."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from cgrpo.vllm_streaming import replaced, stream_increments


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


def test_an_increment_that_would_not_add_samples_is_an_error():
    engine = StepEngine({"p": 1})
    with pytest.raises(ValueError, match="reach 2 samples, but it already has 2"):
        stream_increments(engine, ["p"], None, [2], lambda i, ids: 2)


def test_replaced_restores_an_instance_attribute_or_removes_it():
    owner = SimpleNamespace(kept="spy")
    with replaced(owner, "kept", "stream"), replaced(owner, "added", 1):
        assert (owner.kept, owner.added) == ("stream", 1)
    assert owner.kept == "spy" and not hasattr(owner, "added")
