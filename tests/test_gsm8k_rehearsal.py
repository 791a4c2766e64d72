"""A CPU rehearsal of `config/gsm8k_qwen.yaml`, the config real users run first, on a GPU cluster.

The shipped config runs end to end through the workflow, changed only by values given in a second `--configfile`
(`cpu_overrides`): a tiny local Qwen2-architecture model with Qwen2.5's special tokens and chat template in place of
`Qwen/Qwen2.5-0.5B-Instruct`, a small GSM8K-format JSONL pair (`train` and `test`) in place of `openai/gsm8k`, and
sizes, steps and lengths a CPU runs in minutes, and HF generate in place of vLLM (which needs a GPU here). Everything
else is the config's own: chat prompts with the system message and worked examples, `####` answers, LoRA on the Qwen2
projection modules, gradient accumulation, the loss, the reward weights, the budget grid, both deltas, the four fixed
GRPO group sizes and the format-rate check.

`run_rehearsal(tmp_path, profile=None)` takes an optional Snakemake workflow profile, so that the same run can go
through a (local) SLURM profile where a scheduler is present.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import SLURM_PROFILE, require_cluster

REPO = Path(__file__).resolve().parents[1]
SNAKEFILE = REPO / "Snakefile"
GPU_CONFIG = REPO / "config" / "gsm8k_qwen.yaml"
# A safety net against a hung run, not a speed target: the rehearsal took 1.5 to 3 minutes on 2 (shared) cores.
REHEARSAL_TIMEOUT_S = 900

# Qwen2.5's special tokens and the shape of its chat template: a default system turn, one
# `<|im_start|>role\n...<|im_end|>\n` block per message, and `<|im_start|>assistant\n` as the generation prompt.
IM_START, IM_END, ENDOFTEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' -%}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>system\\n" + DEFAULT_SYSTEM + "<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if not (loop.first and message['role'] == 'system') -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

# Sizes of the GSM8K stand-in: `train` holds the worked examples and the training and calibration splits, `test` is
# the eval split.
NUM_TRAIN, NUM_TEST = 40, 8
NUM_CALIBRATION = 12
# The stand-in model's warm start (see `warm_start`).
WARM_START_PROMPTS, WARM_START_STEPS = 8, 40


def cpu_overrides(model_dir: Path, data_dir: Path) -> dict:
    """The values that turn the GPU config into a CPU run of a few minutes; every key is one the config sets.

    Left as configured: `splits.sizes.train` (null: what the worked examples and calibration leave), the micro-batch
    of 32 rows and its 3 accumulation steps, `bf16` (autocast on CPU), the learning rate, temperature, loss, reward
    weights, grid, deltas, group sizes, the other evaluation settings and `peft`. `use_cpu` must be true on a machine
    without a GPU: TRL refuses bf16 otherwise; vLLM, which the config uses on a GPU, is replaced by HF generate.
    """
    return {
        "seeds": [0],
        "task": {"options": {"source": str(data_dir / "gsm8k_{split}.jsonl")}},
        "base_model": {"path": str(model_dir)},
        # The whole `test` file is the eval split (320 of GSM8K's 1,319 configured).
        "splits": {"sizes": {"calibration": NUM_CALIBRATION, "eval": None}},
        # Steps scaled like max_steps (480 -> 2): a refit after the first step, as at 240 of 480. With one optimizer
        # step (3 micro-batches) per generation batch, every method's, each step starts a generation batch, where a
        # refit can start.
        "training": {
            "max_steps": 2,
            "max_completion_length": 16,
            "use_cpu": True,
            "bf16": True,
            "steps_per_generation": 3,
            "use_vllm": False,
        },
        # 10 of 12 calibration examples (96 configured): 1/(n + 1) <= 0.1, the fixed delta, needs n >= 9.
        "cgrpo": {"recalibrate_every": [1], "options": {"num_calibration_samples": 10, "calibration_batch_size": 10}},
        "evaluation": {"max_new_tokens": 16, "backend": "hf"},
        "format_check": {"prompts": 8},
    }


def rehearsal_config(overrides: dict) -> dict:
    """The config the workflow runs: the GPU config with `overrides` merged in, as `--configfile A B` merges."""
    from snakemake.utils import update_config

    config = yaml.safe_load(GPU_CONFIG.read_text())
    update_config(config, overrides)
    return config


# --------------------------------------------------------------------------- stand-ins


def gsm8k_rows(count: int, offset: int) -> list[dict[str, str]]:
    """GSM8K-format problems: a `question` and a worked `answer` with calculator notes and a `#### N` line.

    Every other problem's answer is 12, the answer the warm-started stand-in model (`warm_start`) has the habit of
    giving, so that model solves about half of them: rewards vary within groups and conformal sets can be single.
    """
    names = ["Natalia", "Weng", "Betty", "Julie", "James", "Mark", "Albert", "Ken"]
    items = ["clips", "apples", "pencils", "stickers", "books", "shells"]
    rows = []
    for index in range(offset, offset + count):
        # Index -> (name, item) is one-to-one for the 48 problems used, so every problem is unique.
        name, item = names[index % len(names)], items[index // len(names) % len(items)]
        if index % 2 == 0:
            bags, each = [(2, 6), (3, 4), (4, 3), (6, 2)][index // 2 % 4]
            question = f"{name} packs {bags} bags with {each} {item} in each bag. How many {item} does {name} pack?"
            answer = f"{name} packs {bags}*{each}=<<{bags}*{each}=12>>12 {item}.\n#### 12"
        else:
            first, second, factor = 3 + index, 2 + (index * 7) % 11, 2 + index % 3
            total, final = first + second, (first + second) * factor
            question = (
                f"{name} had {first} {item} and got {second} more. Then {name} got {factor} times as many "
                f"{item} as that in all. How many {item} does {name} have now?"
            )
            answer = (
                f"{name} had {first}+{second}=<<{first}+{second}={total}>>{total} {item}.\n"
                f"In all {total}*{factor}=<<{total}*{factor}={final}>>{final} {item}.\n#### {final}"
            )
        rows.append({"question": question, "answer": answer})
    return rows


def write_gsm8k(data_dir: Path) -> dict[str, list[dict[str, str]]]:
    """`gsm8k_train.jsonl` and `gsm8k_test.jsonl`, as the Hub dataset's two splits; returns their rows."""
    data_dir.mkdir(parents=True, exist_ok=True)
    splits = {"train": gsm8k_rows(NUM_TRAIN, 0), "test": gsm8k_rows(NUM_TEST, NUM_TRAIN)}
    for split, rows in splits.items():
        lines = "".join(json.dumps(row) + "\n" for row in rows)
        (data_dir / f"gsm8k_{split}.jsonl").write_text(lines, encoding="utf-8")
    return splits


