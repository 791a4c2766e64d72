"""Bootstrap of the offline base model, and batched sampling from it."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from cgrpo.pipeline.jobs.base_model import (
    BootstrapSettings,
    bootstrap_base_model,
    sft_dataset,
    sft_problems,
    tokenize_sft,
)
from cgrpo.pipeline.jobs.sampling import generate_completions
from cgrpo.pipeline.tasks import generate_problems, get_task
from cgrpo.pipeline.tasks.answers import extract_answer
from cgrpo.pipeline.tasks.arithmetic import ITEMS


@pytest.fixture(scope="module")
def loaded(bootstrapped_model_dir):
    return AutoModelForCausalLM.from_pretrained(bootstrapped_model_dir), AutoTokenizer.from_pretrained(
        bootstrapped_model_dir
    )


def test_model_and_tokenizer_load_by_path(loaded):
    model, tokenizer = loaded
    text = get_task("arithmetic").format_prompt("Ann has 3 pens, gets 4 more. How many pens?") + "3+4=7 #### 7"
    assert tokenizer.decode(tokenizer(text).input_ids) == text
    assert "<unk>" not in tokenizer.convert_ids_to_tokens(tokenizer("Ünïcode ✓ {}").input_ids)
    assert tokenizer.eos_token_id != tokenizer.pad_token_id
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    assert model.generation_config.pad_token_id == tokenizer.pad_token_id


def test_sft_data_masks_prompts_and_ends_completions_with_eos(loaded):
    _, tokenizer = loaded
    pairs = sft_dataset(generate_problems(4, seed=0), "hash")
    for pair, row in zip(pairs, tokenize_sft(pairs, tokenizer)):
        completion = [token for token in row["labels"] if token != -100]
        assert row["input_ids"][-1] == completion[-1] == tokenizer.eos_token_id
        assert row["input_ids"][-len(completion) :] == completion
        assert tokenizer.decode(completion, skip_special_tokens=True) == pair["completion"]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"hidden_sise": 8}, "hidden_sise"),
        ({"num_examples": 64, "batch_size": 16}, "warmup_steps"),
        ({"unit_items": 13, "unit_rate": 0.5}, "unit_items"),
        ({"unit_items": 2, "unit_rate": 1.5}, "unit_rate"),
        ({"unit_items": 2, "unit_rate": 0.5, "answer_format": "boxed"}, "answer_format 'hash'"),
    ],
)
def test_bad_settings_fail_before_training(tmp_path, settings, message):
    with pytest.raises(ValueError, match=message):
        bootstrap_base_model(tmp_path, **settings)
    assert not any(tmp_path.iterdir())


def test_unit_habit_names_the_unit_on_the_first_items_at_the_set_rate():
    plain = sft_problems(BootstrapSettings(num_examples=4000))
    habit = sft_problems(BootstrapSettings(num_examples=4000, unit_items=3, unit_rate=0.7))
    assert plain["question"] == habit["question"]
    changed = []
    for before, after in zip(plain, habit):
        if after["answer"] != before["answer"]:
            assert after["item"] in ITEMS[:3] and after["answer"] == f"{before['answer']} {after['item']}"
            assert extract_answer(after["answer"]) is None and extract_answer(before["answer"]) is not None
        if after["item"] in ITEMS[:3]:
            changed.append(after["answer"] != before["answer"])
    assert 0.65 < sum(changed) / len(changed) < 0.75


def test_same_seed_gives_identical_tokenizer_and_weights(tmp_path, bootstrapped_model_dir, loaded):
    settings = json.loads((bootstrapped_model_dir / "bootstrap.json").read_text())
    again = bootstrap_base_model(tmp_path / "again", **settings)
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json", "generation_config.json"):
        assert (again / name).read_bytes() == (bootstrapped_model_dir / name).read_bytes()
    first, second = loaded[0].state_dict(), AutoModelForCausalLM.from_pretrained(again).state_dict()
    assert first.keys() == second.keys()
    assert all(torch.equal(first[key], second[key]) for key in first)


def test_grpo_trainer_accepts_the_model_by_path(tmp_path, bootstrapped_model_dir):
    task = get_task("arithmetic", num_examples=8, seed=1)
    args = GRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        max_steps=1,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
    )
    trainer = GRPOTrainer(
        model=str(bootstrapped_model_dir),
        reward_funcs=task.reward_funcs,
        args=args,
        train_dataset=task.to_prompt_dataset(task.load()),
        processing_class=AutoTokenizer.from_pretrained(bootstrapped_model_dir),
    )
    trainer.train()
    assert trainer.state.global_step == 1


def test_sampling_is_seeded_and_shaped(loaded):
    model, tokenizer = loaded
    prompts = ["Question: Ann has 3 pens", "Question: Bob"]
    options = dict(num_samples=3, temperature=1.0, max_new_tokens=6, batch_size=4)
    first = generate_completions(model, tokenizer, prompts, seed=0, **options)
    assert [len(samples) for samples in first] == [3, 3]
    assert generate_completions(model, tokenizer, prompts, seed=0, **options) == first
    assert generate_completions(model, tokenizer, prompts, seed=1, **options) != first
    greedy = generate_completions(model, tokenizer, prompts, greedy=True, **options)
    assert all(len(set(samples)) == 1 for samples in greedy)
    assert "<eos>" not in "".join(first[0])


def test_sampling_rejects_bad_arguments(loaded):
    with pytest.raises(ValueError, match="temperature"):
        generate_completions(*loaded, ["x"], num_samples=2, temperature=0.0, max_new_tokens=4)


def test_boxed_bootstrap_learns_the_boxed_format(tmp_path, bootstrapped_model_dir):
    settings = {**json.loads((bootstrapped_model_dir / "bootstrap.json").read_text()), "answer_format": "boxed"}
    tokenizer = AutoTokenizer.from_pretrained(bootstrap_base_model(tmp_path, **settings))
    completion = generate_problems(1, seed=0, answer_format="boxed")[0]["answer"]
    assert completion.endswith("}") and tokenizer.decode(tokenizer(completion).input_ids) == completion
