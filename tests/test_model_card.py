"""The saved model card names the base model, the method and its settings, where TRL's says "[None]" and "GRPO"."""

from __future__ import annotations

from datasets import Dataset

from cgrpo import CGRPOConfig, CGRPOTrainer
from cgrpo.calibration import Thresholds


def _data(n: int, offset: int = 0) -> Dataset:
    return Dataset.from_dict(
        {
            "prompt": [f"{i}+{i}=" for i in range(offset, offset + n)],
            "answer": [str(2 * i) for i in range(offset, offset + n)],
        }
    )


def _card(model_dir: str, tmp_path, **overrides) -> str:
    thresholds = overrides.pop("initial_thresholds", None)
    args = CGRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        budget_grid=[2, 4, 8],
        per_device_train_batch_size=8,
        report_to=[],
        **overrides,
    )
    trainer = CGRPOTrainer(
        model=model_dir,
        reward_funcs=lambda completions, **kwargs: [0.0] * len(completions),
        args=args,
        train_dataset=_data(16),
        calibration_dataset=None if args.stopping_rule != "conformal" else _data(32, offset=100),
        answer_extractor=lambda text: None,
        initial_thresholds=thresholds,
    )
    trainer.create_model_card(model_name="tiny")
    return (tmp_path / "README.md").read_text()


def test_the_card_names_the_local_base_model_and_c_grpo_with_its_settings(tiny_model_dir, tmp_path):
    thresholds = Thresholds(delta=0.4321, qhat={2: 0.5, 4: 0.9, 8: 1.0}, solve_rate=0.7, n_calibration=32)
    card = _card(tiny_model_dir, tmp_path, recalibrate_every=0, delta_margin=0.2, initial_thresholds=thresholds)
    assert "huggingface.co/None" not in card and "[None]" not in card and 'model="None"' not in card
    assert f"fine-tuned version of `{tiny_model_dir}`" in card
    assert "trained with GRPO" not in card
    assert (
        "This model was trained with C-GRPO: [GRPO](https://huggingface.co/papers/2402.03300) with per-prompt rollout "
        "budgets, each prompt sampled along the budget grid 2, 4, 8 and stopped at the first budget where its stopping "
        "rule holds. Stopping rule: conformal, score `aps`, automatic delta (1 - calibration solve rate + 0.2), "
        "calibrated once before training; the last calibration chose delta 0.432."
    ) in card


def test_the_card_of_a_calibration_free_rule_names_the_rule(tiny_model_dir, tmp_path):
    card = _card(tiny_model_dir, tmp_path, stopping_rule="share", stop_share=0.6)
    assert "the budget grid 2, 4, 8 and stopped at the first budget where its stopping rule holds" in card
    assert "Stopping rule: `share`, stop_share 0.6." in card