def build_qwen_like_model(model_dir: Path, rows: list[dict[str, str]], data_dir: Path, seed: int = 0) -> Path:
    """A tiny Qwen2ForCausalLM with Qwen2.5's special tokens and chat template, warm-started to answer `#### 12`.

    Transformers loads the tokenizer of any `qwen2` model folder as `Qwen2Tokenizer`, which keeps the saved vocabulary
    and merges but splits text with Qwen's own pattern (words, single digits, punctuation), so the byte-level BPE here
    is trained on a split like it, and the warm start uses the tokenizer as `AutoTokenizer` loads it back, as every
    pipeline step does. The generation config copies the instruct checkpoint's sampling defaults (top-k, top-p,
    repetition penalty), which the pipeline must not inherit.
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer, GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1000,
        special_tokens=[ENDOFTEXT, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = [row[key] for row in rows for key in ("question", "answer")]
    scaffolding = [
        DEFAULT_SYSTEM,
        config_task(data_dir).system_prompt,
        "system",
        "user",
        "assistant",
        "End with '#### <answer>'.",
    ]
    bpe.train_from_iterator(texts + scaffolding, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        additional_special_tokens=[IM_START, IM_END],
        model_max_length=1024,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    eos, pad = tokenizer.convert_tokens_to_ids(IM_END), tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=pad,
        eos_token_id=eos,
        pad_token_id=pad,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=pad,
        eos_token_id=[eos, pad],
        pad_token_id=pad,
        do_sample=True,
        temperature=0.7,
        top_k=20,
        top_p=0.8,
        repetition_penalty=1.05,
    )
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    questions = [row["question"] for row in rows[:WARM_START_PROMPTS]]
    warm_start(model, AutoTokenizer.from_pretrained(model_dir), questions, config_task(data_dir))
    model.save_pretrained(model_dir)
    return model_dir


def config_task(data_dir: Path):
    """The config's task (its chat prompt, system message and worked examples) on the stand-in files in `data_dir`."""
    from cgrpo.pipeline.tasks import get_task

    options = yaml.safe_load(GPU_CONFIG.read_text())["task"]["options"]
    return get_task("gsm8k", **{**options, "source": str(data_dir / "gsm8k_{split}.jsonl")})


