"""cgrpo.pipeline.runs: the cost record of a run, and the copy that stands in for a compute-matched run equal to a fixed-G run."""

from __future__ import annotations

import json
from collections import Counter
from types import SimpleNamespace

import pytest

from cgrpo.calibration import Thresholds
from cgrpo.pipeline.runs import _run_record, reuse_compute_matched
from cgrpo.pipeline.specs import TrainSpec


def test_cgrpo_costs_count_the_lockstep_rows_and_report_them_apart():
    # 10 groups of width 8 sampled 40 real rows; keeping two processes in lockstep generated 6 throwaway rows.
    totals = {"train_rollouts": 40, "train_tokens": 400, "groups": 10, "lockstep_rollouts": 6, "generation_s": 1.5}
    trainer = SimpleNamespace(cgrpo_totals=totals, calibration_history=[], budget_histogram=Counter({2: 8, 8: 3}),
                              args=SimpleNamespace(num_generations=8, steps_per_generation=1),
                              state=SimpleNamespace(global_step=5))
    thresholds = Thresholds(delta=0.2, qhat={2: 1.0, 8: 0.9}, solve_rate=0.8, n_calibration=4)
    initial = {"thresholds": thresholds, "rollouts": 32, "tokens": 320, "wall_s": 1.0}
    spec = TrainSpec(run="cgrpo_s0_g2-8_dauto_r0", method="cgrpo", model="m", splits="s", task={}, seed=0, trainer={},
                     peft=None, reference_budget=8, budget_grid=[2, 8], delta="auto", recalibrate_every=0)
    record = _run_record(spec, trainer, wall=3.0, initial=initial)
    assert record["train_rollouts_generated"] == 46 and record["lockstep_rollouts_generated"] == 6
    assert record["train_rollout_savings"] == pytest.approx(1 - 46 / 80)
    assert record["train_rollout_savings_with_calibration"] == pytest.approx(1 - (46 + 32) / 80)
    assert record["generation_wall_s"] == 1.5 and record["update_wall_s"] == pytest.approx(3.0 - 1.5)


def _fixed_run(root, name="grpo_s1_G32", **overrides):
    run = root / name
    (run / "model").mkdir(parents=True)
    (run / "model" / "model.safetensors").write_bytes(b"weights")
    (run / "steps.csv").write_text("step,loss\n1,0.5\n")
    record = {"run": name, "method": "grpo", "seed": 1, "num_generations": 32, "compute_matched": False,
              "train_wall_s": 12.5, **overrides}
    (run / "run.json").write_text(json.dumps(record))
    return run


def test_copy_is_relabelled_and_keeps_the_measurements(tmp_path):
    source = _fixed_run(tmp_path)
    target = tmp_path / "grpo_s1_G32_matched"
    reuse_compute_matched(source, target)
    record = json.loads((target / "run.json").read_text())
    assert record == {"run": "grpo_s1_G32_matched", "method": "grpo", "seed": 1, "num_generations": 32,
                      "compute_matched": True, "train_wall_s": 12.5, "reused_from": "grpo_s1_G32"}
    assert (target / "model" / "model.safetensors").read_bytes() == b"weights"
    assert (target / "steps.csv").read_text() == (source / "steps.csv").read_text()


@pytest.mark.parametrize("overrides", [{"method": "cgrpo"}, {"compute_matched": True}])
def test_refuses_anything_but_a_fixed_group_run(tmp_path, overrides):
    source = _fixed_run(tmp_path, **overrides)
    target = tmp_path / "copy"
    with pytest.raises(ValueError, match="not a fixed-G GRPO run"):
        reuse_compute_matched(source, target)
    assert not target.exists()


def test_timed_grpo_trainer_counts_training_generation_only(tiny_model_dir, tmp_path):
    from trl import GRPOConfig

    from cgrpo.pipeline.timing import TimedGRPOTrainer, generation_seconds
    from test_trainer import _data, _length_reward

    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, num_generations=4, max_completion_length=5,
                      per_device_train_batch_size=8, max_steps=3, report_to=[], save_strategy="no", seed=0)
    trainer = TimedGRPOTrainer(model=tiny_model_dir, reward_funcs=_length_reward, args=args, train_dataset=_data(32))
    trainer.train()
    totals = trainer.generation_totals
    # 3 steps of 2 prompts x 4 completions.
    assert totals["train_rollouts"] == 3 * 8
    assert 3 * 8 <= totals["train_tokens"] <= 3 * 8 * 5
    assert generation_seconds(trainer) == totals["generation_s"] > 0
    trainer.model.eval()
    trainer._generate(["1+1="] * 4)
    assert totals["train_rollouts"] == 3 * 8
