"""CGRPOTrainer with a real vLLM, the CPU build (`vllm-cpu`), on the shipped base model: colocate and server mode.

Run in the vLLM environment that `.ci/run` builds: `python -m pytest -q -m vllm` (left out of the README's test
command). Without vLLM installed the tests skip with the reason. The fake backend of `test_losses_and_backends.py`
keeps the checks a real backend cannot force (fixed completions and log-probs).
"""

from __future__ import annotations

import math
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import torch

from cgrpo import CGRPOConfig, CGRPOTrainer
from cgrpo.pipeline.tasks import get_task
from cgrpo.stopping import sampling_path
from cgrpo.support.user_code import completion_text, normalise_answer
from cgrpo.support.vllm_colocate import CPU_OPTIONS

pytestmark = pytest.mark.vllm

SHIPPED = Path(__file__).resolve().parents[1] / "resources" / "base_model" / "arithmetic"
GRID = [2, 4, 8]
PROMPTS_PER_STEP, CALIBRATION_EXAMPLES, CALIBRATION_BATCH = 4, 8, 4
STEPS = 3
# The colocated engine computes in float32 on CPU (`cgrpo.support.vllm_colocate.eager_cpu_engine`), as the policy
# does; its weights agree with the policy's well within two bf16 roundings, the tolerance of the bf16 engine TRL builds
# by default.
BF16_TOLERANCE = 2.0**-7
# Greedy completions this short end before the answer on some of the shipped model's solutions.
GREEDY_PROMPTS, GREEDY_LENGTH = 16, 20


@pytest.fixture(scope="module", autouse=True)
def vllm_cpu_environment():
    pytest.importorskip("vllm", reason="vLLM is not installed: .ci/run builds the environment these tests need")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


@pytest.fixture(scope="module")
def data():
    task = get_task("arithmetic", num_examples=64)
    dataset = task.to_prompt_dataset(task.load("train"))
    return task, dataset.select(range(CALIBRATION_EXAMPLES, 64)), dataset.select(range(CALIBRATION_EXAMPLES))


def _trainer(data, tmp_path, **overrides) -> CGRPOTrainer:
    task, train, calibration = data
    options = dict(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        budget_grid=GRID,
        max_steps=STEPS,
        per_device_train_batch_size=PROMPTS_PER_STEP * GRID[-1],
        max_completion_length=40,
        learning_rate=5e-3,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        seed=0,
        min_generation_prompts=1,
        recalibrate_every=1,
        calibration_batch_size=CALIBRATION_BATCH,
    )
    options.update(overrides)
    return CGRPOTrainer(
        model=str(SHIPPED),
        reward_funcs=task.reward_funcs,
        args=CGRPOConfig(**options),
        train_dataset=train,
        calibration_dataset=calibration,
        answer_extractor=task.extract,
    )


def _vllm_model(trainer):
    return trainer.vllm_generation.llm.llm_engine.model_executor.driver_worker.model_runner.model