def warm_start(model, tokenizer, questions: list[str], task, steps: int = WARM_START_STEPS) -> None:
    """A few full-batch steps teaching `model` to answer `task`'s chat prompts with `#### 12` (in the task's answer
    format) and EOS.

    A random model never writes a well-formed answer, so every reward would be 0, no advantage would be nonzero and
    no conformal set would ever hold a single answer. With the habit about 70% of samples answer 12, a fifth nothing
    gradable and the rest something else: rewards vary within groups, and C-GRPO stops prompts before the largest
    budget. (60 steps, on these few-shot prompts, made 90% answer 12 and left C-GRPO's groups at delta 0.1 uniform.)
    """
    import torch

    from cgrpo.pipeline.tasks.answers import format_answer

    prompts = [
        tokenizer.apply_chat_template(task.format_prompt(question), tokenize=False, add_generation_prompt=True)
        for question in questions
    ]
    habit = tokenizer(format_answer("12", task.answer_format), add_special_tokens=False).input_ids
    answer = [*habit, tokenizer.eos_token_id]
    sequences = [tokenizer(prompt, add_special_tokens=False).input_ids + answer for prompt in prompts]
    width = max(map(len, sequences))
    input_ids = torch.full((len(sequences), width), tokenizer.pad_token_id)
    labels = torch.full((len(sequences), width), -100)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, ids in enumerate(sequences):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, len(ids) - len(answer) : len(ids)] = torch.tensor(answer)
        attention_mask[row, : len(ids)] = 1
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    # One thread: the same result whatever the machine's core count, and no contention with other processes.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model.train()
        for _ in range(steps):
            model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        model.eval()
    finally:
        torch.set_num_threads(threads)


# --------------------------------------------------------------------------- the run


@dataclass(frozen=True)
class Rehearsal:
    result: subprocess.CompletedProcess
    results: Path  # results/<experiment>/ in the working directory
    config: dict  # the merged config the workflow ran
    model_dir: Path  # the stand-in base model


def snakemake_command(workdir: Path, configfiles: list[Path], profile: str | Path | None = None) -> list[str]:
    """The whole workflow in `workdir`; without `profile` the local profile is skipped and 2 cores are used.

    A relative `profile` that names a folder of the repository (`workflow/profiles/slurm-local`) is taken from there.
    """
    command = [sys.executable, "-m", "snakemake", "--snakefile", str(SNAKEFILE), "--directory", str(workdir)]
    if profile is None:
        command += ["--workflow-profile", "none", "--cores", "2"]
    else:
        in_repo = REPO / profile
        profile = in_repo if not Path(profile).is_absolute() and in_repo.is_dir() else profile
        command += ["--workflow-profile", str(profile)]
    return command + ["--configfile", *map(str, configfiles)]


def run_rehearsal(tmp_path: Path, profile: str | Path | None = None) -> Rehearsal:
    """Run config/gsm8k_qwen.yaml with the CPU stand-ins, all under `tmp_path`, offline.

    `profile` is a Snakemake workflow profile (say a local SLURM one); None runs locally on 2 cores.
    """
    splits = write_gsm8k(tmp_path / "data")
    model_dir = build_qwen_like_model(tmp_path / "qwen-tiny", splits["train"] + splits["test"], tmp_path / "data")
    overrides = cpu_overrides(model_dir, tmp_path / "data")
    overrides_file = tmp_path / "cpu_overrides.yaml"
    overrides_file.write_text(yaml.safe_dump(overrides))
    workdir = tmp_path / "work"
    workdir.mkdir()
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_DATASETS_CACHE": str(tmp_path / "hf-datasets-cache"),
    }
    result = subprocess.run(
        snakemake_command(workdir, [GPU_CONFIG, overrides_file], profile),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        timeout=REHEARSAL_TIMEOUT_S,
        check=False,
    )
    config = rehearsal_config(overrides)
    return Rehearsal(result, workdir / "results" / config["experiment"], config, model_dir)


