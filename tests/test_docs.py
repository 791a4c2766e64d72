"""The manual stays true: its links resolve and its generated parts equal what their one source says."""

from __future__ import annotations

import importlib.util
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [
    REPO / "README.md",
    REPO / "config" / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def load_generator():
    spec = importlib.util.spec_from_file_location("generate_docs", REPO / "scripts" / "generate_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation other than '-' and '_' removed, spaces to '-'."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor, with GitHub's -1, -2 suffixes for repeated headings."""
    seen: dict[str, int] = {}
    result = set()
    for heading in re.findall(r"^#{1,6} (.+)$", FENCE.sub("", page.read_text()), re.MULTILINE):
        base = slug(heading)
        count = seen.get(base, 0)
        result.add(base if count == 0 else f"{base}-{count}")
        seen[base] = count + 1
    return result


def relative_links(page: Path) -> list[str]:
    text = CODE_SPAN.sub("", FENCE.sub("", page.read_text()))
    return [target for target in LINK.findall(text) if not re.match(r"[a-z]+:", target)]


def test_slug_follows_github():
    assert slug("Scope, and what is tested how") == "scope-and-what-is-tested-how"
    assert slug("Using `CGRPOTrainer` in your own TRL code") == "using-cgrpotrainer-in-your-own-trl-code"
    assert slug("vLLM: tested on CPU, untested on a GPU") == "vllm-tested-on-cpu-untested-on-a-gpu"


def test_the_link_checker_finds_links():
    # A checker that matched no link would pass every page; the README links to several docs pages.
    assert len([link for link in relative_links(REPO / "README.md") if link.startswith("docs/")]) >= 5


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_every_relative_link_and_anchor_resolves(page):
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no file {resolved}")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading with anchor #{anchor} in {resolved.name}")
    assert not broken, f"{page.name}: " + "; ".join(broken)


def test_docs_have_one_page_per_concern_and_a_short_front_page():
    assert len(list((REPO / "docs").glob("*.md"))) >= 5
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    for marker in ("<!-- run-command -->", "<!-- test-command -->"):
        assert readme.count(marker) == 1, marker


def test_generated_parts_equal_their_sources():
    stale = load_generator().stale_pages()
    assert not stale, f"out of date: {[str(p.relative_to(REPO)) for p in stale]}; run python scripts/generate_docs.py"


def test_every_committed_figure_is_what_the_current_code_draws_from_its_tables():
    # A figure left from older plot code or another colour map is stale, whatever its age.
    generator = load_generator()
    committed = subprocess.run(["git", "ls-files", "*.png"], cwd=REPO, capture_output=True, text=True, check=True)
    registered = {path.relative_to(REPO).as_posix() for path in generator.figures()}
    assert set(committed.stdout.split()) == registered
    stale = generator.stale_figures()
    assert not stale, f"stale: {[str(p.relative_to(REPO)) for p in stale]}; run python scripts/generate_docs.py"


def test_a_figure_drawn_with_another_colour_is_found_stale(tmp_path, monkeypatch):
    generator = load_generator()
    pareto = generator.RESULTS / "with_dapo" / "pareto.png"
    drawn = generator.figures()[pareto]
    from cgrpo.pipeline.analysis import styles

    # C-GRPO in GRPO's colour: what a figure from before the one colour map looked like.
    monkeypatch.setitem(styles.STYLES, "cgrpo", styles.STYLES["grpo"])
    drawn(tmp_path / "pareto.png")
    monkeypatch.undo()
    monkeypatch.setattr(generator, "figures", lambda: {tmp_path / "pareto.png": drawn})
    assert generator.stale_figures() == [tmp_path / "pareto.png"]


def test_every_trainer_option_is_in_the_generated_table():
    from cgrpo import CGRPOConfig

    table = (REPO / "docs" / "trainer.md").read_text()
    own = inspect.get_annotations(CGRPOConfig)
    for name in own:
        help_text = " ".join(CGRPOConfig.__dataclass_fields__[name].metadata["help"].split())
        assert f"| `{name}` |" in table and help_text.replace("|", "\\|") in table, name


def test_every_config_key_has_a_description():
    schema = load_generator().yaml.safe_load((REPO / "workflow" / "schemas" / "config.schema.yaml").read_text())
    # The generator raises on the first key without a description; the keys it lists all reach config/README.md.
    text = load_generator().config_keys(schema)
    for section, node in schema["properties"].items():
        assert f"### `{section}`" in text
        for key in node.get("properties", {}):
            assert f"- `{key}`" in text, f"{section}.{key}"


def test_a_key_without_description_is_refused():
    generator = load_generator()
    schema = {"properties": {"experiment": {"type": "string"}}, "$defs": {}}
    with pytest.raises(ValueError, match="lacks a description"):
        generator.config_keys(schema)


# A pointer to a section by page and heading, as comments and docstrings write it: (docs/results.md, "Run time").
SECTION_POINTER = re.compile(r"\b(README(?:\.md)?|docs/[\w-]+\.md),\s+\"([^\"]+)\"")
POINTER_FILES = ("*.py", "*.yaml", "*.toml", "*.md", "*.smk", "*.sh", "Snakefile")


def section_pointers(path: Path) -> list[tuple[str, str]]:
    """(page, heading) of every section pointer in `path`, comment markers and line breaks inside it ignored."""
    text = re.sub(r"\s*\n\s*(?:#+ ?)?", " ", path.read_text())
    return SECTION_POINTER.findall(text)


def pointer_files() -> list[Path]:
    skipped = ("results", ".git", "build")
    return sorted(
        path
        for pattern in POINTER_FILES
        for path in REPO.rglob(pattern)
        if not any(part in skipped or part.endswith(".egg-info") for part in path.relative_to(REPO).parts)
    )


def test_the_pointer_finder_reads_pointers_across_comment_lines(tmp_path):
    code = tmp_path / "x.yaml"
    code.write_text('# in an environment of its own (README,\n# "vLLM"); see docs/results.md, "Run time".\n')
    assert section_pointers(code) == [("README", "vLLM"), ("docs/results.md", "Run time")]


def headings(page: Path) -> list[str]:
    return re.findall(r"^#{1,6} (.+)$", FENCE.sub("", page.read_text()), re.MULTILINE)


def test_every_section_pointer_in_code_and_config_names_a_heading_that_exists():
    pointers = {(path, page, heading) for path in pointer_files() for page, heading in section_pointers(path)}
    # A finder that matched nothing would pass: the configs point to several sections.
    assert len(pointers) >= 10
    # A pointer may shorten a heading to its start: "A fair comparison" for "A fair comparison: what every method ...".
    stale = [
        f"{path.relative_to(REPO)}: ({page}, {heading!r})"
        for path, page, heading in sorted(pointers)
        if not any(h.startswith(heading) for h in headings(REPO / ("README.md" if page.startswith("README") else page)))
    ]
    assert not stale, "sections that no longer exist: " + "; ".join(stale)


PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)
PRINTED = re.compile(
    r"C-GRPO generated (\d+) training and (\d+) calibration rollouts for (\d+) prompts; "
    r"GRPO at G = 32 would have generated (\d+)\."
)


