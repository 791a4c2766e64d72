"""cgrpo.runs.reuse_compute_matched: the copy that stands in for a compute-matched run equal to a fixed-G run."""

from __future__ import annotations

import json

import pytest

from cgrpo.runs import reuse_compute_matched


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
