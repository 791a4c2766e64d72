"""Stopping rules as plug-ins: when a prompt sampled along the budget grid has drawn enough.

`CGRPOConfig.stopping_rule` names one registered rule (:data:`RULES`) and `CGRPOConfig.stopping_options` sets its
options. Registered here:

* ``conformal``: C-GRPO's rule, calibrated thresholds ``qhat_k`` (the default);
* ``unanimous``, ``share``, ``esc``, ``adaptive``: calibration-free agreement rules;
* ``signal``: a calibrated rule that bounds the share of informative GRPO groups it loses;
* ``fixed``: every prompt stops at one group size, fixed-group GRPO on the grid (the replay's reference line);
* ``balanced``: Reinforce-Ada's exit, once a prompt holds enough right and wrong answers.

A new rule is one :class:`StoppingRule` subclass decorated with :func:`register`, in any module imported before the
trainer or the pipeline builds it (the pipeline imports the modules listed in its config's ``plugins``).
"""

# The import order is the registry's order: C-GRPO's rule first, then the reference line, then later additions.
from . import conformal_rule, agreement, signal, reference, balanced  # noqa: I001
from .agreement import top_share
from .base import (
    RULES,
    Pools,
    StoppingRule,
    correct_flags,
    get_rule,
    next_budget,
    register,
    repeat_leader,
    rule_names,
    sampling_path,
    stopping_budget,
)

__all__ = [
    "RULES",
    "Pools",
    "StoppingRule",
    "agreement",
    "balanced",
    "conformal_rule",
    "correct_flags",
    "get_rule",
    "next_budget",
    "reference",
    "register",
    "repeat_leader",
    "rule_names",
    "sampling_path",
    "signal",
    "stopping_budget",
    "top_share",
]
