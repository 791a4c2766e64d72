"""Evaluate one model on the eval split: fixed-k accuracy, conformal dynamic k and per-budget coverage.

The conformal thresholds are calibrated on the calibration split with the evaluated model itself, then applied to
prefixes of the same eval samples that the fixed-k metrics use. Each random purpose (greedy pass, eval samples,
calibration samples, APS randomisation) draws from its own stream, seeded by :func:`cgrpo.pipeline.metrics.statistics.purpose_seed`.
Samples come from HF generate, or from a vLLM engine with ``evaluation.backend: vllm`` (seeded from the same streams).

Two kinds of score (``evaluation.score``, the run's ``cgrpo.options.score``):

* ``aps`` (math tasks): a sample is correct when its extracted answer equals the gold answer;
* ``first_success`` and ``pass_rate`` (execution tasks, e.g. code): a sample is correct when the task's verifier
  passes it (``task.verifier(completions=..., **columns)`` per prompt, with the prompt's columns but ``prompt``), so
  accuracy is the pass rate. The majority vote is taken over the extracted programs: maj@k counts a prompt when its
  most frequent program among the first k samples passes (:func:`execution_fixed_k_metrics`).

Both write the same record, so reporting reads either.
"""

from __future__ import annotations

import json
import logging
import random
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...calibration import SCORES, Thresholds, calibration_scores, fit_thresholds
from ...support.models import load_model, load_tokenizer
from ...support.user_code import VERIFIER_TIMEOUT_S, verify
from ..configuration.specs import EvaluationSpec
from ..metrics.accuracy import (
    correct_flags,
    dynamic_k_summary,
    greedy_accuracy,
    maj_at_k,
    majority_answer,
    mean_accuracy,
    mean_pass_at_k,
    per_prompt_accuracy,
)
from ..metrics.coverage import (
    coverage_at_k,
    post_selection_coverage,
    split_coverage_distribution,
)
from ..metrics.statistics import purpose_seed
from ..tasks import check_task_score, get_task
from ..tasks.splits import load_split
from .sampling import generate_completions, generate_completions_vllm
from .vllm_backend import load_llm

logger = logging.getLogger(__name__)


def evaluate_model(spec: EvaluationSpec | dict[str, Any], out_path: str | Path) -> None:
    """Evaluate `spec.model` and write every metric as JSON to `out_path` (see docs/pipeline.md, "Reading the outputs")."""
    spec = EvaluationSpec.from_dict(spec)
    settings = spec.evaluation
    score = settings["score"]
    if score not in SCORES:
        raise ValueError(f"Unknown score {score!r}; use one of {', '.join(SCORES)}.")
    start = time.perf_counter()
    task = get_task(spec.task["name"], **spec.task["options"])
    check_task_score(task, score)
    eval_set = task.to_prompt_dataset(load_split(spec.splits, "eval"))
    calibration_set = task.to_prompt_dataset(load_split(spec.splits, "calibration"))
    sample = _sampler(spec)
    if score != "aps":
        record = _execution_record(task, sample, eval_set, calibration_set, settings, spec)
        _write_record(record, start, out_path)
        return
    eval_golds, calibration_golds = list(eval_set["answer"]), list(calibration_set["answer"])
    greedy = [task.extract(texts[0]) for texts in sample(eval_set["prompt"], "greedy", greedy=True)]
    eval_pools = _answers(task, sample(eval_set["prompt"], "eval"))
    calibration_pools = _answers(task, sample(calibration_set["prompt"], "calibration"))
    largest = max(settings["budget_grid"])
    eval_answers, calibration_answers = _first(eval_pools, largest), _first(calibration_pools, largest)
    record = {"run": spec.run, "eval_greedy_acc": greedy_accuracy(greedy, eval_golds)}
    record.update(fixed_k_metrics(eval_answers, eval_golds, settings["budget_grid"]))
    record["per_prompt"] = per_prompt_accuracy(
        [correct_flags([answer], gold)[0] for answer, gold in zip(greedy, eval_golds)],
        [correct_flags(row, gold) for row, gold in zip(eval_answers, eval_golds)],
        [correct_flags([majority_answer(row, largest)], gold)[0] for row, gold in zip(eval_answers, eval_golds)],
    )
    record.update(
        conformal_metrics(eval_answers, eval_golds, calibration_answers, calibration_golds, settings, spec.seed)
    )
    record["pools"] = sample_pools(calibration_pools, calibration_golds, eval_pools, eval_golds)
    record["prompt"] = task.prompt_record()
    _write_record(record, start, out_path)


def _write_record(record: dict[str, Any], start: float, out_path: str | Path) -> None:
    record["eval_wall_s"] = time.perf_counter() - start
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    Path(out_path).write_text(json.dumps(record, indent=1) + "\n")


