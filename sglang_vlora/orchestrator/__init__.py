"""The orchestrator's decisions as pure logic (paper §4.4.3): no torch, no SGLang.

In the server, :class:`sglang_vlora.orchestrator.runtime.Orchestrator` (one per scheduler
process, driven by the hooks of :mod:`sglang_vlora.orchestrator.scheduler_hooks`; the two
modules here that touch SGLang, neither imported by this package) builds a
:class:`SchedulerState` every iteration, calls ``policy.decide(state)`` and applies the
:class:`Decision`.
"""

from sglang_vlora.orchestrator import baselines as baselines  # registers the comparison policies
from sglang_vlora.orchestrator.cost_model import (
    CostModel,
    CostModelError,
    MeasuredCosts,
    OutputLengths,
    load_cost_model,
)
from sglang_vlora.orchestrator.iteration_fit import IterationFit
from sglang_vlora.orchestrator.limits import DerivedLimits
from sglang_vlora.orchestrator.policy import (
    DECISION_REASONS,
    Plan,
    PolicyConfig,
    SchedulingPolicy,
    make_policy,
    policy_names,
    register_policy,
)
from sglang_vlora.orchestrator.state import Decision, Mode, Request, SchedulerState

__all__ = [
    "DECISION_REASONS",
    "CostModel",
    "CostModelError",
    "Decision",
    "DerivedLimits",
    "IterationFit",
    "MeasuredCosts",
    "OutputLengths",
    "Mode",
    "Plan",
    "PolicyConfig",
    "Request",
    "SchedulerState",
    "SchedulingPolicy",
    "load_cost_model",
    "make_policy",
    "policy_names",
    "register_policy",
]
