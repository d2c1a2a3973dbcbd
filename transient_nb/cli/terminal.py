"""A run as the terminal shows it: its progress bar, the line that says why it failed, and its
summary."""

from __future__ import annotations

import time
from typing import Any

from transient_nb.eventlog.format import metrics_text, model_text


def _print_summary(s: dict[str, Any]) -> None:
    acc = f"{s['accuracy']:.2%}" if s.get("accuracy") is not None else "n/a"
    speedup = s.get("speedup_over_one_worker")
    lines = [
        ("model", model_text(s.get("model"), s.get("parameters"))),
        ("wall time", f"{s['wall_s']:.1f} s"),
        ("global steps", f"{s['steps']}"),
        ("final test accuracy", acc),
        ("preemptions survived", f"{s['preemptions']} (replacements: {s['replacements']})"),
        ("PS recoveries", f"{s['ps_recoveries']} ({s['steps_lost']} steps lost)"),
        ("cost", f"${s['cost']:.4f}"),
        ("on-demand cost", f"${s['cost_on_demand']:.4f}"),
        ("savings", f"${s['saved']:.4f} ({s['saved_fraction']:.0%})"),
        ("throughput", f"{s['img_per_s']:.0f} images/s"),
        (
            "speedup over one worker",
            f"{speedup:.2f}x" if speedup else f"n/a ({s.get('speedup_note') or 'not measured'})",
        ),
    ]
    metrics = s.get("metrics") or {}
    if set(metrics) - {"accuracy"}:  # a run's own metrics, each by name
        lines.insert(4, ("final test metrics", metrics_text(metrics)))
    by_gpu = s.get("by_gpu") or {}
    if len(by_gpu) > 1:  # a mixed cluster: each type's share of the workers' steps
        lines.append(
            (
                "steps per GPU type",
                ", ".join(
                    f"{g} {r['steps']} ({r['workers']} workers, {r['steps_per_s']:.2f}/s)"
                    for g, r in by_gpu.items()
                ),
            )
        )
    width = max(len(k) for k, _ in lines)
    print("\nSummary")
    for k, v in lines:
        print(f"  {k:<{width}}  {v}")


def _failure_line(job: Any) -> str:
    """One line saying which run failed, how (its reason) and its error."""
    error = " ".join(str(job.error).split())  # one line, whatever the error's own layout
    return f"transient-nb: run {job.id} failed ({job.reason}): {error}"


def _progress_text(job: Any, p: Any) -> str:
    """The bar's text: accuracy, active workers and the run's ETA, the one the panels show
    (:attr:`~transient_nb.eventlog.progress.RunProgress.eta_s`, from the run's recent pace)."""
    from transient_nb.eventlog.format import duration

    acc = f"{job.accuracy:.1%}" if job.accuracy is not None else "-"
    active = len(job.status.get("active", [])) if job.status else 0
    eta = duration(p.eta_s) if p is not None and p.state == "running" else "-"
    return f"acc {acc}, {active} active workers, ETA {eta}"


def _progress(job: Any, steps: int, quiet: bool) -> None:
    from tqdm import tqdm

    from transient_nb.eventlog.folds import RunTracker, event_log

    # No tqdm ETA of its own (it would differ from the panels'): the postfix carries the run's.
    bar = tqdm(
        total=steps,
        unit="step",
        disable=quiet,
        dynamic_ncols=True,
        bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]",
    )
    tracker, seen = RunTracker(job.id), 0
    try:
        while not job.done:
            log = event_log(job.cluster)
            end = len(log)
            tracker.feed(log[seen:end])
            seen = end
            bar.n = min(job.step, steps)
            bar.set_postfix_str(_progress_text(job, tracker.progress), refresh=False)
            bar.refresh()
            time.sleep(0.5)
        bar.n = min(job.step, steps)
        bar.refresh()
    finally:
        bar.close()
