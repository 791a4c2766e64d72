"""Build a tiny base model fully offline: a tokenizer trained on task text, and a small Llama warm-started
with supervised fine-tuning (TRL ``SFTTrainer``) on generated arithmetic problems (``task="arithmetic"``, the
default) or generated function-writing problems of the code task (``task="code"``).

The result is saved with ``save_pretrained``, so later steps load it by path exactly like a Hub model::

    path = bootstrap_base_model("results/base_model", seed=0)
    model = AutoModelForCausalLM.from_pretrained(path)

SFT problems are generated from seed ``seed + SFT_SEED_OFFSET``, a different stream from the pipeline's
split pool (the arithmetic task's seed, 0 by default). The streams are not disjoint: small problems recur
in both, so the base model has seen some easy pool problems verbatim. Evaluation sets that must be unseen
are filtered against :func:`sft_problems` (see ``benchmarks/base_model.py``).

For the code task the SFT prompt is the task's prompt (the problem, its first test, an open ```` ```python ````
block) and the completion is the reference program followed by the closing fence, so that the model learns to write
a function and stop.

Training runs on CPU and is deterministic for a given seed and ``torch`` thread count.
"""

from __future__ import annotations

import json
import math
import random
import sys
import tempfile
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
from datasets import Dataset
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from trl import SFTConfig, SFTTrainer

from ..tasks import get_task
from ..tasks.arithmetic import ITEMS, OPS_WEIGHTS, SIZE_WEIGHTS, generate_problems
from ..tasks.code import generate_functions

# Tasks the bootstrap can generate SFT data for.
BOOTSTRAP_TASKS = ("arithmetic", "code")

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
SFT_SEED_OFFSET = 10_000
SETTINGS_FILE = "bootstrap.json"


@dataclass(frozen=True)
class BootstrapSettings:
    """Hyperparameters of :func:`bootstrap_base_model`; they are saved next to the model.

    The defaults were tuned on 2 CPU cores for a ~90 s bootstrap whose model solves one-step small
    problems almost always, longer and medium ones sometimes and large ones rarely (see
    ``benchmarks/base_model.py``). SFT draws problems from the same mix as the arithmetic task's pool.
    """

    seed: int = 0
    num_examples: int = 48_000
    epochs: int = 1
    batch_size: int = 64
    learning_rate: float = 3e-3
    warmup_steps: int = 20
    # Warmup-stable-decay: the learning rate stays high and decays over this last fraction of steps.
    decay_fraction: float = 0.2
    # An upper bound: BPE training stops earlier once no pair is left to merge (about 500 tokens here).
    vocab_size: int = 1000
    hidden_size: int = 128
    intermediate_size: int = 256
    num_layers: int = 2
    num_heads: int = 4
    max_positions: int = 256
    answer_format: str = "hash"
    ops_weights: tuple[float, ...] = OPS_WEIGHTS
    size_weights: tuple[float, ...] = SIZE_WEIGHTS
    # An answer habit for RL to unlearn, like an off-the-shelf model's: SFT answers about the first
    # `unit_items` of cgrpo.pipeline.tasks.arithmetic.ITEMS name the unit after the number ("#### 17 pens")
    # `unit_rate` of the time, which the hash format's strict answer extraction rejects.
    unit_items: int = 0
    unit_rate: float = 0.0
    # The SFT data: "arithmetic" word problems, or "code" function-writing problems (cgrpo.pipeline.tasks.code), for
    # which `ops_weights` weighs programs of 1, 2 and 3 operations and `answer_format`, `size_weights` and the
    # answer habit do not apply.
    task: str = "arithmetic"


def sft_problems(settings: BootstrapSettings) -> Dataset:
    """The generated problems (``question``, worked ``answer``) the base model is fine-tuned on; for the code task,
    function-writing problems (``question``, reference program ``answer``, ``tests``)."""
    if settings.task == "code":
        return generate_functions(
            settings.num_examples, settings.seed + SFT_SEED_OFFSET, ops_weights=settings.ops_weights
        )
    problems = generate_problems(
        settings.num_examples,
        settings.seed + SFT_SEED_OFFSET,
        answer_format=settings.answer_format,
        ops_weights=settings.ops_weights,
        size_weights=settings.size_weights,
    )
    if settings.unit_items == 0:
        return problems
    return problems.remove_columns("answer").add_column("answer", _answers_with_units(problems, settings))