def expected_runs(config: dict, results: Path) -> set[str]:
    """Every training run the config asks for, with compute matching the matched ones as their `match_compute` records
    say."""
    from cgrpo.pipeline.configuration.methods import cgrpo_run_name, grpo_run_name

    cgrpo, seeds = config["cgrpo"], config["seeds"]
    runs = {
        cgrpo_run_name(seed, grid, delta, recal)
        for seed in seeds
        for grid in cgrpo["budget_grids"]
        for delta in cgrpo["deltas"]
        for recal in cgrpo["recalibrate_every"]
    }
    runs |= {grpo_run_name(seed, size) for seed in seeds for size in config["grpo"]["num_generations"]}
    if not config["grpo"]["compute_matched"]:
        assert not (results / "matched").exists(), "match_compute ran without compute matching"
        return runs
    matched = {json.loads(path.read_text())["num_generations"] for path in (results / "matched").glob("*.json")}
    assert len(matched) >= 1, "match_compute wrote no record"
    return runs | {grpo_run_name(seed, size, matched=True) for seed in seeds for size in matched}


def check_rehearsal(rehearsal: Rehearsal) -> None:
    """What a finished rehearsal must show: splits as configured, trained LoRA adapters, C-GRPO stopping early,
    chat-rendered prompts in training, and every run in the tables."""
    result, results, config = rehearsal.result, rehearsal.results, rehearsal.config
    assert result.returncode == 0, result.stdout[-8000:]

    # Calibration comes from the `train` file less the worked examples, eval is the whole `test` file
    # (`eval_source_split: test`).
    manifest = json.loads((results / "splits" / "manifest.json").read_text())
    sizes = {name: entry["size"] for name, entry in manifest["splits"].items()}
    shown = config["task"]["options"]["worked_examples"]
    assert sizes == {"train": NUM_TRAIN - shown - NUM_CALIBRATION, "calibration": NUM_CALIBRATION, "eval": NUM_TEST}

    # The format-rate job sampled the base model before training: the warm-started stand-in mostly writes "#### 12".
    format_rate = pd.read_csv(results / "tables" / "format_rate.csv").iloc[0]
    assert format_rate["prompts"] == config["format_check"]["prompts"] and format_rate["format_rate"] > 0.5

    # Every run, the compute-matched ones included, saved a LoRA adapter of the configured shape on the stand-in,
    # and training moved it (LoRA's B matrices start at zero).
    from safetensors.torch import load_file

    runs = expected_runs(config, results)
    assert {path.name for path in (results / "runs").iterdir()} == runs
    for run in runs:
        model = results / "runs" / run / "model"
        adapter = json.loads((model / "adapter_config.json").read_text())
        assert adapter["peft_type"] == "LORA", run
        assert {key: adapter[key] for key in config["peft"] if key != "target_modules"} == {
            key: value for key, value in config["peft"].items() if key != "target_modules"
        }, run
        assert set(adapter["target_modules"]) == set(config["peft"]["target_modules"]), run
        assert adapter["base_model_name_or_path"] == str(rehearsal.model_dir), run
        assert not (model / "model.safetensors").exists(), f"{run} saved full weights, not an adapter"
        weights = load_file(model / "adapter_model.safetensors")
        assert any(value.abs().sum() > 0 for key, value in weights.items() if "lora_B" in key), f"{run} did not train"
        assert (results / "eval" / f"{run}.json").is_file(), run

    # C-GRPO stopped some groups before the largest budget: padded groups went through the LoRA update.
    records = [json.loads((results / "runs" / run / "run.json").read_text()) for run in sorted(runs)]
    largest = max(config["cgrpo"]["budget_grids"][0])
    stopped = {record["run"]: record["train_budget_histogram"] for record in records if record["method"] == "cgrpo"}
    assert any(int(k) < largest for histogram in stopped.values() for k in histogram), stopped

    # Training prompts were the task's conversations (system message, worked examples, question) rendered with the
    # chat template: the prompt tokens TRL counted per row (`num_tokens` less the completion tokens) lie within the
    # lengths of the rendered prompts, longer than any question's turn alone.
    from transformers import AutoTokenizer

    from cgrpo.pipeline.tasks import get_task
    from cgrpo.pipeline.tasks.splits import load_split

    task = get_task(config["task"]["name"], **config["task"]["options"])
    questions = load_split(results / "splits", "train")["question"]
    tokenizer = AutoTokenizer.from_pretrained(results / "runs" / records[0]["run"] / "model")
    example = tokenizer.apply_chat_template(
        task.format_prompt(questions[0]), tokenize=False, add_generation_prompt=True
    )
    shown_question = task.examples[0][0]
    assert example.startswith(f"{IM_START}system\n{task.system_prompt}{IM_END}\n{IM_START}user\n{shown_question}\n")
    assert example.endswith(f"{questions[0]}\nEnd with '#### <answer>'.{IM_END}\n{IM_START}assistant\n")
    rendered = [
        len(
            tokenizer.apply_chat_template(
                task.format_prompt(question), add_generation_prompt=True, tokenize=True, return_dict=True
            )["input_ids"]
        )
        for question in questions
    ]
    plain = [len(tokenizer(task.format_prompt(question)[-1]["content"]).input_ids) for question in questions]
    for record in records:
        if record["method"] != "grpo":
            continue
        # Every baseline trains C-GRPO's prompts per step, in rows of its own group size; each logged step is one
        # generation batch of `steps_per_generation` micro-batches.
        training = config["training"]
        micro_batch = training["per_device_train_batch_size"] * record["num_generations"] // largest
        rows = micro_batch * training["steps_per_generation"]
        steps = pd.read_csv(results / "runs" / record["run"] / "steps.csv")
        tokens = steps["num_tokens"].diff().fillna(steps["num_tokens"])
        prompt_tokens = tokens / rows - steps["completions/mean_length"]
        assert prompt_tokens.between(min(rendered) - 0.5, max(rendered) + 0.5).all(), (record["run"], prompt_tokens)
        assert (prompt_tokens > max(plain)).all(), (record["run"], prompt_tokens, max(plain))

    # The tables hold the base model and every run; the compute-matched runs are marked.
    summary = pd.read_csv(results / "tables" / "summary.csv")
    assert set(summary["run"]) == runs | {"base"}
    assert set(summary["method"]) == {"base", "cgrpo", "grpo"}
    assert summary["compute_matched"].astype(str).eq("True").sum() == sum(run.endswith("_matched") for run in runs)
    assert set(pd.read_csv(results / "tables" / "by_method.csv")["method"]) == {"base", "cgrpo", "grpo"}
    assert len(pd.read_csv(results / "tables" / "delta_sweep.csv")) == len(config["cgrpo"]["deltas"])
    assert not pd.read_csv(results / "tables" / "paired.csv").empty
    for table in ("summary", "by_method", "paired", "coverage", "conformal", "delta_sweep"):
        assert (results / "tables" / f"{table}.md").read_text().startswith("|"), table
    for plot in ("pareto", "training_curves", "thresholds", "coverage", "delta_sweep"):
        assert (results / "plots" / f"{plot}.png").stat().st_size > 0, plot


def _rehearse(tmp_path, capsys, profile=None) -> None:
    start = time.perf_counter()
    rehearsal = run_rehearsal(tmp_path, profile)
    with capsys.disabled():
        where = "locally" if profile is None else f"through {Path(profile).name}"
        print(f"\ngsm8k_qwen rehearsal {where}: {time.perf_counter() - start:.0f} s")
    check_rehearsal(rehearsal)


@pytest.mark.slow
@pytest.mark.long
def test_gsm8k_qwen_config_rehearsal_on_cpu(tmp_path, capsys):
    _rehearse(tmp_path, capsys)


@pytest.mark.slow
@pytest.mark.slurm
def test_gsm8k_qwen_config_rehearsal_through_slurm(tmp_path, capsys):
    # As the config is meant to run: through the SLURM profile, here the local cluster's variant of it.
    require_cluster()
    _rehearse(tmp_path, capsys, SLURM_PROFILE)
