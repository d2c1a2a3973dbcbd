from __future__ import annotations

import re

from transient_nb.eventlog.vocabulary import make_event
from transient_nb.notebook.views.report import report_html, save_report


def _events():
    t = 1_000.0
    out = []

    def add(kind, dt, **kw):
        e = make_event(kind, **kw)
        e["time"] = t + dt
        out.append(e)

    add("started", 0, time_scale=1.0)
    vm = dict(
        role="worker", gpu="t4", zone="us-central1-a", spot=True, price=0.22, price_on_demand=0.73
    )
    add("requested", 0, worker="w-0", **vm)
    add("running", 1, worker="w-0", **vm)
    add("train-started", 2, run="r", model="resnet8", data="digits", batch_size=32)
    add("joined", 3, worker="w-0", **vm)
    for i in range(5):
        add(
            "metrics",
            4 + i,
            run="r",
            step=10 * i,
            loss=2.0 - 0.3 * i,
            lr=0.1,
            active_workers=1,
            staleness=0.0,
            img_per_s=100.0,
        )
    add("eval", 9, run="r", step=40, accuracy=0.8, test_loss=0.5)
    add("notice", 10, worker="w-0", **vm)
    add("preempted", 12, worker="w-0", **vm)
    add("worker-metrics", 8, run="r", worker="w-0", step=40, img_per_s=90.0)
    return out


def test_report_is_standalone_and_shows_the_run(tmp_path):
    page = report_html(_events(), {"steps": 40, "accuracy": 0.8}, title="demo <run>")
    assert "demo &lt;run&gt;" in page  # the title is escaped
    assert "cdn.bokeh.org" not in page and "Bokeh" in page  # BokehJS inline: works offline
    for title in (
        "Test accuracy",
        "Training loss",
        "Cost (USD)",
        "Active workers",
        "Throughput per worker",
    ):
        assert title in page
    assert re.search(r"accuracy.{1,60}0\.8", page)  # the summary table (inside the document JSON)
    path = save_report(str(tmp_path / "r.html"), _events())
    assert open(path).read().startswith("<!DOCTYPE html>")


def test_report_summarizes_the_log_by_itself() -> None:
    from transient_nb.eventlog.folds import summarize

    events = _events()
    page = report_html(events)
    s = summarize(events)
    assert s["steps"] == 40
    # The table (inside the document JSON) is the state's summary of the same events.
    assert re.search(r"steps.{1,60}40", page)
    assert "saved_fraction" in page and "speedup_over_one_worker" in page


def test_the_reports_gone_vms_fold_into_one_line() -> None:
    """The report lists the VMs too: the preempted one in the folded line, with its money."""
    import html

    # Inside the document's JSON, where the HTML is escaped.
    page = html.unescape(report_html(_events()))
    folded = re.search(r"<summary>(1 preempted, \$[0-9.]+)</summary>(.*?)</details>", page)
    assert folded is not None, "no folded line of the gone VMs"
    assert "data-worker=" in folded.group(2) and "w-0" in folded.group(2)