def usage_example(page: Path) -> str:
    """The first Python code block of `page`: the README's and the trainer page's example of `CGRPOTrainer`."""
    return PYTHON_BLOCK.search(page.read_text()).group(1)


def test_the_readme_shows_the_trainer_pages_example():
    # One example, run by the test below: the README's snippet once used names it never defined.
    assert usage_example(REPO / "README.md") == usage_example(REPO / "docs" / "trainer.md")
    # The output the trainer page quotes has the form the example prints.
    assert PRINTED.search((REPO / "docs" / "trainer.md").read_text())


@pytest.mark.slow
def test_the_trainer_example_runs_as_written(tmp_path):
    # As a user runs it: from the repository root, offline; its temporary folder lands in tmp_path, not the checkout.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TMPDIR": str(tmp_path)}
    code = usage_example(REPO / "docs" / "trainer.md")
    # The timeout is a safety net against a hung run, not a speed target: the example takes about 16 s on 2 cores.
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    # Quiet: no deprecation warning about TRL's own calls, and no per-step metric dicts, only TRL's closing summary.
    assert "FutureWarning" not in result.stderr, result.stderr[-3000:]
    assert result.stdout.count("{'") <= 1, result.stdout[-3000:]
    printed = PRINTED.search(result.stdout)
    assert printed, result.stdout[-2000:]
    training, calibration, prompts, grpo = map(int, printed.groups())
    assert (calibration, prompts, grpo) == (32 * 32, 64, 64 * 32)
    # Every prompt drew at least the first budget, and at most the largest.
    assert 2 * prompts <= training <= grpo
    assert len(list(tmp_path.glob("cgrpo-example-*/splits/manifest.json"))) == 1


