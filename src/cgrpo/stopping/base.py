"""The stopping-rule interface, its registry, and the replay of a rule on prefixes of logged outcomes.

A stopping rule looks at one prompt's outcomes drawn so far (extracted answers for the ``"aps"`` score, verifier passes
for the execution scores) and their rewards (1 for a correct completion, 0 otherwise), at one budget of the grid, and
says whether the prompt stops there. A calibrated rule is first fitted on calibration pools (``max(grid)`` outcomes per
held-out prompt, drawn with the current policy); its fit is a plain value passed back to every decision, so one rule
object serves any number of fits (the trainer's recalibrations, the replay's folds).

Adding a rule is one subclass decorated with :func:`register`: the trainer (``CGRPOConfig.stopping_rule``), the
pipeline's ablations and replay, and the docs' table list rules from the registry.

Outcomes are nested prefixes, so a rule often knows in advance that it cannot stop at the next budget or two whatever
is drawn (after two different answers, unanimity never holds again). A rule that says so (:meth:`StoppingRule.could_stop`)
lets the trainer draw straight up to the next budget where it could stop, in one generation round: the same decisions
on the same outcomes, fewer rounds (:func:`sampling_path`).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ..calibration import SCORES, sorted_grid

__all__ = [
    "RULES",
    "Pools",
    "StoppingRule",
    "correct_flags",
    "get_rule",
    "register",
    "next_budget",
    "repeat_leader",
    "rule_names",
    "sampling_path",
    "stopping_budget",
]


@dataclass(frozen=True)
class Pools:
    """What a calibrated rule is fitted on: ``max(grid)`` outcomes per calibration prompt, in draw order.

    Attributes:
        score: the nonconformity score the outcomes belong to (a key of :data:`cgrpo.calibration.SCORES`).
        grid: the budget grid, ascending.
        outcomes: per prompt, extracted answers (``"aps"``, None for a failed extraction) or verifier passes.
        rewards: per prompt, 1.0 for each correct outcome and 0.0 otherwise (:func:`correct_flags`).
        golds: per prompt, the normalised gold answer (``"aps"``); None for the execution scores.
        rng: the generator of the fit's random draws (the APS score's tie-breaks).
    """

    score: str
    grid: list[int]
    outcomes: list[list]
    rewards: list[list[float]]
    golds: list[str] | None
    rng: random.Random

    def subset(self, indices: Sequence[int], rng: random.Random) -> Pools:
        """The pools of the prompts at ``indices``, in that order, with generator ``rng``."""
        return Pools(
            self.score,
            self.grid,
            [self.outcomes[i] for i in indices],
            [self.rewards[i] for i in indices],
            None if self.golds is None else [self.golds[i] for i in indices],
            rng,
        )


def correct_flags(score: str, outcomes: Sequence, gold: str | None = None) -> list[float]:
    """Rewards of a prompt's outcomes: an extracted answer equal to ``gold`` (``"aps"``) or a pass is 1.0, else 0.0."""
    if score == "aps":
        return [float(answer is not None and gold is not None and answer == gold) for answer in outcomes]
    return [float(bool(passed)) for passed in outcomes]


class StoppingRule:
    """One stopping rule: subclass it, set the class attributes, implement :meth:`stops` (and :meth:`fit`).

    Class attributes:
        name: the registry key (lowercase letters and digits), `CGRPOConfig.stopping_rule`'s value.
        label: its name in tables and plots.
        calibrated: whether it is fitted on calibration pools (:meth:`fit`) before it decides.
        needs_rewards: whether it reads rewards, so that the trainer must know each training prompt's gold answer.
        parameter: the option the replay sweeps and a pipeline run name carries (None for a rule without one).
        sweep: the values of ``parameter`` the replay tries by default.
        defaults: every option and its default; the constructor accepts these and no others.
    """

    name: ClassVar[str]
    label: ClassVar[str]
    calibrated: ClassVar[bool] = False
    needs_rewards: ClassVar[bool] = False
    parameter: ClassVar[str | None] = None
    sweep: ClassVar[tuple] = ()
    defaults: ClassVar[dict[str, Any]] = {}

    def __init__(self, score: str = "aps", **options: Any):
        if score not in SCORES:
            raise ValueError(f"Unknown score {score!r}; use one of {', '.join(SCORES)}.")
        unknown = sorted(set(options) - set(self.defaults))
        if unknown:
            known = ", ".join(self.defaults) or "none"
            raise ValueError(
                f"The {self.name!r} stopping rule has no option {', '.join(unknown)}; its options are: {known}."
            )
        self.score = score
        self.options = {**self.defaults, **options}
        self.check_options()

    def check_options(self) -> None:
        """Raise ValueError on an option out of range; the base class accepts any."""

    @classmethod
    def from_config(cls, args) -> StoppingRule:
        """The rule a `CGRPOConfig` asks for: its score and `stopping_options`."""
        return cls(args.score, **(args.stopping_options or {}))

    @classmethod
    def sweep_for(cls, grid: Sequence[int]) -> list:
        """The values of ``parameter`` the replay tries on ``grid`` (``sweep`` unless a rule depends on the grid)."""
        return list(cls.sweep)

    def setting(self) -> Any:
        """The value of ``parameter`` (None for a rule without one)."""
        return None if self.parameter is None else self.options[self.parameter]

    def fit(self, pools: Pools) -> Any:
        """Fit the rule on calibration pools; returns a JSON-serialisable fit (calibrated rules override this)."""
        raise ValueError(f"The {self.name!r} stopping rule is not calibrated; it has nothing to fit.")

    def fit_from_dict(self, data: Any) -> Any:
        """The fit :meth:`fit` returned, from its JSON round trip (a checkpoint); plain data by default."""
        return data

    def fit_to_dict(self, fit: Any) -> Any:
        """The JSON-serialisable form of a fit (inverse of :meth:`fit_from_dict`); plain data by default."""
        return fit

    def stops(self, k: int, outcomes: Sequence, rewards: Sequence[float] | None, fit: Any, rng: random.Random) -> bool:
        """Whether the prompt stops at budget ``k`` given its first ``k`` outcomes and rewards."""
        raise NotImplementedError

    def could_stop(self, j: int, outcomes: Sequence, rewards: Sequence[float] | None, fit: Any) -> bool:
        """Whether some continuation of the outcomes drawn so far to ``j`` draws would make :meth:`stops` hold at ``j``.

        False lets the trainer skip budget ``j`` unsampled, so it must be False only where no continuation stops there
        (a rule that stops on a random draw must say True). The base class says True everywhere: no budget is skipped,
        which is exact for any rule; a tighter answer only saves generation rounds.
        """
        return True