def _weights_as_computed(trainer) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The same weights in vLLM and in the policy (in the engine's dtype), as plain tensors and, for vLLM's packed
    linear layers, as their outputs on a fixed probe."""
    engine, policy = _vllm_model(trainer).model, trainer.model.model
    dtype = engine.embed_tokens.weight.dtype
    probe = torch.randn(4, policy.config.hidden_size, generator=torch.Generator().manual_seed(0))
    probe = probe.to(dtype)
    attention = policy.layers[0].self_attn
    with torch.no_grad():
        # vLLM pads the vocabulary to a multiple of its own.
        vocabulary = policy.embed_tokens.weight.size(0)
        in_vllm = {
            "embed_tokens": engine.embed_tokens.weight[:vocabulary],
            "norm": engine.norm.weight,
            "qkv_proj": engine.layers[0].self_attn.qkv_proj(probe)[0],
        }
        as_engine = {
            name: layer.weight.to(dtype).float()
            for name, layer in {"q": attention.q_proj, "k": attention.k_proj, "v": attention.v_proj}.items()
        }
        in_policy = {
            "embed_tokens": policy.embed_tokens.weight,
            "norm": policy.norm.weight,
            "qkv_proj": torch.cat([probe.float() @ as_engine[name].T for name in "qkv"], dim=-1),
        }
    return (
        {name: value.float().clone() for name, value in in_vllm.items()},
        {name: value.detach().float().clone() for name, value in in_policy.items()},
    )


def _distance(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Largest difference between same-named tensors, relative to the tensor's largest entry."""
    return max(((a[name] - b[name]).abs().max() / b[name].abs().max()).item() for name in a)


def _runs(prompt_ids: list) -> list[int]:
    """Lengths of the runs of identical consecutive prompts of one request."""
    runs = [1]
    for previous, current in zip(prompt_ids, prompt_ids[1:]):
        if current == previous:
            runs[-1] += 1
        else:
            runs.append(1)
    return runs


def _rounds(paths: list[list[int]], server: bool) -> list[tuple[int, int | list[int]]]:
    """(rows, rows per prompt) of each round, given the budgets every prompt was drawn up to (`sampling_path`): per
    prompt in colocate mode (one increment, or the sorted distinct ones), their common divisor in server mode (TRL asks
    the server for that many samples of each listed prompt)."""
    calls = []
    for r in range(max(len(path) for path in paths)):
        steps = [path[r] - (path[r - 1] if r else 0) for path in paths if len(path) > r]
        distinct = sorted(set(steps))
        calls.append((sum(steps), math.gcd(*steps) if server else distinct[0] if len(distinct) == 1 else distinct))
    return calls


def _increments(paths: list[list[int]]) -> list[tuple[int, int]]:
    """(rows, rows per prompt) of every request of a streamed batch: one per increment of each prompt."""
    return [(b - a, b - a) for path in paths for a, b in zip([0, *path], path)]


class Recorder:
    """Spies on one trainer: stopping budgets, and batches before padding leaves them."""

    def __init__(self, trainer):
        self.budgets, self.paths, self.batches = [], [], []
        pad_groups, drop = trainer._pad_groups, trainer._drop_padded_rows

        def spy_pad_groups(rows):
            self.budgets.append([len(group) for group in rows])
            self.paths.append([_sampling_path(trainer, group) for group in rows])
            return pad_groups(rows)

        def spy_drop(output):
            self.batches.append(
                {
                    "pad": torch.tensor(trainer._pad_mask),
                    "mask": output["completion_mask"].clone(),
                    "ratio": output["importance_sampling_ratio"].clone(),
                    "sampling": output["sampling_per_token_logps"].clone(),
                }
            )
            return drop(output)

        trainer._pad_groups, trainer._drop_padded_rows = spy_pad_groups, spy_drop

    def expected_calls(self, server: bool = False, streamed: bool = False) -> list[tuple]:
        """(rows, rows per prompt) of every generation call: each step's calibration, then its rounds, or streamed,
        one call per increment of each prompt."""
        calibration = [(CALIBRATION_BATCH * GRID[-1], GRID[-1])] * (CALIBRATION_EXAMPLES // CALIBRATION_BATCH)
        sampling = _increments if streamed else lambda paths: _rounds(paths, server)
        return [call for paths in self.paths for call in calibration + sampling(paths)]


def _sampling_path(trainer, group: list[tuple]) -> list[int]:
    """The budgets the trainer's rule drew this group up to, replayed on its completions' answers."""
    answers = [normalise_answer(trainer.answer_extractor(completion_text(row[2]))) for row in group]
    padded = answers + [None] * (GRID[-1] - len(answers))
    skip = trainer.args.skip_impossible_budgets
    path = sampling_path(trainer.stopping_rule, trainer.stopping_fit, GRID, padded, None, random.Random(0), skip=skip)
    assert path[-1] == len(group), (path, answers)
    return path


class ColocateRecorder(Recorder):
    """Also spies on the colocated engine: every request's rows and prompt layout, and its weights at that moment."""

    def __init__(self, trainer):
        super().__init__(trainer)
        self.requests, self.mismatch, self.policy = [], [], []
        llm = trainer.vllm_generation.llm
        generate = llm.generate

        def spy_generate(prompts, *args, **kwargs):
            ids = [prompt["prompt_token_ids"] for prompt in prompts]
            runs = set(_runs(ids))
            self.requests.append((len(ids), runs.pop() if len(runs) == 1 else sorted(runs)))
            in_vllm, in_policy = _weights_as_computed(trainer)
            self.mismatch.append(_distance(in_vllm, in_policy))
            self.policy.append(in_policy)
            return generate(prompts, *args, **kwargs)

        llm.generate = spy_generate


class StreamRecorder(Recorder):
    """Also spies on the colocated engine's requests of streamed increments: how many, the weights vLLM holds at each
    step's first one, and how many continuations (a prompt's later increments) went in while other requests ran."""

    def __init__(self, trainer):
        super().__init__(trainer)
        self.requests, self.continuations, self.overlapping, self.mismatch = 0, 0, 0, []
        engine = trainer.vllm_generation.llm.llm_engine
        add_request, step = engine.add_request, engine.step
        steps, first_seen, synced_at = [0], {}, set()

        def spy_step(*args, **kwargs):
            steps[0] += 1
            return step(*args, **kwargs)

        def spy_add_request(request_id, prompt, *args, **kwargs):
            if str(request_id).startswith("cgrpo-"):
                self.requests += 1
                if trainer.state.global_step not in synced_at:
                    synced_at.add(trainer.state.global_step)
                    self.mismatch.append(_distance(*_weights_as_computed(trainer)))
                key = (trainer.state.global_step, tuple(prompt["prompt_token_ids"]))
                if steps[0] > first_seen.setdefault(key, steps[0]):
                    self.continuations += 1
                    self.overlapping += engine.has_unfinished_requests()
            return add_request(request_id, prompt, *args, **kwargs)

        engine.add_request, engine.step = spy_add_request, spy_step


def _no_hf_generate(trainer):
    def refuse(*args, **kwargs):
        raise AssertionError("training generated with HF generate instead of vLLM")

    trainer.model.generate = refuse


@pytest.fixture(scope="module")
def colocate(data, tmp_path_factory):
    """A C-GRPO run of a few steps in colocate mode, calibrating before every step, with its recorder."""
    trainer = _trainer(
        data,
        tmp_path_factory.mktemp("colocate"),
        use_vllm=True,
        vllm_mode="colocate",
        stream_increments=False,
        **CPU_OPTIONS,
    )
    initial = {name: value.clone() for name, value in trainer.model.state_dict().items()}
    recorder = ColocateRecorder(trainer)
    _no_hf_generate(trainer)
    trainer.train()
    return trainer, recorder, initial


@pytest.fixture(scope="module")
def streamed(data, tmp_path_factory):
    """The same run with the library's default: increments streamed into the colocated engine, no rounds."""
    trainer = _trainer(data, tmp_path_factory.mktemp("streamed"), use_vllm=True, vllm_mode="colocate", **CPU_OPTIONS)
    recorder = StreamRecorder(trainer)
    _no_hf_generate(trainer)
    trainer.train()
    return trainer, recorder


def test_colocate_trains_with_vllm_generation(colocate):
    trainer, recorder, _ = colocate
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert trainer.state.global_step == STEPS and len(losses) == STEPS
    assert all(torch.isfinite(torch.tensor(losses)))
    assert sum(trainer.budget_histogram.values()) == STEPS * PROMPTS_PER_STEP


def test_calibration_and_increments_reach_vllm_in_the_sizes_the_stopping_rule_asks_for(colocate):
    trainer, recorder, _ = colocate
    assert recorder.requests == recorder.expected_calls()
    assert [record["step"] for record in trainer.calibration_history] == list(range(STEPS))
    # The run must have exercised early stopping and continuation both, or the sizes above would be trivial.
    stopped = {budget for budgets in recorder.budgets for budget in budgets}
    assert GRID[-1] in stopped and len(stopped) > 1, stopped


def test_padded_rows_have_importance_ratio_exactly_one(colocate):
    _, recorder, _ = colocate
    padded_batches = [batch for batch in recorder.batches if batch["pad"].any()]
    assert padded_batches, "no prompt stopped early: no padded rows to check"
    for batch in padded_batches:
        pad, real = batch["pad"], ~batch["pad"]
        assert torch.all(batch["ratio"][pad] == 1.0)
        assert torch.all(torch.isnan(batch["sampling"][pad, 0]))
        assert torch.isfinite(batch["sampling"][real][batch["mask"][real].bool()]).all()
    # vLLM's float32 kernels and the policy's round differently, so real rows do get a (tiny) correction.
    assert any((batch["ratio"][~batch["pad"]] != 1.0).any() for batch in recorder.batches)


def test_the_colocated_engine_on_cpu_is_eager_and_float32(colocate):
    # TRL asks for a compiled engine in the model's dtype: on a CPU without AVX-512 its bf16 layers fell back to
    # unpacked matmuls, and drew rows about 5 times slower than this one (docs/real-model.md).
    trainer, _, _ = colocate
    model_config = trainer.vllm_generation.llm.llm_engine.vllm_config.model_config
    assert model_config.enforce_eager and model_config.dtype == torch.float32


def test_policy_weights_reach_vllm_before_every_generation(colocate):
    _, recorder, _ = colocate
    assert max(recorder.mismatch) <= BF16_TOLERANCE, recorder.mismatch
    # Training moved the policy far beyond that tolerance, so a missed sync would show.
    assert _distance(recorder.policy[0], recorder.policy[-1]) > 4 * BF16_TOLERANCE


def test_streamed_increments_train_with_the_rules_decisions_and_no_rounds(streamed):
    trainer, recorder = streamed
    assert trainer._streams and trainer.state.global_step == STEPS
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == STEPS and all(torch.isfinite(torch.tensor(losses)))
    # Every group's rows are one request each, and its size is where the rule stops on its answers (`_sampling_path`
    # replays the rule on them in the Recorder), so the stream decides as the rounds do.
    budgets = [budget for step in recorder.budgets for budget in step]
    assert len(budgets) == STEPS * PROMPTS_PER_STEP and recorder.requests == sum(budgets)
    assert set(budgets) - {GRID[0]}, "every prompt stopped at the first budget: no increment was streamed"
    # Later increments went in while other prompts' requests were still running: no barrier held them back.
    assert recorder.continuations and recorder.overlapping, (recorder.continuations, recorder.overlapping)
    rounds = [
        entry["cgrpo/generation_rounds"] for entry in trainer.state.log_history if "cgrpo/generation_rounds" in entry
    ]
    assert len(rounds) == STEPS and max(rounds) > 1
    assert max(recorder.mismatch) <= BF16_TOLERANCE and len(recorder.mismatch) == STEPS, recorder.mismatch


def _stopping_on_greedy_answers(trainer, batch_examples) -> dict:
    """Calibrate and sample one batch in budget increments from a fresh stopping state; what it decided."""
    trainer.state.global_step, trainer.cgrpo_state.stopping_rng = 0, random.Random("greedy")
    trainer.model.train()
    thresholds = trainer.calibrate()
    budgets, answers = [], []
    pad_groups = trainer._pad_groups

    def spy(rows):
        budgets.extend(len(group) for group in rows)
        answers.extend(trainer.answer_extractor(group[0][2]) for group in rows)
        return pad_groups(rows)

    trainer._pad_groups = spy
    try:
        trainer._batch_examples = batch_examples
        trainer._generate([example["prompt"] for example in batch_examples])
    finally:
        trainer._pad_groups = pad_groups
    return {"qhat": thresholds.qhat, "solve_rate": thresholds.solve_rate, "budgets": budgets, "answers": answers}


@pytest.mark.parametrize("stream", [False, True], ids=["rounds", "streamed"])
def test_stopping_with_vllm_matches_hf_generate_on_greedy_answers(colocate, data, tmp_path, monkeypatch, stream):
    # Greedy decoding makes every prompt's answers deterministic, so the two backends must stop alike. Completions
    # cut at GREEDY_LENGTH tokens lose the answer of the longer solutions, so some prompts walk the grid. The shipped
    # model is loaded back into the trained policy, which reaches vLLM through the weight sync.
    trainer, _, initial = colocate
    trainer.model.load_state_dict(initial)
    monkeypatch.setattr(trainer.vllm_generation, "temperature", 0.0)
    monkeypatch.setattr(trainer.vllm_generation, "max_completion_length", GREEDY_LENGTH)
    monkeypatch.setattr(trainer, "_streams", stream)
    hf = _trainer(data, tmp_path, max_completion_length=GREEDY_LENGTH)
    hf.generation_config.do_sample = False
    examples = [dict(row) for row in data[1].select(range(GREEDY_PROMPTS)) for _ in range(GRID[-1])]
    with_vllm = _stopping_on_greedy_answers(trainer, examples)
    with_hf = _stopping_on_greedy_answers(hf, examples)
    assert with_vllm == with_hf
    assert GRID[0] in with_hf["budgets"] and GRID[-1] in with_hf["budgets"], with_hf


def test_a_calibration_on_vllm_draws_by_the_runs_seed(data, tmp_path, monkeypatch):
    # TRL seeds its colocated engine with the process index, so every run's calibration drew the same outcomes; each
    # sample now has a seed of its own, from the run's. The 40 prompts of 119 to 124 tokens, each different from its
    # first token, go into one call: more prompt tokens than an engine step takes (4,096), which splits a prefill,
    # and rewinding a seeded sample's generator crashed the CPU engine ("CPU Generator does not use offset").
    task, train, _ = data
    questions = list(train["prompt"])
    calibration = train.select(range(40)).map(
        lambda row, i: {"prompt": " ".join(questions[i : i + 14])}, with_indices=True
    )
    trainer = _trainer(
        (task, train, calibration),
        tmp_path,
        use_vllm=True,
        vllm_mode="colocate",
        stream_increments=False,
        # TRL lets the engine run as many sequences at once as a generation batch has rows.
        per_device_train_batch_size=128,
        calibration_batch_size=40,
        **CPU_OPTIONS,
    )

    def outcomes(seed: int) -> list[list]:
        monkeypatch.setattr(trainer.args, "seed", seed)
        return trainer.sample_calibration_pools()[0].outcomes

    first = outcomes(0)
    other = outcomes(1)
    # The same seed draws the same outcomes after other draws moved the engine's own random state.
    assert outcomes(0) == first
    assert other != first and any(len(set(drawn)) > 1 for drawn in first)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_until_healthy(server: subprocess.Popen, url: str, log: Path, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"the vLLM server exited with {server.returncode}:\n{log.read_text()[-5000:]}")
        try:
            if requests.get(f"{url}/health", timeout=5).ok:
                return
        except requests.ConnectionError:
            pass
        time.sleep(2)
    pytest.fail(f"the vLLM server did not answer within {timeout:.0f} s:\n{log.read_text()[-5000:]}")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A vLLM server process on the shipped model, started with TRL's flags; its URL."""
    from trl.scripts.vllm_serve import ScriptArguments, build_command

    port = _free_port()
    command = build_command(
        ScriptArguments(model=str(SHIPPED), host="127.0.0.1", port=port, gpu_memory_utilization=0.1, max_model_len=256)
    )
    # `vllm serve` looks its own version up under the distribution name "vllm", which the CPU build (vllm-cpu) does
    # not have; the OpenAI server module takes the same flags.
    serve = command.index("serve")
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", *command[serve + 1 :]]
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    log = tmp_path_factory.mktemp("server") / "server.log"
    with log.open("w") as output:
        process = subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_until_healthy(process, url, log)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()


@pytest.mark.parametrize("stream", [False, True], ids=["rounds", "streamed"])
def test_server_mode_samples_increments_through_a_real_server(server, data, tmp_path, monkeypatch, stream):
    from trl.generation.vllm_client import VLLMClient

    calls, pushed = [], []
    generate = VLLMClient.generate

    def spy_generate(self, prompts, *args, n=1, **kwargs):
        calls.append((len(prompts) * n, n))
        return generate(self, prompts, *args, n=n, **kwargs)

    def record_push(self, metadata, named_params):
        pushed.append([name for name, _ in named_params])

    # TRL pushes weights to the server over an NCCL group joined from a CUDA device, which a CPU machine lacks: only
    # that transport is replaced (no group; the trainer still walks every parameter it would send). Generation, the
    # server's log-prob mode check and its prefix-cache reset go to the real server.
    monkeypatch.setattr(VLLMClient, "init_communicator", lambda self, device=0: None)
    monkeypatch.setattr(VLLMClient, "update_named_params", record_push)
    monkeypatch.setattr(VLLMClient, "generate", spy_generate)
    trainer = _trainer(
        data,
        tmp_path,
        use_vllm=True,
        vllm_mode="server",
        vllm_server_base_url=server,
        max_steps=2,
        stream_increments=stream,
    )
    assert trainer._streams == stream
    recorder = Recorder(trainer)
    _no_hf_generate(trainer)
    trainer.train()
    # Streamed, every increment is its own request, sent from threads in no fixed order, and each group's size is
    # where the rule stops on its answers (the Recorder replays the rule on them).
    expected = recorder.expected_calls(server=True, streamed=stream)
    assert (sorted(calls) if stream else calls) == (sorted(expected) if stream else expected)
    assert {budget for budgets in recorder.budgets for budget in budgets} - {GRID[0]}
    names = [name for name, _ in trainer.model.named_parameters()]
    assert pushed == [names, names]
    padded = torch.cat([batch["pad"] for batch in recorder.batches])
    assert padded.any() and all(torch.all(batch["ratio"][batch["pad"]] == 1.0) for batch in recorder.batches)
