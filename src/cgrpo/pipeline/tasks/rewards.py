"""TRL reward functions shared by every math task.

They follow TRL's signature ``f(completions, answer, **kwargs) -> list[float]``: ``completions`` are
plain strings, or message lists ``[{"role": "assistant", "content": ...}]`` for conversational
prompts, and ``answer`` is the dataset column holding the normalised gold answer. They are
module-level functions bound with :func:`functools.partial`, which keeps them picklable and keeps
their names in TRL's logs.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from .answers import check_answer_format, extract_answer, is_well_formed


def completion_text(completion: str | list[dict]) -> str:
    """The text of a completion, whether a string or a conversational list of messages."""
    if isinstance(completion, str):
        return completion
    content = completion[-1]["content"]
    if isinstance(content, str):
        return content
    # Multimodal-style content: a list of typed parts, of which only text parts carry the answer.
    return "".join(part.get("text", "") for part in content)


def correctness_reward(completions, answer, answer_format: str = "hash", **kwargs) -> list[float]:
    """1.0 where the extracted answer equals the normalised gold ``answer``, else 0.0."""
    return [
        float(extract_answer(completion_text(completion), answer_format) == gold)
        for completion, gold in zip(completions, answer, strict=True)
    ]


def format_reward(completions, answer_format: str = "hash", **kwargs) -> list[float]:
    """1.0 where the completion ends with a well-formed final answer, else 0.0."""
    return [float(is_well_formed(completion_text(completion), answer_format)) for completion in completions]


def math_reward_funcs(answer_format: str = "hash") -> list[Callable[..., list[float]]]:
    """``[correctness, format]`` reward functions for ``answer_format``, in TRL ``reward_weights`` order."""
    check_answer_format(answer_format)
    return [
        partial(correctness_reward, answer_format=answer_format),
        partial(format_reward, answer_format=answer_format),
    ]