RULES: dict[str, type[StoppingRule]] = {}


def register(cls: type[StoppingRule]) -> type[StoppingRule]:
    """Class decorator adding a rule to :data:`RULES` under ``cls.name``; raises ValueError on a taken name."""
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name.isalnum() or not name.islower() or not name[0].isalpha():
        raise ValueError(
            f"{cls.__name__}.name must be lowercase letters and digits starting with a letter, got {name!r}."
        )
    if name in RULES and RULES[name] is not cls:
        raise ValueError(f"A stopping rule named {name!r} is registered already; give {cls.__name__} another name.")
    if cls.parameter is not None and cls.parameter not in cls.defaults:
        raise ValueError(f"{cls.__name__}.parameter {cls.parameter!r} must be one of its defaults' keys.")
    RULES[name] = cls
    return cls


def rule_names() -> list[str]:
    """The registered rules' names, in registration order."""
    return list(RULES)


def get_rule(name: str) -> type[StoppingRule]:
    """The rule class registered as ``name``; raises ValueError naming the registered ones otherwise."""
    if name not in RULES:
        raise ValueError(f"Unknown stopping rule {name!r}; use one of {', '.join(RULES)} or register a new one.")
    return RULES[name]


def repeat_leader(score: str, outcomes: Sequence, total: int) -> list:
    """``outcomes`` continued to ``total`` draws by repeats of the leading outcome: the most frequent extracted answer
    (``"aps"``; a new answer when none was extracted), or a pass (execution scores).

    For a rule that stops on the leader's share or count, no continuation stops where this one does not, so it decides
    :meth:`StoppingRule.could_stop` exactly.
    """
    if score != "aps":
        leader: Any = True
    else:
        counts = Counter(answer for answer in outcomes if answer is not None)
        leader = counts.most_common(1)[0][0] if counts else _NEW_ANSWER
    return [*outcomes, *[leader] * (total - len(outcomes))]


class _NewAnswer:
    """An answer distinct from every extracted one (which are strings)."""

    def __repr__(self) -> str:
        return "<a new answer>"


_NEW_ANSWER = _NewAnswer()


def next_budget(
    rule: StoppingRule, fit: Any, grid: Sequence[int], outcomes: Sequence, rewards: Sequence[float] | None
) -> int:
    """The budget to draw a prompt up to next: the smallest budget of ``grid`` above the draws so far at which ``rule``
    could stop (:meth:`StoppingRule.could_stop`), ``max(grid)`` when there is none."""
    later = [j for j in sorted_grid(grid) if j > len(outcomes)]
    return next((j for j in later[:-1] if rule.could_stop(j, outcomes, rewards, fit)), later[-1])


def sampling_path(
    rule: StoppingRule,
    fit: Any,
    grid: Sequence[int],
    outcomes: Sequence,
    rewards: Sequence[float] | None,
    rng: random.Random,
    skip: bool = True,
) -> list[int]:
    """The budgets the trainer draws a prompt up to, one generation round each, replayed on its logged outcomes.

    The last is where the prompt stops. With ``skip`` each round draws up to :func:`next_budget`; without, up to the
    next budget of the grid. ``outcomes`` (and ``rewards``) must hold at least ``max(grid)`` draws.
    """
    budgets = sorted_grid(grid)
    if len(outcomes) < budgets[-1]:
        raise ValueError(
            f"Got {len(outcomes)} outcomes for a prompt but the largest budget is {budgets[-1]}; pass at least that "
            "many per prompt."
        )
    path: list[int] = []
    while not path or path[-1] < budgets[-1]:
        drawn = path[-1] if path else 0
        prefix = None if rewards is None else rewards[:drawn]
        k = next_budget(rule, fit, budgets, outcomes[:drawn], prefix) if skip else budgets[len(path)]
        path.append(k)
        if k < budgets[-1] and rule.stops(k, outcomes[:k], None if rewards is None else rewards[:k], fit, rng):
            break
    return path


def stopping_budget(
    rule: StoppingRule,
    fit: Any,
    grid: Sequence[int],
    outcomes: Sequence,
    rewards: Sequence[float] | None,
    rng: random.Random,
) -> int:
    """The budget the trainer's incremental sampling would stop a prompt at, replayed on its logged outcomes.

    The first budget of ``grid`` where ``rule`` stops on the prefix, ``max(grid)`` when none does. ``outcomes`` (and
    ``rewards``) must hold at least ``max(grid)`` draws.
    """
    return sampling_path(rule, fit, grid, outcomes, rewards, rng, skip=False)[-1]
