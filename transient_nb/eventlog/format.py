"""How every surface writes money, durations and a policy's decision (one place: the notebook
views, the JupyterLab panel through its server, the CLI and the report write them alike).

The JupyterLab panel has no copy of these rules: its server sends each figure already written
(:mod:`transient_nb.server.model`), and the panel shows the strings.
"""

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


def rate(per_hour: float | None, digits: int = 3) -> str:
    """Dollars per hour: ``$0.123/h``; a dash when unknown.

    Examples
    --------
    >>> rate(0.1234), rate(None)
    ('$0.123/h', '–')
    """
    text = money(per_hour, digits)
    return text if text == "–" else f"{text}/h"


def percent(fraction: float | None, digits: int = 0) -> str:
    """A fraction as a percentage: ``42%``; a dash when unknown.

    Examples
    --------
    >>> percent(0.4213), percent(0.4213, 1), percent(None)
    ('42%', '42.1%', '–')
    """
    if fraction is None or not math.isfinite(fraction):
        return "–"
    return f"{fraction:.{digits}%}"


def cost_text(cost: Mapping[str, Any]) -> dict[str, str]:
    """Each figure of a bill's totals (:meth:`ClusterState.cost_totals
    <transient_nb.eventlog.folds.ClusterState.cost_totals>`) as people read it, under the same
    keys: dollars, dollars per hour, the share saved.

    Examples
    --------
    >>> cost_text({"cost": 0.5, "saved": 1.25, "saved_fraction": 0.714, "rate_per_hour": 0.66})
    {'cost': '$0.5000', 'saved': '$1.2500', 'saved_fraction': '71%', 'rate_per_hour': '$0.660/h'}
    """
    writers = {"saved_fraction": percent, "rate_per_hour": rate, "rate_on_demand_per_hour": rate}
    return {k: writers.get(k, money)(_number(v)) for k, v in cost.items()}


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


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
        # What it starts from beside the paper's priors (the policy's memory file).
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


def training_text(training: Mapping[str, Any] | None) -> str:
    """A training run's line: its model and size, step of the target, every metric of the last
    evaluation (:func:`metrics_text`), and its ETA or how it finished. Empty without a run.

    ``training`` has the keys of the JupyterLab panel's training model
    (:func:`transient_nb.server.model.training_model`).

    Examples
    --------
    >>> training_text({"model": "resnet8", "parameters": 78042, "step": 1200, "steps": 5000,
    ...     "metrics": {"accuracy": 0.4213}, "finished": False, "eta_s": 185})
    'Training: resnet8 (78,042 parameters) · step 1,200/5,000 · accuracy 42.1% · ETA 3 min 05 s'
    >>> training_text({"step": 10, "accuracy": None, "finished": True, "reason": "stopped"})
    'Training: step 10 · finished (stopped)'
    """
    if not training:
        return ""
    model = training.get("model")
    step, steps = int(training.get("step") or 0), training.get("steps")
    if training.get("finished"):
        end = f"finished ({training.get('reason') or 'done'})"
    else:
        eta = training.get("eta_s")
        end = f"ETA {duration(eta)}" if eta is not None else ""
    parts = [
        model_text(model, training.get("parameters")) if model else "",
        f"step {step:,}" + (f"/{int(steps):,}" if steps else ""),
        metrics_text(training.get("metrics"), training.get("accuracy")),
        end,
    ]
    return "Training: " + " · ".join(p for p in parts if p)


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
