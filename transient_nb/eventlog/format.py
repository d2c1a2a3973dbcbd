"""How every surface writes money, durations and a policy's decision (one place: the notebook
views, the JupyterLab panel through its server, the CLI and the report write them alike)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def money(x: float | None, digits: int = 4) -> str:
    """Dollars with ``digits`` decimals; a dash when unknown.

    Examples
    --------
    >>> money(0.12345), money(None)
    ('$0.1235', '–')
    """
    return "–" if x is None or not math.isfinite(x) else f"${x:,.{digits}f}"


def duration(seconds: float | None) -> str:
    """A duration as people read it: ``42 s``, ``3 min 05 s``, ``2 h 07 min``.

    Examples
    --------
    >>> duration(42), duration(185), duration(7620)
    ('42 s', '3 min 05 s', '2 h 07 min')
    """
    if seconds is None or not math.isfinite(seconds):
        return "–"
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min {seconds % 60:02.0f} s"
    return f"{seconds // 3600:.0f} h {seconds % 3600 // 60:02.0f} min"


def policy_text(policy: Mapping[str, Any] | None) -> str:
    """One line on the transient-aware policy that is on (empty when none is).

    Its goal, its latest decision's reason (the configuration, the expected time and money to
    the end), the cluster's probability of losing at least 1, 2 and 3 workers within the hour, and
    the PS's capacity the plan assumes (measured, once the PS was seen to be the bottleneck).

    Examples
    --------
    >>> policy_text(None)
    ''
    >>> policy_text({"goal": "deadline", "deadline_s": 7200, "budget": None, "decision": None})
    'Policy: deadline in 2 h 00 min (waiting for a training run to plan for)'
    >>> policy_text({"goal": "budget", "budget": 20, "decision": {
    ...     "reason": "4 p100 in us-central1-a, 1 PS shard: ETA 0.40 h", "p_lose_1h": [0.2, 0.02]}})
    'Policy: budget $20.00 · 4 p100 in us-central1-a, 1 PS shard: ETA 0.40 h · P(losing ≥1, ≥2 workers within 1 h): 20%, 2%'
    >>> policy_text({"goal": "cost-per-step", "remembered_h": 2.64, "decision": None})
    'Policy: cost-per-step, from 2.6 h of earlier runs (waiting for a training run to plan for)'
    >>> policy_text({"goal": "cost-per-step", "decision": {"reason": "8 v100 ...",
    ...     "ps_capacity": 44.6, "ps_bottleneck": True}})
    'Policy: cost-per-step · 8 v100 ... · PS serves ≤45 steps/s (the bottleneck now)'
    """
    if not policy:
        return ""
    goal = str(policy.get("goal"))
    if goal == "deadline":
        what = f"deadline in {duration(policy.get('deadline_s'))}"
    elif goal == "budget":
        what = f"budget {money(policy.get('budget'), 2)}"
    else:
        what = goal
    remembered = policy.get("remembered_h")
    if remembered:
        # What it starts from beside the paper's priors (the policy's history file).
        what += f", from {remembered:.1f} h of earlier runs"
    decision = policy.get("decision")
    if not decision:
        return f"Policy: {what} (waiting for a training run to plan for)"
    text = f"Policy: {what} · {decision.get('reason')}"
    odds = [p for p in (decision.get("p_lose_1h") or []) if p is not None]
    if odds:
        ks = ", ".join(f"≥{k}" for k in range(1, len(odds) + 1))
        text += f" · P(losing {ks} workers within 1 h): " + ", ".join(
            f"{100 * p:.0f}%" for p in odds
        )
    capacity = decision.get("ps_capacity")
    if capacity is not None:
        text += f" · PS serves ≤{capacity:.0f} steps/s"
        if decision.get("ps_bottleneck"):
            text += " (the bottleneck now)"
    return text


def metric_value(name: str, value: Any) -> str:
    """A metric as people read it: accuracy as a percentage, others with 4 significant digits.

    Examples
    --------
    >>> metric_value("accuracy", 0.9312), metric_value("mae", 0.123456), metric_value("mae", None)
    ('93.1%', '0.1235', '–')
    """
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        return "–"
    return f"{value:.1%}" if name == "accuracy" else f"{value:.4g}"


def metrics_text(metrics: Mapping[str, Any] | None, accuracy: Any = None) -> str:
    """Every metric of an evaluation, ``name value`` joined with `` · `` (accuracy alone when
    that is all a run has).

    Examples
    --------
    >>> metrics_text({"mae": 0.31, "mse": 0.2}), metrics_text(None, accuracy=0.5)
    ('mae 0.31 · mse 0.2', 'accuracy 50.0%')
    """
    shown = dict(metrics or {})
    if not shown and accuracy is not None:
        shown = {"accuracy": accuracy}
    return " · ".join(f"{k} {metric_value(k, v)}" for k, v in shown.items())


def model_text(model: Any, parameters: Any = None) -> str:
    """A model's name and parameter count: ``Net (1,234 parameters)``.

    Examples
    --------
    >>> model_text("resnet8", 78042), model_text("Net")
    ('resnet8 (78,042 parameters)', 'Net')
    """
    name = str(model or "?")
    return f"{name} ({parameters:,} parameters)" if isinstance(parameters, int) else name


def gone_text(gone: Mapping[str, Any] | None) -> str:
    """The one line that stands for the VMs gone (revoked or given back) in a long run's tables:
    how many of each, and what they cost (:meth:`ClusterState.gone
    <transient_nb.eventlog.folds.ClusterState.gone>`). Empty when none is gone.

    Examples
    --------
    >>> gone_text({"preempted": 17, "given_back": 2, "cost": 0.0634})
    '17 preempted, 2 given back, $0.063'
    >>> gone_text({"preempted": 0, "given_back": 0, "cost": 0.0}), gone_text(None)
    ('', '')
    """
    if not gone:
        return ""
    preempted, given_back = int(gone.get("preempted") or 0), int(gone.get("given_back") or 0)
    parts = [f"{preempted} preempted"] if preempted else []
    if given_back:
        parts.append(f"{given_back} given back")
    return f"{', '.join(parts)}, {money(float(gone.get('cost') or 0.0), 3)}" if parts else ""
