"""Budget increments without a round barrier, on a vLLM engine.

Sampling in rounds makes each prompt wait, before its next increment is drawn, for the slowest prompt of the round: a
prompt whose two answers disagree must wait for every other prompt's increment to finish. Here a prompt's next
increment goes into the engine as soon as its previous one is finished and its stopping rule has decided, so the
engine's batch keeps running other prompts' work meanwhile, and a step waits for its longest chain of increments rather
than for its number of rounds times the slowest increment of each.

`stream_increments` drives any engine with vLLM's `LLMEngine` interface (`add_request`, `step`,
`has_unfinished_requests`); the trainer (`CGRPOTrainer`, `stream_increments=True`) hands it the colocated engine, or
in server mode a `ServerEngine`, which sends each increment to the vLLM server as its own HTTP request, concurrently,
so that the server batches whatever is in flight.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

__all__ = [
    "BudgetStream",
    "Decide",
    "StreamPlan",
    "ServerEngine",
    "Streamed",
    "colocate_rows",
    "final_only",
    "replaced",
    "server_rows",
    "stream_increments",
    "streams_increments",
]

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


@dataclass
class StreamPlan:
    """What a streamed generation batch decided, per prompt: the budget it stopped at and its completions' texts as
    its rule read them and their outcomes; and the longest chain of increments (the rounds a step waited for)."""

    budgets: list[int]
    texts: list[list[str]]
    outcomes: list[list]
    chain: int

    def part(self, start: int, stop: int) -> StreamPlan:
        """The plan of prompts `start` to `stop` (one process's, in server mode)."""
        return StreamPlan(self.budgets[start:stop], self.texts[start:stop], self.outcomes[start:stop], self.chain)


class BudgetStream:
    """The stopping decisions of one streamed generation batch (the trainer's own functions do the deciding).

    Args:
        examples: one example per prompt, in the order of the prompts streamed.
        width: `max(budget_grid)`: a prompt that reaches it stops.
        decode: token ids of completions -> their texts.
        outcomes: (texts, example) -> the outcomes the rule reads (answers, or passes).
        stops: (budget, outcomes, example) -> whether the rule stops there.
        next_budget: (outcomes, example) -> the budget to draw up to next.
    """

    def __init__(self, examples: Sequence[dict], width: int, decode, outcomes, stops, next_budget):
        self.examples, self.width = examples, width
        self.decode, self.outcomes, self.stops, self.next_budget = decode, outcomes, stops, next_budget
        self.drawn: list[list] = [[] for _ in examples]
        self.texts: list[list[str]] = [[] for _ in examples]
        self.streamed: Streamed | None = None

    def decide(self, i: int, token_ids: list[list[int]]) -> int | None:
        """`Decide` for `stream_increments`: read the new completions of prompt `i` and say where it goes next."""
        texts = self.decode(token_ids)
        self.texts[i] += texts
        self.drawn[i] += self.outcomes(texts, self.examples[i])
        example, drawn = self.examples[i], self.drawn[i]
        if len(drawn) >= self.width or self.stops(len(drawn), drawn, example):
            return None
        return self.next_budget(drawn, example)

    def run(self, engine, prompts: Sequence[Any], params) -> Streamed:
        first = [self.next_budget([], example) for example in self.examples]
        self.streamed = stream_increments(engine, prompts, params, first, self.decide)
        return self.streamed

    def plan(self) -> StreamPlan | None:
        """The decisions, once `run` has streamed (None before, as on the processes of server mode that do not)."""
        if self.streamed is None:
            return None
        return StreamPlan(self.streamed.budgets, self.texts, self.drawn, max(self.streamed.increments))


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

    try:
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
    finally:
        # A failed decision leaves requests in a colocated engine, which outlives the call: the next would get them.
        if slots and hasattr(engine, "abort_request"):
            engine.abort_request(list(slots))
    return Streamed(outputs, increments)


def streams_increments(trainer) -> bool:
    """Whether `trainer` (a `CGRPOTrainer`) streams its increments: `stream_increments` on, vLLM in server mode or in
    colocate mode on one device per engine, and a tokenizer TRL decodes plainly.

    With tensor parallelism TRL gathers the prompts of the whole group into each colocated engine, and with a
    tokenizer that parses responses (transformers 5's `response_template` or `response_schema`) its completion texts
    are not the plain decoding the stream's decisions read; those keep the rounds.
    """
    args = trainer.args
    if not (args.stream_increments and trainer.use_vllm):
        return False
    tokenizer = trainer._tokenizer
    if any(getattr(tokenizer, name, None) is not None for name in ("response_template", "response_schema")):
        return False
    return trainer.vllm_mode == "server" or args.vllm_tensor_parallel_size == 1


class ServerEngine:
    """vLLM's engine interface over TRL's `VLLMClient.generate` (`generate`, called with `sampling`).

    The rows a stream adds for one prompt between two steps (one increment) go out as one HTTP request for that many
    samples, each request in a thread of its own, so that the server batches every increment in flight.
    """

    def __init__(self, generate: Callable[..., dict], sampling: dict[str, Any], workers: int = 256):
        self.generate, self.sampling = generate, sampling
        self.pool = ThreadPoolExecutor(max_workers=workers)
        self.pending: dict[tuple[int, ...], list[str]] = {}  # prompt -> ids of the rows not yet sent
        self.running: dict[Future, list[str]] = {}

    def __enter__(self) -> ServerEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.pool.shutdown(cancel_futures=True)

    def add_request(self, request_id: str, prompt: list[int], params: Any = None) -> None:
        self.pending.setdefault(tuple(prompt), []).append(request_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self.pending or self.running)

    def step(self) -> list[SimpleNamespace]:
        for prompt, ids in self.pending.items():
            request = self.pool.submit(self.generate, prompts=[list(prompt)], n=len(ids), **self.sampling)
            self.running[request] = ids
        self.pending = {}
        done, _ = wait(self.running, return_when=FIRST_COMPLETED)
        return [output for future in done for output in _server_outputs(self.running.pop(future), future.result())]


def _server_outputs(request_ids: list[str], result: dict) -> list[SimpleNamespace]:
    """The samples of one `ServerEngine` request, one per row, shaped as vLLM's `RequestOutput` where the stream reads
    it."""
    outputs = []
    for j, request_id in enumerate(request_ids):
        row = {key: None if values is None else values[j] for key, values in result.items() if key != "prompt_ids"}
        sample = SimpleNamespace(token_ids=row["completion_ids"], row=row)
        outputs.append(SimpleNamespace(request_id=request_id, finished=True, outputs=[sample]))
    return outputs


def colocate_rows(streamed: Streamed, width: int) -> list[Any]:
    """The streamed outputs as `LLM.generate` returns them for `width` rows per prompt (a prompt's missing rows
    repeat its last drawn one)."""
    return [rows[min(j, len(rows) - 1)] for rows in streamed.outputs for j in range(width)]


def server_rows(streamed: Streamed, prompts: list[list[int]], width: int) -> dict[str, list]:
    """The streamed outputs as `VLLMClient.generate` returns them for `prompts` at n = `width` (missing rows as in
    `colocate_rows`)."""
    rows = [output.outputs[0].row for output in colocate_rows(streamed, width)]
    # A key the server left out (no log-probs asked for) stays None, as in the client's own answer.
    columns = {key: None if rows[0][key] is None else [row[key] for row in rows] for key in rows[0]}
    return {"prompt_ids": list(prompts), **columns}


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