def _execution_record(task, sample, eval_set, calibration_set, settings: dict[str, Any], spec) -> dict[str, Any]:
    """The record of an execution score: the same keys as the ``aps`` path's, with verifier passes as correctness."""
    # Sampled in the same order, with the same purpose seeds, as the aps path.
    greedy = sample(eval_set["prompt"], "greedy", greedy=True)
    eval_texts = sample(eval_set["prompt"], "eval")
    calibration_texts = sample(calibration_set["prompt"], "calibration")
    timeout_s = settings.get("verifier_timeout_s", VERIFIER_TIMEOUT_S)
    greedy_passes = verifier_passes(task, greedy, eval_set, timeout_s)
    eval_pools = verifier_passes(task, eval_texts, eval_set, timeout_s)
    calibration_pools = verifier_passes(task, calibration_texts, calibration_set, timeout_s)
    largest = max(settings["budget_grid"])
    eval_passes, calibration_passes = _first(eval_pools, largest), _first(calibration_pools, largest)
    record = {"run": spec.run, "eval_greedy_acc": mean_accuracy(greedy_passes)}
    programs = _first(_answers(task, eval_texts), largest)
    record.update(execution_fixed_k_metrics(eval_passes, programs, settings["budget_grid"]))
    record["per_prompt"] = per_prompt_accuracy(
        [flags[0] for flags in greedy_passes], eval_passes, majority_passes(eval_passes, programs, largest)
    )
    record.update(conformal_metrics(eval_passes, None, calibration_passes, None, settings, spec.seed))
    record["pools"] = sample_pools(calibration_pools, None, eval_pools, None)
    return record


def _first(rows: list[list], count: int) -> list[list]:
    """Each prompt's first `count` samples: the metrics' share of samples drawn for a larger replay pool."""
    return [row[:count] for row in rows]


def sample_pools(calibration_outcomes, calibration_golds, eval_outcomes, eval_golds) -> dict[str, Any]:
    """The samples the record keeps for the replay (`cgrpo.pipeline.analysis.replay`): every prompt's outcomes in draw order
    (extracted answers, or verifier passes for an execution score) and its gold answer (None for execution)."""
    return {
        "calibration": {"outcomes": calibration_outcomes, "golds": calibration_golds},
        "eval": {"outcomes": eval_outcomes, "golds": eval_golds},
    }


def verifier_passes(
    task, completions: list[list[str]], dataset, timeout_s: float | None = VERIFIER_TIMEOUT_S
) -> list[list[bool]]:
    """``task.verifier``'s verdict on each prompt's completions, given the prompt's columns (all but ``prompt``).

    As in training, a verifier call that raises or has not returned after ``timeout_s`` seconds (the pipeline passes
    ``cgrpo.options.verifier_timeout_s``) fails that prompt's completions; a warning gives their number.
    """
    if len(completions) != len(dataset):
        raise ValueError(f"Got completions for {len(completions)} prompts, but the dataset has {len(dataset)}.")
    errors: list[Exception] = []
    passes = []
    for texts, row in zip(completions, dataset):
        columns = {key: value for key, value in row.items() if key != "prompt"}
        passes.append(verify(task.verifier, list(texts), columns, timeout_s, errors.append))
    if errors:
        logger.warning(
            "%d of %d verifier calls raised or timed out; their completions count as fails. The first: %r",
            len(errors),
            len(passes),
            errors[0],
        )
    return passes


def execution_fixed_k_metrics(
    passes: list[list[bool]], programs: list[list[str | None]], grid: list[int]
) -> dict[str, Any]:
    """:func:`fixed_k_metrics` for an execution score: a sample is correct when it passes.

    ``programs`` are the extracted programs of the same samples: maj@k counts a prompt when the most frequent program
    among its first k samples (ties to the first seen; samples without a program never win) passes.
    """
    if len(passes) != len(programs):
        raise ValueError(f"Got passes of {len(passes)} prompts but programs of {len(programs)}; pass one list each.")
    largest = max(grid)
    return {
        "eval_maj_acc": mean_accuracy([[flag] for flag in majority_passes(passes, programs, largest)]),
        "maj_at_k": {k: mean_accuracy([[flag] for flag in majority_passes(passes, programs, k)]) for k in grid},
        "pass_at_k": {k: mean_pass_at_k(passes, k) for k in grid},
        "mean_at_k": mean_accuracy(passes),
    }


def majority_passes(passes: list[list[bool]], programs: list[list[str | None]], k: int) -> list[bool]:
    """Per prompt, whether the most frequent program among its first k samples passes (ties to the first seen;
    samples without a program never win)."""
    flags = []
    for prompt_passes, texts in zip(passes, programs):
        winner = majority_answer(texts, k)
        flags.append(winner is not None and prompt_passes[texts.index(winner)])
    return flags


def fixed_k_metrics(answers: list[list[str | None]], golds: list[str], grid: list[int]) -> dict[str, Any]:
    """maj@k and pass@k for every budget of the grid, and mean single-sample accuracy over all samples."""
    correct = [correct_flags(row, gold) for row, gold in zip(answers, golds)]
    largest = max(grid)
    return {
        "eval_maj_acc": maj_at_k(answers, golds, largest),
        "maj_at_k": {k: maj_at_k(answers, golds, k) for k in grid},
        "pass_at_k": {k: mean_pass_at_k(correct, k) for k in grid},
        "mean_at_k": mean_accuracy(correct),
    }