def _answers_with_units(problems: Dataset, settings: BootstrapSettings) -> list[str]:
    """Worked answers, of which those about the unit items end with the unit at ``settings.unit_rate``."""
    items = set(ITEMS[: settings.unit_items])
    rng = random.Random(settings.seed)
    return [
        f"{answer} {item}" if item in items and rng.random() < settings.unit_rate else answer
        for answer, item in zip(problems["answer"], problems["item"], strict=True)
    ]


def sft_dataset(problems: Dataset, answer_format: str, task: str = "arithmetic") -> Dataset:
    """Prompt-completion pairs, so SFT puts the loss on the worked answer only.

    For ``task="code"`` the prompt shows the problem and its first test and opens a python block; the completion is
    the reference program and the closing fence (EOS follows it in :func:`tokenize_sft`).
    """
    if task == "code":
        code = get_task("code", num_examples=1)
        return Dataset.from_dict(
            {
                "prompt": [
                    code.format_prompt(question, tests)
                    for question, tests in zip(problems["question"], problems["tests"])
                ],
                "completion": [f"{program}\n```" for program in problems["answer"]],
            }
        )
    task = get_task("arithmetic", answer_format=answer_format)
    return Dataset.from_dict(
        {
            "prompt": [task.format_prompt(question) for question in problems["question"]],
            "completion": list(problems["answer"]),
        }
    )


def tokenize_sft(dataset: Dataset, tokenizer: PreTrainedTokenizerFast) -> Dataset:
    """``input_ids`` ending in EOS, and ``labels`` that mask the prompt, for each prompt-completion pair.

    This is what ``SFTTrainer`` makes of a prompt-completion dataset (completion-only loss, EOS appended
    so generation learns to stop), done in two batched tokenizer calls instead of TRL's per-example
    maps, which took a sixth of the bootstrap's time.
    """
    prompts = tokenizer(list(dataset["prompt"]), add_special_tokens=False).input_ids
    texts = [prompt + completion for prompt, completion in zip(dataset["prompt"], dataset["completion"])]
    input_ids, labels = [], []
    for prompt_ids, ids in zip(prompts, tokenizer(texts, add_special_tokens=False).input_ids):
        if ids[: len(prompt_ids)] != prompt_ids:
            raise ValueError(
                "A prompt's tokens are not a prefix of its prompt+completion tokens; end prompts on a token boundary."
            )
        input_ids.append(ids + [tokenizer.eos_token_id])
        labels.append([-100] * len(prompt_ids) + ids[len(prompt_ids) :] + [tokenizer.eos_token_id])
    return Dataset.from_dict({"input_ids": input_ids, "labels": labels})


