"""The digests the README and docs show: figures copied from the committed tables, the verdict read off them."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from cgrpo.pipeline.analysis.digest import budget_digest, confounds_digest, verdict_digest

DIFFERENCE = "accuracy at budget minus best fixed G"
EXCLUDED = f"{DIFFERENCE} at equal training rollouts"


def _row(method: str, label: str, setting: str, accuracy: float, difference: float, low: float, high: float) -> dict:
    return {
        "method": method,
        "label": label,
        "setting": setting,
        "budget": 4096.0,
        "best fixed G": "G=4",
        "accuracy at budget": accuracy,
        "accuracy at budget 95% CI low": accuracy - 0.05,
        "accuracy at budget 95% CI high": accuracy + 0.05,
        DIFFERENCE: difference,
        f"{DIFFERENCE} 95% CI low": low,
        f"{DIFFERENCE} 95% CI high": high,
        f"{DIFFERENCE} detectable at 80% power": (high - low) / 2 * 1.43,
        "best fixed G chosen on": "validation prompts",
        EXCLUDED: difference + 0.01,
        f"{EXCLUDED} 95% CI low": low + 0.01,
        f"{EXCLUDED} 95% CI high": high + 0.01,
        "AUC minus best fixed G": difference,
        "rollouts to target": math.inf if difference < 0 else 3000.0,
        "CPU seconds to target": math.inf if difference < 0 else 20.4,
        "speed-up to target over best fixed G": 0.0 if difference < 0 else 1.2,
        "CPU speed-up to target over best fixed G": 0.0 if difference < 0 else 1.1,
        "informative_group_share": 0.5,
    }


def _folder(tmp_path, rows) -> str:
    pd.DataFrame(rows).to_csv(tmp_path / "budget_comparison.csv", index=False)
    return tmp_path


def test_the_verdict_names_the_best_fixed_g_unless_a_method_beats_it_beyond_its_interval(tmp_path):
    rows = [
        _row("grpo", "GRPO", "G=4", 0.57, 0.0, 0.0, 0.0),
        _row("grpo", "GRPO", "G=8", 0.56, -0.01, -0.03, 0.01),
        _row("cgrpo", "C-GRPO", "delta auto", 0.54, -0.03, -0.05, -0.01),
        _row("signal", "Signal stop", "0.1", 0.565, -0.005, -0.02, 0.01),
    ]
    digest = verdict_digest({"arithmetic": _folder(tmp_path, rows)})
    cells = [cell.strip() for cell in digest.splitlines()[2].strip("|").split("|")]
    assert cells[0] == "arithmetic, 4,096 rollouts"
    assert cells[1] == "GRPO G=4 (chosen on validation prompts): 0.570 [0.520, 0.620]"
    # Real minus signs, both views of calibration.
    assert cells[2] == "−0.030 (−0.050 to −0.010), delta auto"
    assert cells[3] == "−0.020 (−0.040 to 0.000)"
    assert cells[4] == "Signal stop: −0.005 (−0.020 to 0.010)"
    # Nothing beats G = 4 beyond its interval; detectable at 80% power is 1.43 half-widths, averaged over the two
    # methods other than GRPO (half-widths 0.02 and 0.015).
    assert cells[5] == "GRPO G=4" and cells[6] == f"±{(0.02 + 0.015) / 2 * 1.43:.3f}"
    # The table reads alone: every term it uses is defined under it.
    for term in ("Rollout", "Best fixed G", "Calibration excluded", "Detectable (80% power)", "ESC"):
        assert f"**{term}**" in digest


def test_a_table_from_before_the_comparison_measured_a_column_says_so(tmp_path):
    old = {"best fixed G chosen on", f"{DIFFERENCE} detectable at 80% power"} | {
        f"{EXCLUDED}{end}" for end in ("", " 95% CI low", " 95% CI high")
    }
    rows = [
        {key: value for key, value in row.items() if key not in old}
        for row in (
            _row("grpo", "GRPO", "G=4", 0.57, 0.0, 0.0, 0.0),
            _row("cgrpo", "C-GRPO", "delta auto", 0.54, -0.03, -0.05, -0.01),
        )
    ]
    cells = [
        cell.strip() for cell in verdict_digest({"a": _folder(tmp_path, rows)}).splitlines()[2].strip("|").split("|")
    ]
    assert cells[1].startswith("GRPO G=4 (chosen on eval prompts)")
    assert cells[3] == "not measured (a run before this comparison)"
    assert cells[6] == f"\u00b1{0.02 * 1.4286:.3f}"


def _before_fixes(row: dict) -> dict:
    """`row` as a table from before the confounds' fixes wrote it: no calibration-excluded view, no validation."""
    return {key: value for key, value in row.items() if not key.startswith(EXCLUDED) and "chosen on" not in key}


def test_the_confounds_table_puts_each_verdict_figure_before_and_after_the_fixes(tmp_path):
    before, after = tmp_path / "before", tmp_path / "after"
    for folder in (before, after):
        folder.mkdir()
    old = [_row("grpo", "GRPO", "G=4", 0.57, 0.0, 0.0, 0.0), _row("cgrpo", "C-GRPO", "d", 0.55, -0.02, -0.03, -0.01)]
    _folder(before, [_before_fixes(row) for row in old])
    new = [_row("grpo", "GRPO", "G=2", 0.6, 0.0, 0.0, 0.0), _row("cgrpo", "C-GRPO", "d", 0.6, 0.0, -0.01, 0.01)]
    _folder(after, [{**row, "best fixed G": "G=2"} for row in new])
    lines = confounds_digest({"mix": before}, {"mix": after}).splitlines()
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]
    assert rows[0] == [
        "mix, 4,096 rollouts",
        "best fixed G",
        "GRPO G=4 (chosen on eval prompts): 0.570 [0.520, 0.620]",
        "GRPO G=2 (chosen on validation prompts): 0.600 [0.550, 0.650]",
    ]
    assert rows[1][2:] == ["−0.020 (−0.030 to −0.010), d", "0.000 (−0.010 to 0.010), d"]
    assert rows[2][2:] == ["not measured (a run before this comparison)", "0.010 (0.000 to 0.020)"]
    assert len(rows) == 6 and all(row[0] == "" for row in rows[1:])
    with pytest.raises(ValueError, match="different experiments"):
        confounds_digest({"mix": before}, {"other": after})


def test_a_method_above_the_best_fixed_g_beyond_its_interval_is_the_one_to_use(tmp_path):
    rows = [
        _row("grpo", "GRPO", "G=4", 0.57, 0.0, 0.0, 0.0),
        _row("cgrpo", "C-GRPO", "delta 0.5", 0.6, 0.03, 0.01, 0.05),
    ]
    assert "| C-GRPO delta 0.5 |" in verdict_digest({"arithmetic": _folder(tmp_path, rows)})


def test_a_target_never_reached_reads_as_such(tmp_path):
    rows = [
        _row("grpo", "GRPO", "G=4", 0.57, 0.0, 0.0, 0.0),
        _row("cgrpo", "C-GRPO", "delta auto", 0.5, -0.07, -0.1, -0.04),
    ]
    digest = budget_digest(_folder(tmp_path, rows))
    assert "| not reached | 0.00 [0.00, 0.00] |" not in digest and "| not reached | 0.00 |" in digest
