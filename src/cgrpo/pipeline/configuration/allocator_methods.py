"""The pipeline's methods of the prompt allocators (`cgrpo.allocation`): one per registered allocator, C-GRPO's trainer
with it, added to `cgrpo.pipeline.configuration.methods.METHODS` when this module is imported (the package does) and
again for a plugin's allocators (`add_allocator_methods`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...allocation import allocator_names, get_allocator
from .methods import _SEED, METHODS, Config, Method, RunName, add_methods
from .specs import evaluation_grid, format_grid, parse_grid

__all__ = ["add_allocator_methods", "allocator_method", "allocator_run_name"]


def allocator_run_name(allocator: str, seed: int, grid: Sequence[int]) -> str:
    """``<allocator>_s<seed>_g<grid>``: C-GRPO's trainer on the grid with a prompt allocator (`cgrpo.allocation`)."""
    return f"{allocator}_s{int(seed)}_g{format_grid(grid)}"


def _allocator_runs(allocator: str) -> Callable[[Config], list[str]]:
    def runs(config: Config) -> list[str]:
        if allocator not in (config.get("allocators") or {}).get("runs", []):
            return []
        grid = evaluation_grid(config)
        return [allocator_run_name(allocator, seed, grid) for seed in config["seeds"]]

    return runs


def _allocator_spec(allocator: str) -> Callable[[Config, RunName, str | None], dict[str, Any]]:
    def spec_fields(config: Config, name: RunName, calibration: str | None) -> dict[str, Any]:
        # C-GRPO's options, trainer and grid; the allocator alone decides how many rollouts a prompt draws (the fixed
        # rule at the grid's largest budget never stops it sooner), and nothing is calibrated.
        allocators = config.get("allocators") or {}
        options = {
            **config["cgrpo"]["options"],
            "stopping_rule": "fixed",
            "stopping_options": {"size": max(name.budget_grid)},
            "calibration_holdout": 0,
            "prompt_allocator": allocator,
            "allocator_options": dict(allocators.get("options", {}).get(allocator, {})),
            "allocation_rollouts_per_prompt": allocators.get("rollouts_per_prompt", {}).get(allocator),
        }
        return {"reference_budget": max(name.budget_grid), "budget_grid": list(name.budget_grid), "cgrpo": options}

    return spec_fields


def _allocator_setting(record: Mapping[str, Any]) -> str:
    options = record.get("allocator_options") or {}
    spelled = "".join(f", {key} {value}" for key, value in sorted(options.items()))
    total = record.get("allocation_rollouts_per_prompt")
    return f"grid {record['budget_grid']}, {total:g} rollouts per prompt" + spelled


def allocator_method(allocator: str) -> Method:
    """The pipeline method of a registered prompt allocator: C-GRPO's trainer with it, on the evaluation grid."""
    return Method(
        name=allocator,
        label=get_allocator(allocator).label,
        section="cgrpo",
        pattern=allocator + _SEED + r"_g(?P<grid>\d+(?:-\d+)*)",
        parse=lambda match: {"budget_grid": tuple(parse_grid(match["grid"]))},
        runs=_allocator_runs(allocator),
        spec_fields=_allocator_spec(allocator),
        trainer="ablation_trainer",
        setting=_allocator_setting,
    )


def add_allocator_methods() -> None:
    """Add a method for every registered prompt allocator that has none yet (call it after importing plugins)."""
    for allocator in allocator_names():
        if allocator in METHODS and METHODS[allocator].setting is not _allocator_setting:
            raise ValueError(f"The prompt allocator {allocator!r} has the name of a method; register it under another.")
    add_methods({name: allocator_method(name) for name in allocator_names() if name not in METHODS})


add_allocator_methods()