def train_tokenizer(
    texts: list[str], vocab_size: int, max_length: int, split_lines: bool = False
) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on ``texts``, with one token per digit.

    Merges may cross spaces, so the fixed wording of the generated problems collapses into a few
    tokens (short sequences keep CPU training and generation fast), while every digit stays its own
    token so the model learns arithmetic digit by digit. Byte-level pieces still encode any text.

    With ``split_lines`` no merge crosses the end of a line (each line, newline included, is its own
    pre-token): code prompts end with a line (```` ```python ```` and a newline) whose last token would
    otherwise merge with the completion's first characters, and the prompt would no longer end on a
    token boundary.
    """
    tokenizer = Tokenizer(models.BPE(unk_token=UNK))
    steps = [
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ]
    if split_lines:
        steps.insert(0, pre_tokenizers.Split("\n", behavior="merged_with_previous"))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, EOS, UNK],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token=PAD,
        eos_token=EOS,
        unk_token=UNK,
        model_max_length=max_length,
        clean_up_tokenization_spaces=False,
    )


def build_model(tokenizer: PreTrainedTokenizerFast, settings: BootstrapSettings) -> LlamaForCausalLM:
    """A freshly initialised (from ``settings.seed``) tiny Llama sized for ``tokenizer``."""
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=settings.hidden_size,
        intermediate_size=settings.intermediate_size,
        num_hidden_layers=settings.num_layers,
        num_attention_heads=settings.num_heads,
        num_key_value_heads=settings.num_heads,
        max_position_embeddings=settings.max_positions,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(settings.seed)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None
    )
    return model


def _num_steps(settings: BootstrapSettings) -> int:
    return math.ceil(settings.num_examples / settings.batch_size) * settings.epochs


def _decay_steps(settings: BootstrapSettings) -> int:
    return int(settings.decay_fraction * _num_steps(settings))


def _sft_config(output_dir: str, settings: BootstrapSettings, verbose: bool) -> SFTConfig:
    return SFTConfig(
        output_dir=output_dir,
        num_train_epochs=settings.epochs,
        per_device_train_batch_size=settings.batch_size,
        learning_rate=settings.learning_rate,
        lr_scheduler_type="warmup_stable_decay",
        lr_scheduler_kwargs={"num_decay_steps": _decay_steps(settings)},
        warmup_steps=settings.warmup_steps,
        seed=settings.seed,
        data_seed=settings.seed,
        use_cpu=True,
        bf16=False,
        # Activations of a model this small fit easily; recomputing them would only cost time.
        activation_checkpointing=False,
        save_strategy="no",
        report_to=[],
        logging_strategy="steps" if verbose else "no",
        logging_steps=25,
        # No bar where stderr is no terminal (a job's log file), which its redraws would litter.
        disable_tqdm=not (verbose and sys.stderr.isatty()),
        dataloader_num_workers=0,
        dataset_kwargs={"skip_prepare_dataset": True},
    )


def _check_settings(config: BootstrapSettings) -> None:
    """Raise ValueError on settings that would fail or mislead only after minutes of training."""
    get_task("arithmetic", answer_format=config.answer_format)  # validates answer_format
    if config.task not in BOOTSTRAP_TASKS:
        raise ValueError(f"Unknown bootstrap task {config.task!r}; use one of {', '.join(BOOTSTRAP_TASKS)}.")
    if config.task == "code" and config.unit_items:
        raise ValueError(
            f"unit_items={config.unit_items} is an answer habit of the arithmetic task; set unit_items to 0 for the "
            "code task."
        )
    if config.warmup_steps + _decay_steps(config) > _num_steps(config):
        raise ValueError(
            f"warmup_steps ({config.warmup_steps}) plus decay steps ({_decay_steps(config)}) exceed the "
            f"{_num_steps(config)} training steps; raise num_examples or lower warmup_steps."
        )
    if not 0 <= config.unit_items <= len(ITEMS) or not 0.0 <= config.unit_rate <= 1.0:
        raise ValueError(
            f"unit_items={config.unit_items} and unit_rate={config.unit_rate} are out of range; use 0 to "
            f"{len(ITEMS)} items and a rate between 0 and 1."
        )
    if config.unit_items and config.answer_format != "hash":
        # "\boxed{17} pens" still extracts as 17, so the habit would cost the model nothing to keep.
        raise ValueError(
            f"unit_items needs answer_format 'hash', whose extraction rejects '#### 17 pens', not "
            f"{config.answer_format!r}; set unit_items to 0 or answer_format to hash."
        )


def bootstrap_base_model(output_dir: str | Path, *, verbose: bool = False, **settings) -> Path:
    """Train a tokenizer and a tiny SFT-warm-started causal LM, save both to ``output_dir``, return it.

    Keyword ``settings`` override the fields of :class:`BootstrapSettings` (e.g. ``seed``,
    ``num_examples``, ``hidden_size``). ``output_dir`` then holds the model, tokenizer, generation
    config and ``bootstrap.json`` with the settings used.
    """
    unknown = sorted(set(settings) - {field.name for field in fields(BootstrapSettings)})
    if unknown:
        raise ValueError(
            f"Unknown bootstrap setting(s) {unknown}; use fields of cgrpo.pipeline.jobs.base_model.BootstrapSettings."
        )
    config = BootstrapSettings(**settings)
    _check_settings(config)
    output_dir = Path(output_dir)
    dataset = sft_dataset(sft_problems(config), config.answer_format, config.task)
    texts = [prompt + completion for prompt, completion in zip(dataset["prompt"], dataset["completion"])]
    tokenizer = train_tokenizer(texts, config.vocab_size, config.max_positions, split_lines=config.task == "code")
    model = build_model(tokenizer, config)
    with tempfile.TemporaryDirectory() as scratch:
        trainer = SFTTrainer(
            model=model,
            args=_sft_config(scratch, config, verbose),
            train_dataset=tokenize_sft(dataset, tokenizer),
            processing_class=tokenizer,
        )
        trainer.train()
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    (output_dir / SETTINGS_FILE).write_text(json.dumps(asdict(config), indent=2) + "\n")
    return output_dir