def workflow_names(list_name: str) -> list[str]:
    """The names in `<list_name> = [...]` of workflow/rules/common.smk (the workflow's tables and plots)."""
    text = (REPO / "workflow" / "rules" / "common.smk").read_text()
    body = re.search(rf"^{list_name} = \[(.*?)\]", text, re.MULTILINE | re.DOTALL).group(1)
    return re.findall(r'"(\w+)"', body)


def test_the_outputs_table_lists_every_table_and_plot():
    section = (REPO / "config" / "README.md").read_text().split("## Outputs")[1].split("\n## ")[0]
    rows = {row.split("|")[1].strip(" `"): row for row in section.splitlines() if row.startswith("| `")}
    tables = workflow_names("TABLES") + workflow_names("REPLAY_TABLES")
    plots = workflow_names("PLOTS") + ["replay"]
    assert len(tables) >= 12 and len(plots) >= 7
    assert [name for name in tables if f"`{name}`" not in rows["tables/"]] == []
    assert [name for name in plots if f"`{name}.png`" not in rows["plots/"]] == []
    assert "logs/" in rows and "tail -f" in rows["logs/"]


def test_the_readme_says_where_job_logs_are_and_how_to_follow_one():
    pipeline = (REPO / "README.md").read_text().split("## The pipeline")[1].split("\n## ")[0]
    assert "results/<experiment>/logs/" in pipeline and "tail -f results/" in pipeline


# --------------------------------------------------------------------------- figures of the results
GENERATED_BLOCK = re.compile(r"<!-- generated:([\w-]+):start -->.*?<!-- generated:\1:end -->", re.DOTALL)
DECIMAL = re.compile(r"(?<![\w.])[-+]?\d{1,3}(?:,\d{3})*\.\d+(?![\w.])")


def hand_written_figures(text: str) -> list[str]:
    """The decimal figures of `text` outside its generated tables, as they read (sign and thousands commas aside)."""
    return [match.lstrip("+-").replace(",", "") for match in DECIMAL.findall(GENERATED_BLOCK.sub("", text))]


def test_the_figure_finder_reads_decimals_and_skips_generated_tables():
    text = "a -0.022 [0.01, +0.5] and 1,755.5 s; <!-- generated:x:start -->0.123<!-- generated:x:end --> v1.2.3 2026"
    assert hand_written_figures(text) == ["0.022", "0.01", "0.5", "1755.5"]


def test_every_figure_of_the_readme_results_is_generated_from_a_committed_table():
    # A figure typed by hand can go stale; the results' figures are written by scripts/generate_docs.py from the
    # tables under results/reference/ (test_generated_parts_equal_their_sources keeps them equal), and the prose
    # around them carries no decimal figure of its own.
    readme = (REPO / "README.md").read_text()
    results = readme.split("<!-- results:start -->")[1].split("<!-- results:end -->")[0]
    assert GENERATED_BLOCK.search(results)
    assert hand_written_figures(results) == []