def conformal_metrics(answers, golds, calibration_answers, calibration_golds, settings, seed: int):
    """Conformal dynamic k and coverage, for the automatic delta and for each fixed delta of the settings.

    With ``settings["score"]`` ``"aps"`` (the default) the outcomes are extracted answers judged against ``golds``;
    with ``"first_success"`` or ``"pass_rate"`` they are verifier passes and the golds are unused (None).

    The APS randomisation of calibration scores, eval scores and the dynamic-k stopping rule each use their own
    generator seeded from `seed`, so each depends only on its own data (calibration scores do not shift with the
    eval split, say).
    """
    grid = settings["budget_grid"]
    score = settings.get("score", "aps")
    if score == "aps":
        calibration_rng, eval_rng = _rng(seed, "calibration-aps"), _rng(seed, "eval-aps")
        calibration = calibration_scores("aps", grid, calibration_answers, calibration_golds, calibration_rng)
        eval_scores = calibration_scores("aps", grid, answers, golds, eval_rng)
        stopping_rng = _rng(seed, "dynamic-k-aps")
    else:
        # Execution scores are not randomised.
        calibration = calibration_scores(score, grid, calibration_answers)
        eval_scores = calibration_scores(score, grid, answers)
        stopping_rng = golds = None
    conformal, coverage, splits = [], [], []
    # The re-splits are the analysis's draw, not the run's: every run is re-split with the same streams.
    split_rng = np.random.default_rng(purpose_seed(settings["statistics_seed"], "coverage-splits"))
    for mode, thresholds in _threshold_sets(calibration, settings).items():
        summary = dynamic_k_summary(score, grid, thresholds.qhat, answers, stopping_rng, golds)
        post = post_selection_coverage(eval_scores, thresholds.qhat, summary["chosen_k"])
        conformal.append(
            {
                "delta_mode": mode,
                "delta": thresholds.delta,
                "n_calibration": thresholds.n_calibration,
                "qhat": thresholds.qhat,
                "accuracy": summary["accuracy"],
                "mean_k": summary["mean_k"],
                "histogram": summary["histogram"],
                "coverage_post_selection": post["coverage_post_selection"],
            }
        )
        for k in grid:
            row = coverage_at_k(eval_scores[k], thresholds.qhat[k], thresholds.delta, thresholds.n_calibration)
            # qhat = 1 covers every prompt by construction; the coverage of the other budgets is the test.
            coverage.append({"delta_mode": mode, "k": k, "qhat": thresholds.qhat[k], **row})
            spread = split_coverage_distribution(
                calibration[k], eval_scores[k], thresholds.delta, settings["coverage_splits"], split_rng
            )
            splits.append(
                {"delta_mode": mode, "delta": thresholds.delta, "k": k, "n_calibration": len(calibration[k]), **spread}
            )
    return {"conformal": conformal, "coverage": coverage, "coverage_splits": splits}


def _rng(seed: int, purpose: str) -> random.Random:
    return random.Random(purpose_seed(seed, purpose))


def _threshold_sets(scores: dict[int, list[float]], settings: dict[str, Any]) -> dict[Any, Thresholds]:
    sets = {"auto": fit_thresholds(scores, None, settings["delta_margin"], settings["split_delta"])}
    sets.update({float(delta): fit_thresholds(scores, float(delta)) for delta in settings["deltas"]})
    return sets


def _load_model(location: str):
    # On a GPU node (the SLURM profile gives evaluation one) generation runs there, in bfloat16 where supported.
    if torch.cuda.is_available():
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return load_model(location, dtype=dtype).to("cuda").eval()
    return load_model(location).eval()


def _sampler(spec: EvaluationSpec):
    """`sample(prompts, purpose, greedy=False)`: the evaluation's samples of `spec.model`, seeded by the purpose."""
    settings = spec.evaluation
    logger.info("Evaluating %s: sampling with the %s backend.", spec.run, settings.get("backend", "hf"))
    samples = settings.get("pool_samples", max(settings["budget_grid"]))
    return partial(sampler(spec.model, settings, spec.seed), num_samples=samples)


def sampler(model: str, settings: dict[str, Any], seed: int):
    """`sample(prompts, purpose, num_samples=1, greedy=False)`: completions of `model` from `settings["backend"]` (hf
    or vllm) at its `temperature`, `max_new_tokens` and `batch_size`, seeded by `seed` and the purpose."""
    if settings.get("backend", "hf") == "vllm":
        generate = partial(generate_completions_vllm, load_llm(model))
    else:
        tokenizer = load_tokenizer(model, padding_side="left")
        generate = partial(generate_completions, _load_model(model), tokenizer, batch_size=settings["batch_size"])

    def sample(prompts, purpose: str, num_samples: int = 1, greedy: bool = False) -> list[list[str]]:
        return generate(
            list(prompts),
            num_samples=1 if greedy else num_samples,
            temperature=settings["temperature"],
            max_new_tokens=settings["max_new_tokens"],
            greedy=greedy,
            seed=purpose_seed(seed, purpose),
            progress=True,
        )

    return sample


def _answers(task, completions: list[list[str]]) -> list[list[str | None]]:
    return [[task.extract(text) for text in texts] for texts in completions]
