"""Two CPU processes (gloo) train C-GRPO in lockstep and agree on thresholds and metrics."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_two_ranks

SCRIPT = Path(__file__).parent / "distributed" / "train_two_ranks.py"
# Two training processes take about 15 s to start: .ci/run runs them in its long step and against the oldest TRL.
pytestmark = pytest.mark.long


@pytest.fixture(scope="module")
def ranks(tiny_model_dir, tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("two-ranks")
    return run_two_ranks(SCRIPT, tiny_model_dir, out)


def test_both_ranks_train_and_hold_identical_thresholds(ranks):
    assert [rank["world_size"] for rank in ranks] == [2, 2]
    # The seconds a calibration took are this process's own; what it fitted must agree.
    fitted = [
        [{k: v for k, v in c.items() if k not in ("wall_s", "cpu_s")} for c in rank["calibrations"]] for rank in ranks
    ]
    assert fitted[0] == fitted[1]
    assert [c["step"] for c in ranks[0]["calibrations"]] == [0, 2]


def test_logged_budget_metrics_count_both_ranks_groups(ranks):
    for step, logged in enumerate(ranks[0]["mean_k"]):
        groups = ranks[0]["local_ks"][step] + ranks[1]["local_ks"][step]
        assert logged == pytest.approx(sum(groups) / len(groups))
    assert ranks[0]["mean_k"] == ranks[1]["mean_k"]
    totals = [rank["totals"] for rank in ranks]
    assert totals[0]["groups"] == totals[1]["groups"] == 2 * 2 * 3  # 2 ranks x 2 groups x 3 steps
    all_ks = [k for rank in ranks for step in rank["local_ks"] for k in step]
    assert totals[0]["train_rollouts"] == totals[1]["train_rollouts"] == sum(all_ks)
    # The verifier passes exactly the even prompts, which stop at the first budget; the others use all 8.
    assert set(all_ks) <= {2, 8}


def test_lockstep_rows_are_counted_for_all_ranks(ranks):
    training = 0
    for step in zip(ranks[0]["local_ks"], ranks[1]["local_ks"]):
        for drawn, budget in [(2, 4), (4, 8)]:
            active = [sum(1 for k in ks if k > drawn) for ks in step]
            training += (2 * max(active) - sum(active)) * (budget - drawn)
    # Two calibrations of 5 prompts in calls of 2 per rank: rank 0's fifth prompt is sampled while rank 1 idles.
    calibration = 2 * 8
    assert ranks[0]["totals"]["lockstep_rollouts"] == ranks[1]["totals"]["lockstep_rollouts"] == training + calibration
