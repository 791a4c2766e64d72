"""The :class:`Task` bundle: data loading, prompt formatting, answer extraction and rewards."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from datasets import Dataset

from .answers import check_answer_format, extract_answer, parse_gold
from .files import DataSource
from .rewards import math_reward_funcs

Prompt = str | list[dict[str, str]]

_INSTRUCTIONS = {
    "hash": "End with '#### <answer>'.",
    "boxed": "End with '\\boxed{<answer>}'.",
}
REQUIRED_COLUMNS = ("question", "answer")


def generated_pool(split: str, generate: Callable[..., Dataset], what: str, **options) -> Dataset:
    """``generate(**options)``, the one pool (split ``train``) of a generated task described as `what`."""
    if split != "train":
        raise ValueError(
            f"The {what} has one pool (split 'train'), not {split!r}; carve calibration and eval sets from it with "
            "cgrpo.pipeline.splits."
        )
    return generate(**options)


@dataclass(frozen=True)
class Task:
    """A math task: where its examples come from and how completions are prompted and scored.

    ``loader(split)`` returns a raw dataset with a ``question`` column and an ``answer`` column
    holding a worked solution that ends in ``#### N`` (or ``\\boxed{N}``). Everything else (prompt,
    extractor, rewards) is shared by all math tasks, so tasks differ only in their loader.
    """

    name: str
    loader: Callable[[str], Dataset]
    answer_format: str = "hash"
    chat: bool = False
    # Execution tasks (code) check completions by running them; math tasks compare numbers instead.
    verifier: Callable | None = None
    # Checked at workflow planning (None for generated data, which needs no file).
    source: DataSource | None = None

    def __post_init__(self) -> None:
        check_answer_format(self.answer_format)

    def load(self, split: str = "train") -> Dataset:
        """Raw examples (``question``, worked ``answer``) of ``split``."""
        dataset = self.loader(split)
        missing = [column for column in REQUIRED_COLUMNS if column not in dataset.column_names]
        if missing:
            raise ValueError(
                f"Task {self.name!r} data lacks column(s) {missing}; provide 'question' and 'answer' columns."
            )
        return dataset

    def format_prompt(self, question: str) -> Prompt:
        """The prompt for ``question``: plain text, or a one-message conversation when ``chat``."""
        instruction = _INSTRUCTIONS[self.answer_format]
        if self.chat:
            return [{"role": "user", "content": f"{question}\n{instruction}"}]
        return f"Question: {question}\n{instruction}\nAnswer: "

    def gold(self, solution: str) -> str:
        """Normalised final answer of a worked solution."""
        return parse_gold(solution)

    def extract(self, completion: str) -> str | None:
        """Normalised final answer of a model completion, or None if it has none."""
        return extract_answer(completion, self.answer_format)

    @property
    def reward_funcs(self) -> list[Callable[..., list[float]]]:
        """TRL reward functions ``[correctness, format]``; weight them with ``reward_weights``."""
        return math_reward_funcs(self.answer_format)

    def to_prompt_dataset(self, raw: Dataset) -> Dataset:
        """Map raw examples to TRL's prompt format: ``prompt``, ``answer`` (normalised gold), ``question``."""
        questions = list(raw["question"])
        return Dataset.from_dict(
            {
                "prompt": [self.format_prompt(question) for question in questions],
                "answer": [self.gold(solution) for solution in raw["answer"]],
                "question": questions,
            }
        )
