"""The prompt's format rate: the share of the base model's answers that the task's grader can read, before training.

A prompt the model does not follow costs every method alike and silently: a completion without a gradable answer
earns no correctness reward, so groups stay uniform and teach nothing (SmolLM2-135M wrote an extractable `#### N` in
14% of its completions with one user turn, 88% after a system message and three worked examples,
docs/real-model.md). A few dozen samples say so in seconds, before the training jobs spend hours.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pandas as pd

from ...support.models import load_tokenizer
from ..configuration.specs import FormatRateSpec
from ..metrics.accuracy import correct_flags
from ..tasks import get_task
from ..tasks.splits import load_split
from .evaluation import sampler, verifier_passes
from .sampling import as_text

logger = logging.getLogger(__name__)

# Below half, most groups' correctness rewards are zero for want of the format, whatever the model can solve.
LOW_FORMAT_RATE = 0.5


def measure_format_rate(spec: FormatRateSpec | dict[str, Any], csv_path: str | Path, md_path: str | Path) -> None:
    """Sample the spec's training prompts from its model and write the one-row format-rate table (csv and markdown)."""
    spec = FormatRateSpec.from_dict(spec)
    start = time.perf_counter()
    task = get_task(spec.task["name"], **spec.task["options"])
    train = load_split(spec.splits, "train")
    dataset = task.to_prompt_dataset(train.select(range(min(spec.prompts, len(train)))))
    logger.info("Format rate of the base model: sampling with the %s backend.", spec.evaluation["backend"])
    sample = sampler(spec.model, spec.evaluation, spec.seed)
    completions = sample(dataset["prompt"], "format-rate", num_samples=spec.samples)
    tokenizer = load_tokenizer(spec.model)
    row = {
        "prompts": len(dataset),
        "samples_per_prompt": spec.samples,
        "completions": sum(map(len, completions)),
        "format_rate": _share([task.extract(text) is not None for texts in completions for text in texts]),
        "correct_share": _share([flag for flags in _correct(task, completions, dataset) for flag in flags]),
        "mean_prompt_tokens": _mean_tokens(tokenizer, [as_text(tokenizer, prompt) for prompt in dataset["prompt"]]),
        "mean_completion_tokens": _mean_tokens(tokenizer, [text for texts in completions for text in texts]),
        **{key: spec.evaluation[key] for key in ("temperature", "max_new_tokens", "backend")},
        "wall_s": time.perf_counter() - start,
    }
    if row["format_rate"] < LOW_FORMAT_RATE:
        logger.warning(
            "Only %.0f%% of the base model's completions end in an answer the %s grader reads: give the prompt a "
            "system message or worked examples (task.options.system_prompt, worked_examples; docs/real-model.md).",
            100 * row["format_rate"],
            task.name,
        )
    table = pd.DataFrame([row])
    table.to_csv(csv_path, index=False)
    Path(md_path).write_text(table.to_markdown(index=False, floatfmt=".3f") + "\n")
    logger.info("Format rate: %s", row)


def _correct(task, completions: list[list[str]], dataset) -> list[list[bool]]:
    """Each completion's correctness as training rewards it: its answer equals the gold one, or the verifier passes it."""
    if task.verifier is not None:
        return verifier_passes(task, completions, dataset)
    return [
        correct_flags([task.extract(text) for text in texts], gold)
        for texts, gold in zip(completions, dataset["answer"])
    ]


def _share(flags: list[bool]) -> float:
    return sum(flags) / len(flags)


def _mean_tokens(tokenizer, texts: list[str]) -> float:
    # Completions are counted re-tokenized from their text: within a token or two of what the sampler drew.
    return sum(len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]) / len(texts)
