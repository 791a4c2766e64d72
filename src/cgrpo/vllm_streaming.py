"""Budget increments without a round barrier, on a vLLM engine.

Sampling in rounds makes each prompt wait, before its next increment is drawn, for the slowest prompt of the round: a
prompt whose two answers disagree must wait for every other prompt's increment to finish. Here a prompt's next
increment goes into the engine as soon as its previous one is finished and its stopping rule has decided, so the
engine's batch keeps running other prompts' work meanwhile, and a step waits for its longest chain of increments rather
than for its number of rounds times the slowest increment of each.

`stream_increments` drives any engine with vLLM's `LLMEngine` interface (`add_request`, `step`,
`has_unfinished_requests`); the trainer (`CGRPOTrainer`, `stream_increments=True`) hands it the colocated engine.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Decide", "Streamed", "final_only", "replaced", "stream_increments", "streams_increments"]

# (prompt index, token ids of the rows of its increment just finished) -> the budget to draw up to next, or None to stop.
Decide = Callable[[int, list[list[int]]], "int | None"]

# Request ids stay unique within the process: a colocated engine outlives every call.
_REQUEST_IDS = itertools.count()


@dataclass
class Streamed:
    """What `stream_increments` drew: per prompt its finished outputs in the order they were requested, and the
    number of increments of each prompt (its chain of decisions)."""

    outputs: list[list[Any]]
    increments: list[int]

    @property
    def budgets(self) -> list[int]:
        return [len(rows) for rows in self.outputs]


def stream_increments(engine, prompts: Sequence[Any], params, first: Sequence[int], decide: Decide) -> Streamed:
    """Draw each prompt up to `first[i]` samples, then up to whatever `decide` asks, until it returns None.

    Every row is one request with `params` (one sample each, as TRL's colocate mode lays its rows out), so a prompt's
    rows are independent draws whatever order the engine finishes them in. `decide(i, token_ids)` is called once per
    finished increment, with the token ids of that increment's rows in request order; it returns the total number of
    samples prompt `i` should reach next (more than it has), or None when the prompt stops.

    `params` must make the engine report requests once, when finished (vLLM's `RequestOutputKind.FINAL_ONLY`, which
    `LLM.generate` sets on its own calls).
    """
    outputs: list[list[Any]] = [[] for _ in prompts]
    increments = [0] * len(prompts)
    slots: dict[str, tuple[int, int]] = {}  # request id -> (prompt, row index within the prompt)
    increment_start = [0] * len(prompts)
    waiting = [0] * len(prompts)

    def submit(i: int, target: int) -> None:
        have = len(outputs[i])
        if target <= have:
            raise ValueError(f"decide asked prompt {i} to reach {target} samples, but it already has {have}.")
        outputs[i].extend([None] * (target - have))
        increments[i] += 1
        increment_start[i], waiting[i] = have, target - have
        for row in range(have, target):
            request_id = f"cgrpo-{next(_REQUEST_IDS)}"
            slots[request_id] = (i, row)
            engine.add_request(request_id, prompts[i], params)

    for i, target in enumerate(first):
        submit(i, target)
    while engine.has_unfinished_requests():
        for output in engine.step():
            if not output.finished:
                continue
            i, row = slots.pop(output.request_id)
            outputs[i][row] = output
            waiting[i] -= 1
            if waiting[i] == 0:
                target = decide(i, [list(out.outputs[0].token_ids) for out in outputs[i][increment_start[i] :]])
                if target is not None:
                    submit(i, target)
    return Streamed(outputs, increments)


def streams_increments(trainer) -> bool:
    """Whether `trainer` (a `CGRPOTrainer`) streams its increments: `stream_increments` on, vLLM in colocate mode on
    one device per engine, and a tokenizer TRL decodes plainly.

    With tensor parallelism TRL gathers the prompts of the whole group into each engine, and with a tokenizer that
    parses responses (transformers 5's `response_template` or `response_schema`) its completion texts are not the
    plain decoding the stream's decisions read; those keep the rounds.
    """
    args = trainer.args
    if not (args.stream_increments and trainer.use_vllm and trainer.vllm_mode == "colocate"):
        return False
    tokenizer = trainer._tokenizer
    parses = any(getattr(tokenizer, name, None) is not None for name in ("response_template", "response_schema"))
    return args.vllm_tensor_parallel_size == 1 and not parses


def final_only(params):
    """A copy of vLLM sampling parameters whose requests are reported once, finished, as `LLM.generate` sets them."""
    from vllm.sampling_params import RequestOutputKind

    params = params.clone()
    params.output_kind = RequestOutputKind.FINAL_ONLY
    return params


@contextlib.contextmanager
def replaced(owner: Any, name: str, value: Any) -> Iterator[None]:
    """Set the instance attribute `owner.name` to `value` for the block, then restore what was there (or remove it)."""
    missing = object()
    previous = owner.__dict__.get(name, missing)
    setattr(owner, name, value)
    try:
        yield
    finally:
        if previous is missing:
            delattr(owner, name)
        else:
            setattr(owner, name, previous)
