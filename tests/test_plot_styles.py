"""One look across the figures: every colour and marker comes from `cgrpo.pipeline.analysis.styles`.

The code check reads `plots.py`: no colour written in it, no colormap, and every figure-drawing function reaches the
styles map. The drawing check draws the default experiment's figures from the committed reference tables and reads
back each method's colour from the figures' legends: C-GRPO is one colour in all of them.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from matplotlib.collections import LineCollection
from matplotlib.colors import to_hex

from cgrpo.pipeline.analysis import plots, styles
from cgrpo.pipeline.configuration.methods import METHODS
from cgrpo.stopping import rule_names

REFERENCE = Path(__file__).resolve().parents[1] / "results" / "reference"
COLOR_KEYWORDS = {"color", "c", "colors", "facecolor", "edgecolor", "markeredgecolor", "markerfacecolor", "ecolor"}


def test_every_method_and_shipped_rule_has_its_own_colour_and_marker():
    names = [*METHODS, "base", *rule_names()]
    looks = {name: styles.style(name) for name in names}
    # The replay's conformal and fixed rules are C-GRPO and GRPO.
    assert looks["conformal"] == looks["cgrpo"] and looks["fixed"] == looks["grpo"]
    own = {name: look for name, look in looks.items() if name not in styles.RULE_METHODS}
    assert all(look in styles.STYLES.values() for look in own.values())
    assert len({look.color for look in own.values()}) == len(own) == len({look.marker for look in own.values()})
    # A plugin's rule gets a look of its own, the same every time.
    assert styles.style("lead") == styles.style("lead") and styles.style("lead") not in styles.STYLES.values()


def test_shades_keep_a_methods_colour_first_and_stay_apart():
    family = styles.shades(styles.STYLES["grpo"].color, 4)
    assert family[0] == styles.STYLES["grpo"].color.lower() and len(set(family)) == 4
    assert styles.progression("#0072B2", 3)[0] == "#0072b2"


def _functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    return {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}


def _uses_styles(name: str, functions: dict[str, ast.FunctionDef], seen: set[str]) -> bool:
    """Whether function `name` of plots.py reads `styles`, itself or through a function of the module it calls."""
    seen.add(name)
    for node in ast.walk(functions[name]):
        if isinstance(node, ast.Name) and node.id == "styles":
            return True
        if isinstance(node, ast.Name) and node.id in functions and node.id not in seen:
            if _uses_styles(node.id, functions, seen):
                return True
    return False


def test_the_plotting_code_takes_every_colour_and_marker_from_the_one_map():
    tree = ast.parse(Path(inspect.getfile(plots)).read_text())
    written = [
        f"line {node.lineno}: {keyword.arg}={keyword.value.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        for keyword in node.keywords
        if keyword.arg in COLOR_KEYWORDS | {"marker", "fmt"}
        and isinstance(keyword.value, ast.Constant)
        and keyword.value.value not in ("none",)
    ]
    assert written == [], "colours or markers written in plots.py instead of taken from styles"
    assert "get_cmap" not in inspect.getsource(plots) and "plt.cm." not in inspect.getsource(plots)
    functions = _functions(tree)
    drawing = [name for name in plots.__all__ if name.startswith("plot_") and name != "plot_all"]
    assert len(drawing) == 7
    assert [name for name in drawing if not _uses_styles(name, functions, set())] == []


def _drawn(monkeypatch) -> dict[str, plt.Figure]:
    """Every figure of the default experiment, drawn from the reference tables and kept open, by file stem."""
    figures = {}
    monkeypatch.setattr(plots, "_save", lambda fig, path: figures.__setitem__(Path(path).stem, fig))
    names = ["summary", "by_method", "steps", "calibrations", "coverage", "delta_sweep", "frontier"]
    tables = {name: pd.read_csv(REFERENCE / f"{name}.csv") for name in names}
    stems = ["pareto", "training_curves", "thresholds", "coverage", "delta_sweep", "frontier"]
    plots.plot_all(tables, {stem: f"{stem}.png" for stem in stems})
    plots.plot_replay(pd.read_csv(REFERENCE / "replay.csv"), "replay.png")
    return figures


def _legend_colours(fig: plt.Figure) -> dict[str, str]:
    colours = {}
    for ax in fig.axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            line = handle.lines[0] if hasattr(handle, "lines") else handle
            colour = line.get_color() if hasattr(line, "get_color") else line.get_facecolor()[0]
            colours[label] = to_hex(colour if not hasattr(colour, "shape") or colour.ndim == 1 else colour[0])
    return colours


def test_every_figure_draws_each_method_in_its_colour(monkeypatch):
    figures = _drawn(monkeypatch)
    cgrpo = styles.STYLES["cgrpo"].color.lower()
    seen = {}
    for stem, fig in figures.items():
        for label, colour in _legend_colours(fig).items():
            if label.startswith("C-GRPO"):
                seen[stem] = colour
    # Every figure that names C-GRPO in a legend draws it in C-GRPO's colour (the first shade is the colour itself).
    assert set(seen) >= {"pareto", "training_curves", "coverage", "frontier", "replay"}
    assert set(seen.values()) == {cgrpo}, seen
    replay = _legend_colours(figures["replay"])
    assert replay["Fixed G"] == styles.STYLES["grpo"].color.lower()
    plt.close("all")


def test_no_figure_draws_lines_through_a_single_point(monkeypatch):
    figures = _drawn(monkeypatch)
    # The default runs one delta: its sweep is that setting's row, a table, not a line through one point.
    sweep = figures["delta_sweep"]
    assert any(ax.tables for ax in sweep.axes) and not any(ax.lines for ax in sweep.axes)
    # One calibration: the thresholds run along the grid's budgets, not along the one calibration step.
    [line] = [line for line in figures["thresholds"].axes[0].lines if line.get_label().startswith("calibration")]
    assert list(line.get_xdata()) == [2, 4, 8, 16, 32]
    # The reward panel says what it averages.
    assert "mean over" in figures["training_curves"].axes[0].get_ylabel()
    plt.close("all")


@pytest.mark.parametrize("mode", ["auto", "0.2"])
def test_the_coverage_targets_are_drawn_per_run(monkeypatch, mode):
    figures = _drawn(monkeypatch)
    coverage = pd.read_csv(REFERENCE / "coverage.csv")
    rows = coverage[coverage["delta_mode"].astype(str) == mode]
    panel = next(ax for ax in figures["coverage"].axes if ax.get_title() == f"delta: {mode}")
    # One nominal dash per run and budget, at that run's own 1 - delta: the horizontal segments of the panel.
    heights = sorted(
        round(float(start[1]), 6)
        for collection in panel.collections
        if isinstance(collection, LineCollection)
        for start, end in (segment[:2] for segment in collection.get_segments() if len(segment) == 2)
        if start[1] == end[1] and start[0] != end[0]
    )
    assert sorted(round(value, 6) for value in rows["nominal"]) == heights
    plt.close("all")


def test_the_learning_curve_figure_takes_its_colours_from_the_one_map(monkeypatch):
    from cgrpo.pipeline.analysis import budget_plots

    source = Path(inspect.getfile(budget_plots)).read_text()
    written = [
        keyword.arg
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        for keyword in node.keywords
        if keyword.arg in COLOR_KEYWORDS | {"marker"} and isinstance(keyword.value, ast.Constant)
    ]
    assert written == [] and "styles." in source
    figures = {}
    monkeypatch.setattr(budget_plots, "_save", lambda fig, path: figures.__setitem__("curves", fig))
    rows = [
        {"method": method, "label": label, "setting": setting, "rollouts": x, "CPU seconds": x / 100}
        | {"training rollouts": x, "sampled accuracy": accuracy, "target accuracy": 0.55, "best fixed G": "G=4"}
        | {f"difference to best fixed G{end}": 0.0 for end in ("", " 95% CI low", " 95% CI high")}
        for method, label, setting, accuracy in (
            ("cgrpo", "C-GRPO", "delta auto", 0.5),
            ("cgrpo", "C-GRPO", "delta 0.5", 0.4),
            ("grpo", "GRPO", "G=4", 0.5),
            ("grpo", "GRPO", "G=8", 0.6),
        )
        for x in (0.0, 100.0)
    ]
    budget_plots.plot_learning_curves(pd.DataFrame(rows), "curves.png")
    colours = _legend_colours(figures["curves"])
    # One line per method, each in its method's colour: GRPO at the best fixed G (chosen on validation prompts, so
    # not necessarily the most accurate here), C-GRPO at its setting most accurate at the budget.
    assert colours == {
        "C-GRPO (delta auto)": styles.STYLES["cgrpo"].color.lower(),
        "GRPO (G=4)": styles.STYLES["grpo"].color.lower(),
    }
