"""Which checkpoint a pipeline training run resumes from, and where checkpoints may fall."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from cgrpo.pipeline.configuration.specs import TrainSpec
from cgrpo.pipeline.jobs.checkpoints import SPEC_FILE, TOTALS_FILE, align_save_steps, resume_point

SPEC = TrainSpec(
    run="grpo_s0_G8",
    method="grpo",
    model="m",
    splits="s",
    task={"name": "arithmetic", "options": {}},
    seed=0,
    trainer={"learning_rate": 1e-4},
    peft=None,
    reference_budget=8,
    num_generations=8,
)


def _checkpoint(folder, step: int, complete: bool = True) -> None:
    path = folder / f"checkpoint-{step}"
    path.mkdir(parents=True)
    if complete:
        (path / TOTALS_FILE).write_text("{}")


def test_resumes_from_the_latest_complete_checkpoint_of_the_same_spec(tmp_path):
    assert resume_point(tmp_path, SPEC) is None
    for step, complete in ((2, True), (10, True), (12, False)):
        _checkpoint(tmp_path, step, complete)
    # checkpoint-12 was being written when the job was killed; 10 sorts after 2 as a number.
    assert resume_point(tmp_path, SPEC) == str(tmp_path / "checkpoint-10")


def test_checkpoints_of_another_spec_are_discarded(tmp_path):
    resume_point(tmp_path, SPEC)
    _checkpoint(tmp_path, 4)
    changed = dataclasses.replace(SPEC, trainer={"learning_rate": 2e-4})
    assert resume_point(tmp_path, changed) is None
    assert not (tmp_path / "checkpoint-4").exists()
    assert (tmp_path / SPEC_FILE).is_file()


def test_checkpoints_without_a_recorded_spec_are_discarded(tmp_path):
    _checkpoint(tmp_path, 4)
    assert resume_point(tmp_path, SPEC) is None


@pytest.mark.parametrize(
    ("save_steps", "steps_per_generation", "iterations", "accumulation", "expected"),
    [
        (5, 2, 1, 1, 6),
        (6, 2, 1, 1, 6),
        (5, 4, 1, 2, 6),
        (3, 1, 2, 1, 4),
        (1, 1, 1, 1, 1),
        # Generation batches shorter than an optimizer step, or not a whole number of them (GRPO and DAPO allow both).
        (5, 1, 1, 2, 5),
        (5, 3, 1, 2, 6),
        (2, 3, 1, 2, 3),
        (1, 2, 1, 4, 1),
    ],
)
def test_save_steps_round_up_to_whole_generation_batches(
    save_steps, steps_per_generation, iterations, accumulation, expected
):
    args = SimpleNamespace(
        save_strategy="steps",
        save_steps=save_steps,
        steps_per_generation=steps_per_generation,
        num_iterations=iterations,
        gradient_accumulation_steps=accumulation,
    )
    align_save_steps(args)
    assert args.save_steps == expected


def test_cpu_seconds_count_this_process_and_its_ended_children():
    from cgrpo.costs import cpu_seconds

    start = cpu_seconds()
    # A child that burns about 0.3 s of CPU; its time counts once it has been waited for.
    subprocess.run(
        [sys.executable, "-c", "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass"],
        check=True,
    )
    assert cpu_seconds() - start >= 0.3


def test_training_time_and_cpu_time_carry_across_a_resume(tmp_path):
    from cgrpo.pipeline.jobs.checkpoints import ResumableTotals

    checkpoint = tmp_path / "checkpoint-4"
    checkpoint.mkdir()
    (checkpoint / TOTALS_FILE).write_text(
        json.dumps({"train_wall_s": 10.0, "train_cpu_s": 7.0, "generation_totals": None})
    )
    totals = ResumableTotals(SimpleNamespace(), str(checkpoint))
    assert 10.0 <= totals.elapsed() < 11.0 and 7.0 <= totals.cpu_elapsed() < 8.0
    state = SimpleNamespace(is_world_process_zero=True, global_step=6)
    (tmp_path / "checkpoint-6").mkdir()
    totals.on_save(SimpleNamespace(output_dir=str(tmp_path)), state, None)
    saved = json.loads((tmp_path / "checkpoint-6" / TOTALS_FILE).read_text())
    assert saved["train_cpu_s"] >= 7.0 and saved["train_wall_s"] >= 10.0
