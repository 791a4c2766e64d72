"""The :class:`Task` bundle: data loading, prompt formatting, answer extraction and rewards."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

from datasets import Dataset

from .answers import check_answer_format, extract_answer, parse_gold
from .files import DataSource
from .rewards import math_reward_funcs
from .splits import normalize_text

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
            "cgrpo.pipeline.tasks.splits."
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
    # Few-shot prompting for small pretrained models, which rarely end with "#### N" from an instruction alone: a
    # system message, and the first `worked_examples` distinct questions of the train pool with their worked answers,
    # shown before every question of every split, method and evaluation.
    system_prompt: str | None = None
    worked_examples: int = 0

    def __post_init__(self) -> None:
        check_answer_format(self.answer_format)
        if self.worked_examples < 0:
            raise ValueError(f"worked_examples is {self.worked_examples}; give 0 (none) or a positive count.")
        if self.system_prompt is not None and not self.system_prompt.strip():
            raise ValueError("system_prompt is empty; give the message's text, or null for no system message.")

    def _read(self, split: str) -> Dataset:
        dataset = self.loader(split)
        missing = [column for column in REQUIRED_COLUMNS if column not in dataset.column_names]
        if missing:
            raise ValueError(
                f"Task {self.name!r} data lacks column(s) {missing}; provide 'question' and 'answer' columns."
            )
        return dataset

    def load(self, split: str = "train") -> Dataset:
        """Raw examples (``question``, worked ``answer``) of ``split``, less every question shown as a worked example."""
        dataset = self._read(split)
        if not self.examples:
            return dataset
        # By question, not by (question, answer): a split question seen solved in the prompt would be a leak.
        shown = {normalize_text(question) for question, _ in self.examples}
        return dataset.select(
            [i for i, question in enumerate(dataset["question"]) if normalize_text(question) not in shown]
        )

    @cached_property
    def examples(self) -> tuple[tuple[str, str], ...]:
        """The worked examples every prompt shows, as ``(question, worked answer)``: the train pool's first
        ``worked_examples`` distinct questions, fixed by the task's data alone."""
        if not self.worked_examples:
            return ()
        examples: dict[str, tuple[str, str]] = {}
        for row in self._read("train"):
            examples.setdefault(normalize_text(row["question"]), (row["question"], row["answer"]))
            if len(examples) == self.worked_examples:
                return tuple(examples.values())
        raise ValueError(
            f"Task {self.name!r} has {len(examples)} distinct train questions, fewer than worked_examples "
            f"{self.worked_examples}; lower worked_examples or enlarge the pool."
        )

    def prompt_record(self) -> dict[str, object]:
        """What every prompt shows besides its question, for a run's record."""
        return {
            "chat": self.chat,
            "system_prompt": self.system_prompt,
            "worked_examples": [{"question": q, "answer": a} for q, a in self.examples],
        }

    def format_prompt(self, question: str) -> Prompt:
        """The prompt for ``question``: plain text, or a conversation when ``chat``; the system message and the
        worked examples come first."""
        instruction = _INSTRUCTIONS[self.answer_format]
        shots = [(f"{shown}\n{instruction}", answer) for shown, answer in self.examples]
        if self.chat:
            messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
            for user, assistant in shots:
                messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
            return [*messages, {"role": "user", "content": f"{question}\n{instruction}"}]
        header = f"{self.system_prompt}\n\n" if self.system_prompt else ""
        worked = "".join(f"Question: {user}\nAnswer: {answer}\n\n" for user, answer in shots)
        return f"{header}{worked}Question: {question}\n{instruction}\nAnswer: "

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
