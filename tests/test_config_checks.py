"""Every bad workflow config input the planning step catches: one sentence naming the key and the fix.

The schema catches unknown keys and wrong types in the config's own sections; `cgrpo.pipeline.configuration.checks` catches
the rest (GRPOConfig options, batch sizes, scores, deltas, data and model locations). Dry runs through Snakemake, which
show the wiring, are in test_workflow.py.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from pathlib import Path

import pytest
import yaml
from peft import LoraConfig
from trl import GRPOConfig

from cgrpo.pipeline.configuration.checks import ConfigError, check_config
from cgrpo.pipeline.configuration.options import (
    BOOTSTRAP_SETTINGS,
    GRPO_CONFIG,
    LORA_CONFIG,
    dataclass_options,
    option_type,
)
from cgrpo.pipeline.configuration.schema_errors import validate_config
from cgrpo.pipeline.jobs.base_model import BootstrapSettings
from cgrpo.pipeline.tasks.files import DataSource

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"
SMOKE = yaml.safe_load((REPO / "config" / "smoke.yaml").read_text())


def with_change(dotted: str, value) -> dict:
    """The smoke config with ``dotted`` set to ``value``."""
    config = copy.deepcopy(SMOKE)
    *parents, key = dotted.split(".")
    node = config
    for parent in parents:
        node = node.setdefault(parent, {})
    node[key] = value
    return config


def planned(config: dict) -> None:
    """What the workflow does with a config before any job: schema (which fills defaults), then the checks."""
    validate_config(config, SCHEMA)
    check_config(config)


def test_the_smoke_config_passes():
    planned(copy.deepcopy(SMOKE))


# ------------------------------------------------------------------------------------------- unknown keys and types


def _objects(schema, path="config"):
    if isinstance(schema, dict):
        if schema.get("type") == "object" or "properties" in schema:
            yield path, schema
        for key, value in schema.get("properties", {}).items():
            yield from _objects(value, f"{path}.{key}")
        for key, value in schema.get("$defs", {}).items():
            yield from _objects(value, f"$defs.{key}")


def test_every_config_section_refuses_unknown_keys():
    # The sections the schema leaves open are checked against the classes they become (below): GRPOConfig for the
    # trainer sections, LoraConfig for peft, the bootstrap's settings and the task's factory for the options; the maps
    # keyed by stopping rule against the registry and each rule's options (check_stopping_rules), the map keyed by
    # method against the methods (check_learning_rates).
    checked_elsewhere = {
        "$defs.trainer_overrides",
        "config.cgrpo.ablations.settings",
        "config.cgrpo.ablations.options",
        "config.allocators.options",
        "config.allocators.rollouts_per_prompt",
        "config.learning_rates.by_method",
        "config.replay.settings",
        "config.replay.options",
        "config.training",
        "config.task.options",
        "config.base_model.options",
        "config.peft",
    }
    schema = yaml.safe_load(SCHEMA.read_text())
    open_sections = {path for path, node in _objects(schema) if node.get("additionalProperties") is not False}
    assert open_sections == checked_elsewhere


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("trainig", {"max_steps": 3}, "config key trainig is not a key of the config; did you mean training?"),
        ("cgrpo.options.scor", "aps", "config key cgrpo.options.scor is not a key of cgrpo.options; did you mean "),
        ("splits.sizes.tran", 3, "did you mean splits.sizes.train?"),
        ("evaluation.batch", 3, "did you mean evaluation.batch_size?"),
        ("dapo.rounds", 3, "config key dapo.rounds is not a key of dapo; the keys of dapo are num_generations,"),
        ("grpo.compute_matched", "yes", 'config key grpo.compute_matched is "yes", but it must be true or false.'),
        ("seeds", [0, "1"], 'config key seeds[1] is "1", but it must be an integer of at least 0.'),
        ("training.max_steps", -3, "config key training.max_steps is -3, but it must be an integer of at least 1."),
        ("cgrpo.budget_grids", [[2, 4.5, 8]], "config key cgrpo.budget_grids[0][1] is 4.5, but it must be an integer"),
        (
            "cgrpo.deltas",
            ["auto", 1.5],
            "config key cgrpo.deltas[1] is 1.5, but it must be a number in (0, 1) or auto.",
        ),
        ("task.name", "my task", 'config key task.name is "my task", but it must be a string matching'),
        (
            "grpo.num_generations",
            [1],
            "config key grpo.num_generations[0] is 1, but it must be an integer of at least 2.",
        ),
        ("experiment", None, "config key experiment is null, but it must be a string matching"),
        ("cgrpo.budget_grid", [2, 4, 8], "the library's option budget_grid is the pipeline's cgrpo.budget_grids"),
        ("delta_margin", 0.2, "config key delta_margin is not a key of the config; it belongs under cgrpo.options"),
        ("top_p", 0.9, "top_p is a GRPOConfig option: set it under training (every method) or a method's trainer."),
        ("splits.sizes", {"train": 8, "eval": 8}, "config key splits.sizes.calibration is missing: give it an integer"),
        ("seeds", [0, 0], "config key seeds lists a value twice ([0, 0]); give each value once."),
        ("cgrpo.seeds", [0], "config key cgrpo.seeds is not a key of cgrpo; it belongs under the top level (seeds)."),
    ],
)
def test_schema_refuses(key, value, message):
    with pytest.raises(ConfigError) as error:
        planned(with_change(key, value))
    assert message in str(error.value)
    # One sentence (two where it names the nearest key), not jsonschema's dump of the schema.
    assert len(str(error.value)) < 300 and "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("training.learning_rat", 1e-4, "training.learning_rat is not an option of GRPOConfig"),
        ("training.learning_rat", 1e-4, "did you mean 'learning_rate'?"),
        ("cgrpo.trainer.budget_grid", [2, 4], "C-GRPO's own options go under cgrpo.options"),
        ("dapo.trainer.max_sampling_round", 2, "dapo.trainer.max_sampling_round is not an option"),
        ("training.weight_decay", "1e-2", "YAML reads a number such as 1e-5 without a dot as a string"),
        (
            "grpo.trainer.max_grad_norm",
            "big",
            "grpo.trainer.max_grad_norm is 'big' (str), but GRPOConfig.max_grad_norm takes float",
        ),
        ("training.gradient_checkpointing", "yes", "takes bool"),
        ("cgrpo.trainer.seed", 1.5, "takes int"),
        ("training.report_to", 3, "takes None | str | list[str]"),
        ("training.num_generations", 8, "training.num_generations is not allowed"),
        ("grpo.trainer.num_generations", 8, "grpo.trainer.num_generations is not allowed"),
    ],
)
def test_grpo_config_options_are_checked(key, value, message):
    with pytest.raises(ConfigError) as error:
        planned(with_change(key, value))
    assert message in str(error.value)


@pytest.mark.parametrize(
    ("location", "cls"),
    [(GRPO_CONFIG, GRPOConfig), (LORA_CONFIG, LoraConfig), (BOOTSTRAP_SETTINGS, BootstrapSettings)],
    ids=["GRPOConfig", "LoraConfig", "BootstrapSettings"],
)
def test_option_table_is_the_installed_class(location, cls):
    # Read from the sources without importing torch; it must be exactly what the installed class accepts.
    fields = {field.name: field for field in dataclasses.fields(cls) if field.init}
    options = dataclass_options(*location)
    assert set(options) == set(fields)
    for name, field in fields.items():
        if field.default is not dataclasses.MISSING:
            assert options[name].accepts(field.default), (name, field.default, options[name])


def test_peft_and_bootstrap_options_are_checked():
    with pytest.raises(
        ConfigError, match="config key peft.lora_alph is not an option of LoraConfig; did you mean 'lora_alpha'?"
    ):
        planned(with_change("peft", {"lora_alph": 8}))
    with pytest.raises(ConfigError, match="peft.use_rslora is 'yes' \\(str\\), but LoraConfig.use_rslora takes bool"):
        planned(with_change("peft", {"r": 8, "use_rslora": "yes"}))
    with pytest.raises(ConfigError, match="base_model.options.hidden is not an option of BootstrapSettings"):
        planned(with_change("base_model.options.hidden", 32))
    with pytest.raises(ConfigError, match="base_model.options.epochs is 1.5 \\(float\\)"):
        planned(with_change("base_model.options.epochs", 1.5))


@pytest.mark.parametrize(
    ("annotation", "good", "bad"),
    [
        ("int | None", [3, None], [3.5, True, "3"]),
        ("Optional[float]", [1, 1.5, None], ["1.5", False]),
        ("Literal['a', 'b'] | None", ["a", None], ["c", 1]),
        ("list[str] | str", [["x"], "x"], [{"x": 1}]),
        ("dict[str, Any] | str | None", [{}, "{}", None], [[]]),
    ],
)
def test_option_types(annotation, good, bad):
    expected = option_type(annotation)
    assert all(expected.accepts(value) for value in good)
    assert not any(expected.accepts(value) for value in bad)


def test_enum_annotations_are_not_checked():
    # SchedulerType | str: the class turns strings into the enum, and YAML has no enums to compare with.
    assert option_type("SchedulerType | str").accepts(3)


# ------------------------------------------------------------------------------------------- grids and batch sizes


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("cgrpo.budget_grids", [[2, 8, 4]], "cgrpo.budget_grids[0] = [2, 8, 4] must be a strictly increasing"),
        ("cgrpo.budget_grids", [[2, 4.0, 8]], "must be a strictly increasing list of integers"),
        ("cgrpo.budget_grids", [[1, 2, 4]], "advantage is always zero"),
        # One budget: no prompt can stop early, so the run would be GRPO at G = 8 under C-GRPO's name.
        ("cgrpo.budget_grids", [[8]], "cgrpo.budget_grids[0]: grid [8] holds one budget"),
        ("replay.budget_grid", [2, 16, 8], "replay.budget_grid = [2, 16, 8] must be a strictly increasing"),
        ("replay.budget_grid", [1, 2, 4], "advantage is always zero"),
        # The smoke batch is 8 rows: groups of 16 (with one micro-batch per generation), 3 or 6 do not fit whole.
        (
            "cgrpo.trainer",
            {"steps_per_generation": 1},
            "cgrpo.budget_grids has group size 16, but cgrpo's generation batch of 8",
        ),
        # Baselines train C-GRPO's prompts per step: 8 rows of 16-wide groups are half a prompt, 1.5 rows of G = 3.
        ("grpo.num_generations", [3], "grpo.num_generations has group size 3, but C-GRPO trains 8/16 prompts"),
        ("dapo.num_generations", [5], "dapo.num_generations has group size 5, but C-GRPO trains 8/16 prompts"),
    ],
)
def test_grids_and_batch_sizes(key, value, message):
    config = with_change(key, value)
    config["cgrpo"]["budget_grids"] = config["cgrpo"]["budget_grids"] if key == "cgrpo.budget_grids" else [[2, 4, 16]]
    with pytest.raises(ConfigError) as error:
        planned(config)
    assert message in str(error.value)


def test_every_method_shares_one_generation_schedule():
    with pytest.raises(
        ConfigError,
        match="min_generation_prompts would give C-GRPO a generation schedule of its own; "
        "set training.steps_per_generation instead",
    ):
        planned(with_change("cgrpo.options.min_generation_prompts", 16))
    # A grid of 16-wide groups needs a generation batch of 16 rows for C-GRPO and 8 of GRPO at G = 8 (half a prompt
    # per 8-row step): 2 steps per generation, for every method.
    config = with_change("cgrpo.budget_grids", [[2, 4, 16]])
    config["grpo"]["num_generations"] = [8]
    config["dapo"]["num_generations"] = [16]
    config["training"]["steps_per_generation"] = 2
    planned(config)


def test_batch_size_counts_every_micro_batch_of_a_generation():
    # 4 rows per micro-batch, 2 micro-batches per generation: groups of 8 fit.
    config = with_change("training.per_device_train_batch_size", 4)
    config["training"]["gradient_accumulation_steps"] = 2
    planned(config)
    config["dapo"]["trainer"] = {"steps_per_generation": 1}
    with pytest.raises(ConfigError, match="dapo's generation batch of 4 rows"):
        planned(config)


# ------------------------------------------------------------------------------------------- scores and deltas


def test_score_the_task_cannot_compute():
    with pytest.raises(ConfigError, match="task 'arithmetic' has no verifier; use 'aps'"):
        planned(with_change("cgrpo.options.score", "first_success"))
    config = with_change("task", {"name": "code", "options": {"num_examples": 100}})
    config["base_model"]["options"]["task"] = "code"
    with pytest.raises(ConfigError, match="judges programs by running them; use first_success or pass_rate"):
        planned(config)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        # The smoke config calibrates on 8 examples: they certify 1/(8+1) = 0.1111, coverage up to 0.8889.
        ("cgrpo.deltas", ["auto", 0.1], "cgrpo.deltas has 0.1, below 1/(n+1) = 0.1111"),
        ("cgrpo.deltas", [0.1], "which certify coverage up to 0.8889 only"),
        ("evaluation.deltas", [0.05], "evaluation.deltas has 0.05, below 1/(n+1) = 0.1111"),
    ],
)
def test_fixed_delta_the_calibration_size_cannot_support(key, value, message):
    with pytest.raises(ConfigError) as error:
        planned(with_change(key, value))
    assert message in str(error.value)


def test_calibration_options_larger_than_the_calibration_split():
    # The smoke config's split holds 8 calibration examples; each calibration job would refuse 6 + 4 of them.
    config = with_change("cgrpo.options.num_calibration_samples", 6)
    config["cgrpo"]["options"]["calibration_holdout"] = 4
    with pytest.raises(ConfigError, match=r"need 10 calibration examples, but splits.sizes.calibration is 8"):
        planned(config)
    config["cgrpo"]["options"]["calibration_holdout"] = 2
    planned(config)


def test_a_task_no_plugin_registers_is_named_with_the_nearest_one():
    with pytest.raises(
        ConfigError, match=r"config key task.name: Unknown task 'arithmatic'; did you mean 'arithmetic'"
    ):
        planned(with_change("task.name", "arithmatic"))


# ------------------------------------------------------------------------------------------- data and models


def _gsm8k(tmp_path: Path, rows: list[dict], name: str = "gsm8k_train.jsonl", eval_split=None) -> dict:
    path = tmp_path / name
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = with_change("task", {"name": "gsm8k", "options": {"source": str(tmp_path / "gsm8k_{split}.jsonl")}})
    config["splits"]["eval_source_split"] = eval_split
    return config


GOOD_ROW = {"question": "What is 2 + 2?", "answer": "2 + 2 = 4\n#### 4"}


def test_local_dataset_is_checked(tmp_path):
    planned(_gsm8k(tmp_path, [GOOD_ROW]))
    with pytest.raises(ConfigError, match=r"GSM8K file .*gsm8k_test.jsonl does not exist; fix the path"):
        planned(_gsm8k(tmp_path, [GOOD_ROW], eval_split="test"))
    with pytest.raises(ConfigError, match=r"lacks column\(s\) answer \(it has problem, question\)"):
        planned(_gsm8k(tmp_path, [{"question": "q", "problem": "p"}]))


def test_json_file_of_json_lines_is_read(tmp_path):
    # datasets' json builder reads JSON Lines under a .json name; the dry run reads its first line.
    config = _gsm8k(tmp_path, [GOOD_ROW, GOOD_ROW], name="gsm8k_train.json")
    config["task"]["options"]["source"] = str(tmp_path / "gsm8k_{split}.json")
    planned(config)
    (tmp_path / "gsm8k_train.json").write_text(json.dumps([{"question": "q"}]))
    with pytest.raises(ConfigError, match=r"lacks column\(s\) answer \(it has question\)"):
        planned(config)


@pytest.mark.parametrize("task", [{"name": "arithmetic", "options": {}}, {"name": "code", "options": {}}])
def test_generated_task_has_no_eval_source_split(task):
    config = with_change("task", task)
    config["splits"]["eval_source_split"] = "test"
    with pytest.raises(
        ConfigError,
        match=r"^config key splits.eval_source_split is 'test', but task '\w+' generates "
        r"one pool .*leave splits.eval_source_split unset \(null\)",
    ):
        planned(config)


def test_one_file_cannot_serve_an_eval_split(tmp_path):
    (tmp_path / "all.jsonl").write_text(json.dumps(GOOD_ROW) + "\n")
    config = with_change("task", {"name": "gsm8k", "options": {"source": str(tmp_path / "all.jsonl")}})
    config["splits"]["eval_source_split"] = "test"
    with pytest.raises(ConfigError, match="holds one split, so split 'test' cannot be served; put '{split}'"):
        planned(config)


def test_code_file_accepts_any_mbpp_column_names(tmp_path):
    path = tmp_path / "mbpp.jsonl"
    path.write_text(json.dumps({"text": "t", "code": "c", "test_list": ["assert True"]}) + "\n")
    source = DataSource(
        str(path), True, (("question", "text", "prompt"), ("answer", "code"), ("tests", "test_list")), "code task"
    )
    source.check(["train"], offline=False)
    path.write_text(json.dumps({"text": "t", "code": "c"}) + "\n")
    with pytest.raises(ValueError, match="lacks column\\(s\\) tests or test_list"):
        source.check(["train"], offline=False)


def test_hub_dataset_offline_needs_the_cache(tmp_path, monkeypatch):
    from datasets import config as datasets_config
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(datasets_config, "HF_DATASETS_CACHE", tmp_path / "datasets")
    source = DataSource("openai/gsm8k", False, (), "GSM8K")
    source.check(["train"], offline=False)
    with pytest.raises(ValueError, match="hub id that is not in the local cache, and HF_HUB_OFFLINE is set"):
        source.check(["train"], offline=True)
    (tmp_path / "hub" / "datasets--openai--gsm8k").mkdir(parents=True)
    source.check(["train"], offline=True)


def test_task_options_the_factory_refuses():
    with pytest.raises(ConfigError, match="config key task.options of task 'arithmetic'"):
        planned(with_change("task.options.answer_fmt", "hash"))
    with pytest.raises(ConfigError, match=r"'num_exampels'; did you mean 'num_examples'\?$"):
        planned(with_change("task.options.num_exampels", 30))


def test_a_misspelt_rule_is_named_with_the_nearest_one():
    with pytest.raises(ConfigError, match=r"names 'unanimos', .*; did you mean 'unanimous', or list the module"):
        planned(with_change("cgrpo.ablations.rules", ["unanimos"]))


def test_more_worked_examples_than_the_generated_pool_has():
    config = with_change("task.options.num_examples", 3)
    config["task"]["options"]["worked_examples"] = 4
    with pytest.raises(ConfigError, match="task.options.worked_examples: .* fewer than worked_examples 4"):
        planned(config)


def test_model_path_that_does_not_exist(tmp_path):
    config = with_change("base_model", {"bootstrap": False, "path": str(tmp_path / "no-model")})
    with pytest.raises(
        ConfigError, match="base_model.path .* does not exist; fix the path or set base_model.bootstrap"
    ):
        planned(config)
    (tmp_path / "no-model").mkdir()
    with pytest.raises(ConfigError, match="has no config.json; point it at a folder saved with save_pretrained"):
        planned(config)


def test_bootstrap_on_another_tasks_data():
    config = with_change("base_model.options.task", "code")
    with pytest.raises(ConfigError, match="set base_model.options.task to 'arithmetic'"):
        planned(config)


def test_stopping_rules_of_the_ablations_and_the_replay_are_checked_against_the_registry():
    cases = [
        ("cgrpo.ablations.rules", ["majority"], "names 'majority', which is no registered stopping rule"),
        ("cgrpo.ablations.rules", ["conformal"], "lists conformal, which is C-GRPO itself"),
        ("cgrpo.ablations.settings", {"unanimous": [1]}, "the 'unanimous' rule has no parameter to set"),
        ("cgrpo.ablations.settings", {"esc": [1]}, "cgrpo.ablations.settings.esc: The esc rule's window must be"),
        ("replay.settings", {"signal": [1.5]}, "replay.settings.signal: The signal rule's delta must lie in"),
        ("replay.options", {"esc": {"tau": 0.5}}, "replay.options.esc: The 'esc' stopping rule has no option tau"),
        ("replay.models", ["grpo_s9_G32"], "replay.models lists grpo_s9_G32, which this config does not train"),
    ]
    for key, value, message in cases:
        with pytest.raises(ConfigError, match=re.escape(message)):
            planned(with_change(key, value))
    # A valid setting plans: ESC runs at two windows, one run per window and seed.
    config = with_change("cgrpo.ablations.settings", {"esc": [2, 4]})
    config["cgrpo"]["ablations"]["rules"] = ["esc"]
    planned(config)


def test_allocators_and_the_rules_trainer_options_are_checked():
    cases = [
        (
            "allocators.runs",
            ["gresso"],
            "names 'gresso', which is no registered prompt allocator (greso, knapsack); did",
        ),
        ("allocators.options", {"greso": {"size": 3}}, "allocators.options.greso: GRESO's size must be a budget"),
        ("allocators.rollouts_per_prompt", {"knapsack": 64}, "rollouts_per_prompt.knapsack is 64, outside the grid's"),
        ("cgrpo.ablations.options", {"balanced": {"group_size": 4}}, "options.balanced.group_size is not an option"),
    ]
    for key, value, message in cases:
        with pytest.raises(ConfigError, match=re.escape(message)):
            planned(with_change(key, value))
    config = with_change("allocators", {"runs": ["greso", "knapsack"], "rollouts_per_prompt": {"knapsack": 4}})
    config["cgrpo"]["ablations"].update(rules=["balanced"], options={"balanced": {"scale_rewards": "none"}})
    planned(config)
