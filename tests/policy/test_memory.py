"""The policy's memory: what earlier runs saw of each Spot kind, on disk, aged, per backend."""

from __future__ import annotations

import asyncio
import json
import re
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import dask
import pytest

from tests.policy.policy_helpers import (
    P100,
    P100_OD,
    RecordingCluster,
    _deadline_policy,
    _storm_stream,
    _vm,
)
from transient_nb.policy.adaptive import TransientPolicy
from transient_nb.policy.memory import KEEP_STARTUPS, Observations, PolicyMemory
from transient_nb.policy.planner import PRIOR_HOURS, Kind, Planner

STORM = Observations({("p100", "us-central1-a"): (24.0, 1.9, 2.6, 0.6)}, (300.0,) * 24, (210.0,))


def test_a_save_keeps_the_earlier_runs_and_replaces_this_runs_last_save(tmp_path: Path) -> None:
    """Each round saves the run's totals so far: saved twice, they count once, beside the
    earlier runs' (each aged), and the start-ups keep the newest."""
    path = tmp_path / "h.json"
    PolicyMemory(path, "local", half_life=100).save(STORM, now=0.0)
    memory = PolicyMemory(path, "local", half_life=100)
    assert memory.load(now=100.0).kinds == {("p100", "us-central1-a"): (12.0, 0.95, 1.3, 0.3)}
    run = Observations({("p100", "us-central1-a"): (1.0, 1.0, 1.0, 1.0)}, (100.0,) * 40)
    memory.save(run, now=100.0)
    memory.save(run, now=100.0)
    again = PolicyMemory(path, "local", half_life=100).load(now=100.0)
    assert again.kinds == {("p100", "us-central1-a"): (13.0, 1.95, 2.3, 1.3)}
    assert again.startups == (300.0,) * 10 + (100.0,) * 40
    assert len(again.startups) == KEEP_STARTUPS
    assert again.loads == (210.0,)
    # No temporary file left (the lock file stays, as filelock leaves it).
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h.json", "h.json.lock"]


def test_the_runs_of_two_clusters_share_a_file_and_old_runs_are_forgotten(tmp_path: Path) -> None:
    """Two policies saving by turns keep both records (neither overwrites the other's run);
    a record that weighs under 1% is dropped at the next save."""
    path = tmp_path / "h.json"
    one, two = PolicyMemory(path, "local", 100), PolicyMemory(path, "local", 100)
    a = Observations({("p100", "us-central1-a"): (2.0, 1.0, 1.0, 0.5)})
    b = Observations({("k80", "us-east1-c"): (1.0, 4.0, 4.0, 3.0)})
    for now in (0.0, 10.0):
        one.save(a, now=now)
        two.save(b, now=now)
    assert PolicyMemory(path, "local", 100).load(now=10.0).kinds == {**a.kinds, **b.kinds}
    assert len(json.loads(path.read_text())["scopes"]["local"]["runs"]) == 2
    # 700 s later (7 half-lives: under 1%) the first two runs go when a third one saves.
    PolicyMemory(path, "local", 100).save(a, now=710.0)
    assert len(json.loads(path.read_text())["scopes"]["local"]["runs"]) == 1
    assert PolicyMemory(path, "local", 100).load(now=710.0).kinds == a.kinds


def test_each_backend_keeps_its_own_observations(tmp_path: Path) -> None:
    """A simulated storm on the local backend says nothing of a cloud's zones."""
    path = tmp_path / "h.json"
    PolicyMemory(path, "local").save(STORM, now=0.0)
    assert not PolicyMemory(path, "gce").load(now=0.0)
    PolicyMemory(path, "gce").save(Observations({("t4", "us-east1-c"): (0, 5, 5, 5)}), now=0.0)
    assert PolicyMemory(path, "local").load(now=0.0).kinds == STORM.kinds
    assert set(json.loads(path.read_text())["scopes"]) == {"local", "gce"}


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("{oops", "is not a policy memory"),
        ('{"version": 7, "scopes": {}}', "version 7"),
        (
            '{"version": 1, "scopes": {"local": {"runs": {"r": {"saved": 0, "kinds": {"p100": {}}}}}}}',
            "bad record 'p100': its key is not GPU@ZONE",
        ),
        (
            '{"version": 1, "scopes": {"local": {"runs": {"r": {"saved": 0, "kinds": {"p100@z": '
            '{"revocations": -1, "exposure_h": 1, "held_h": 1, "trained_h": 1}}}}}}}',
            "bad record 'p100@z'",
        ),
        (
            '{"version": 1, "scopes": {"local": {"runs": {"r": {"saved": 0, "kinds": {"p100@z": '
            '{"revocations": "many", "exposure_h": 1, "held_h": 1, "trained_h": 1}}}}}}}',
            "bad record 'p100@z': {'revocations': 'many', 'exposure_h': 1, 'held_h': 1, "
            "'trained_h': 1} (give revocations, exposure_h, held_h, trained_h, each 0 or more)",
        ),
    ],
    ids=["not-json", "version", "no-zone", "negative", "text"],
)
def test_a_file_that_is_not_a_policy_memory_is_refused_and_left_alone(
    tmp_path: Path, text: str, words: str
) -> None:
    path = tmp_path / "h.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=r"delete (the file|it) or give another path") as e:
        PolicyMemory(path, "local").load()
    assert str(path) in str(e.value) and words in str(e.value)
    assert str(e.value).endswith(
        ("delete the file or give another path.", "delete it or give another path.")
    )
    cluster = RecordingCluster({"p100": 4})
    with pytest.raises(ValueError, match=re.escape(words)):
        TransientPolicy(cluster, "cost-per-step", planner=Planner([P100], 0.19), memory=path)
    assert path.read_text() == text


def test_a_memory_starts_its_folder_and_a_half_life_may_be_short(tmp_path: Path) -> None:
    path = tmp_path / "not" / "yet" / "h.json"
    PolicyMemory(path, "local", half_life=0.5).save(STORM, now=0.0)
    assert PolicyMemory(path, "local", half_life=0.5).load(now=0.5).kinds == {
        ("p100", "us-central1-a"): (12.0, 0.95, 1.3, 0.3)
    }


@pytest.mark.parametrize("half_life", [0, -1.0, float("nan"), "1h", True])
def test_a_half_life_that_is_not_a_positive_number_is_refused(half_life: object) -> None:
    with pytest.raises(ValueError, match=r"half_life=.* must be a number of seconds above 0"):
        PolicyMemory("h.json", "local", half_life=half_life)  # type: ignore[arg-type]


def test_the_planner_starts_from_what_earlier_runs_saw() -> None:
    """A remembered storm: a Spot P100's hazard and availability are the earlier runs' with
    the prior, its start-up theirs until one asked for in this run trains; what it exports is
    this run's only."""
    planner = Planner([P100, P100_OD], 0.19)
    calm_hazard, calm_up = planner.hazard_per_h(P100), planner.availability(P100)
    planner.remember(STORM)
    assert planner.hazard_per_h(P100) == pytest.approx(
        (calm_hazard * PRIOR_HOURS + 24) / (PRIOR_HOURS + 1.9)
    )
    model = planner.model_availability(P100)
    assert planner.availability(P100) == pytest.approx(
        (model * PRIOR_HOURS + 0.6) / (PRIOR_HOURS + 2.6)
    )
    assert planner.availability(P100) < calm_up / 2
    assert (planner.startup_s, planner.load_s) == (300.0, 210.0)
    planner.observe_startup(500.0, 400.0, first=True)  # a cold first start: the past stands
    assert planner.startup_s == 300.0
    planner.observe_startup(120.0, 30.0)
    assert (planner.startup_s, planner.load_s) == (120.0, 30.0)
    planner.observe_exposure("p100", "us-central1-a", 0.5, 2)
    planner.observe_availability("p100", "us-central1-a", 1.0, 0.8)
    assert planner.observations() == Observations(
        {("p100", "us-central1-a"): (2.0, 0.5, 1.0, 0.8)}, (120.0,), (30.0,)
    )
    # Another GPU type in the same zone is expected stormy too (the zone's storm).
    k80 = Kind("k80", "us-central1-a", True, 0.256)
    assert Planner([k80], 0.19).hazard_per_h(k80) * 5 < planner.hazard_per_h(k80)


def _fresh_run(cluster: RecordingCluster) -> None:
    """A run that just started on four Spot P100s: nothing seen of the zone yet."""
    now = time.time()
    cluster.add("train-started", now - 60, run="r", steps=64_000)
    for i in range(4):
        _vm(cluster, f"w-{i}", "p100", now - 60)


def test_a_run_after_a_storm_starts_on_demand_and_one_without_memory_on_spot(
    tmp_path: Path,
) -> None:
    """The first run learns the storm the hard way and keeps it in the memory file; the next
    one, in the same zone, meets its deadline on demand from its first decision, where a policy
    without the memory plans on the paper's calm Spot P100s (and gives one back)."""
    path = tmp_path / "memory.json"
    first = RecordingCluster({"p100": 4})
    policy = _deadline_policy(first, memory=path)
    _storm_stream(first, time.time() - 24 * 400 - 600)
    asyncio.run(policy.adapt())
    (saved,) = json.loads(path.read_text())["scopes"]["local"]["runs"].values()
    revocations, exposure_h, held_h, trained_h = saved["kinds"]["p100@us-central1-a"].values()
    assert revocations == 24 and exposure_h == pytest.approx(24 * 300 / 3600)
    assert trained_h / held_h == pytest.approx(0.23, abs=0.01)
    assert saved["startups"] == [300.0] * 24  # each asked for during the run

    calm = RecordingCluster({"p100": 4})
    _fresh_run(calm)
    plan = asyncio.run(_deadline_policy(calm, memory=False).adapt())
    assert plan is not None and plan.chosen.config.counts == {P100: 3}  # one to spare, even
    assert calm.on_demand_scaled in ([], [{"p100": 0}])

    wise = RecordingCluster({"p100": 4})
    _fresh_run(wise)
    plan = asyncio.run(_deadline_policy(wise, memory=path).adapt())
    assert plan is not None and plan.chosen.config.counts == {P100_OD: 4}
    assert wise.on_demand_scaled == [{"p100": 4}]


def test_the_configured_memory_is_used_unless_the_call_says_otherwise(tmp_path: Path) -> None:
    path = tmp_path / "configured.json"
    PolicyMemory(path, "local").save(STORM)
    cluster = RecordingCluster({"p100": 4})
    with dask.config.set({"transient.policy.memory": str(path)}):
        assert _deadline_policy(cluster).memory is not None
        assert _deadline_policy(cluster).planner.availability(P100) < 0.5
        assert _deadline_policy(cluster, memory=False).memory is None
        assert _deadline_policy(cluster, memory=True).memory.path == path  # type: ignore[union-attr]
    assert _deadline_policy(cluster).memory is None  # the default: none
    with pytest.raises(ValueError, match="memory=3: give the path of the policy's memory file"):
        _deadline_policy(cluster, memory=3)


def test_a_cluster_on_another_backend_reads_its_own(tmp_path: Path) -> None:
    path = tmp_path / "h.json"
    PolicyMemory(path, "local").save(STORM)
    cluster = RecordingCluster({"p100": 4})
    cluster.backend = SimpleNamespace(name="gce")  # type: ignore[attr-defined]
    policy = _deadline_policy(cluster, memory=path)
    assert policy.memory is not None and policy.memory.scope == "gce"
    assert policy.planner.availability(P100) == pytest.approx(
        policy.planner.model_availability(P100)
    )


def test_the_workers_still_running_count_their_hours_so_far(tmp_path: Path) -> None:
    """A run saved mid-way (or stopped) counts its live Spot workers' exposure to now, so that
    a run whose workers survived does not leave a storm's revocations without their hours."""
    path = tmp_path / "h.json"
    cluster = RecordingCluster({"p100": 2})
    policy = _deadline_policy(cluster, memory=path)
    t = time.time() - 3600
    _vm(cluster, "w-0", "p100", t)
    _vm(cluster, "w-1", "p100", t, spot=False)
    policy.observe(cluster.monitor.events)
    policy.save_memory(now=t + 1800)
    kinds = PolicyMemory(path, "local").load(now=t + 1800).kinds
    assert kinds == {("p100", "us-central1-a"): (0.0, 0.5, 0.0, 0.0)}


def test_the_policy_says_which_memory_it_starts_from(tmp_path: Path) -> None:
    """The panel and the log show the goal, and what the policy remembers beside the priors."""
    path = tmp_path / "h.json"
    PolicyMemory(path, "local").save(STORM)
    cluster = RecordingCluster({"p100": 4})
    policy = _deadline_policy(cluster, memory=path)
    assert policy.remembered_h == pytest.approx(2.6, abs=1e-3)
    asyncio.run(policy._announce("deadline"))
    asyncio.run(_deadline_policy(cluster, memory=False)._announce("deadline"))
    # The event's field is still "history": the event vocabulary does not change.
    announced = [(e["history"], e["remembered_h"]) for e in cluster.posted if e["kind"] == "policy"]
    assert announced == [(str(path), 2.6), (None, 0.0)]


def test_what_a_run_saves_is_the_same_read_round_by_round_or_at_once(tmp_path: Path) -> None:
    """The policy's figures are a function of the log: a policy that read the storm round by
    round (as it runs) and one that reads it whole (a replay, a restarted head) come to the
    same availability, hazard and observations to save."""
    live, replay = RecordingCluster({"p100": 4}), RecordingCluster({"p100": 4})
    t = time.time() - 24 * 400 - 600
    _storm_stream(live, t)
    by_round = _deadline_policy(live)
    for end in range(1, len(live.monitor.events) + 1, 7):
        by_round.observe(live.monitor.events[:end])
        by_round.observe_places(live.monitor.events[end - 1]["time"])
    by_round.observe(live.monitor.events)
    replay.monitor.events = list(live.monitor.events)
    at_once = _deadline_policy(replay)
    at_once.observe(replay.monitor.events)
    now = t + 24 * 400
    assert by_round.observations(now) == at_once.observations(now)
    seen = by_round.observations(now).kinds[("p100", "us-central1-a")]
    assert seen[0] == 24 and seen[3] / seen[2] == pytest.approx(0.23, abs=0.01)
    assert by_round.planner.availability(P100) == at_once.planner.availability(P100)
    assert by_round.planner.hazard_per_h(P100) == at_once.planner.hazard_per_h(P100)


# -- the names before 0.2, for one release -----------------------------------------------------------
def test_the_old_names_of_the_memory_still_work_and_warn_naming_the_new(tmp_path: Path) -> None:
    """``transient_nb.policy.history.PolicyHistory``, a policy's ``history=``, ``.history`` and
    ``save_history()``: each still works, with a DeprecationWarning naming its new name."""
    import importlib

    from transient_nb.policy import memory

    with pytest.warns(DeprecationWarning, match=r"transient_nb\.policy\.memory"):
        old = importlib.import_module("transient_nb.policy.history")
    assert old is memory
    with pytest.warns(DeprecationWarning, match="PolicyHistory is now .*PolicyMemory"):
        assert old.PolicyHistory is PolicyMemory
    path = tmp_path / "h.json"
    PolicyMemory(path, "local").save(STORM)
    cluster = RecordingCluster({"p100": 4})
    with pytest.warns(DeprecationWarning, match="history= is now memory="):
        policy = _deadline_policy(cluster, history=path)
    assert policy.memory is not None and policy.memory.path == path
    with pytest.warns(DeprecationWarning, match="history is now its memory"):
        assert policy.history is policy.memory
    with pytest.warns(DeprecationWarning, match=r"save_history\(\) is now its save_memory\(\)"):
        policy.save_history()
    with pytest.raises(ValueError, match="Give memory= alone"), pytest.warns(DeprecationWarning):
        _deadline_policy(cluster, memory=path, history=path)


def test_the_old_configuration_keys_are_read_with_a_warning(tmp_path: Path) -> None:
    """``transient.policy.history`` (and its half-life) were ``policy.memory``'s names: set, they
    are read with a warning naming the new key; a copy of their shipped defaults in a user's
    dask config (``ensure_file`` copied them) is no choice of theirs and says nothing."""
    path = tmp_path / "configured.json"
    PolicyMemory(path, "local").save(STORM)
    cluster = RecordingCluster({"p100": 4})
    old = {"transient.policy.history": str(path), "transient.policy.history-half-life": "2h"}
    with dask.config.set(old), pytest.warns(DeprecationWarning) as caught:
        policy = _deadline_policy(cluster)
    assert policy.memory is not None and policy.memory.path == path
    assert policy.memory.half_life == 7200
    said = " ".join(str(w.message) for w in caught)
    assert "transient.policy.memory;" in said and "transient.policy.memory-half-life;" in said
    # The new key wins where both are set.
    other = tmp_path / "new.json"
    with (
        dask.config.set({**old, "transient.policy.memory": str(other)}),
        pytest.warns(DeprecationWarning),
    ):
        assert _deadline_policy(cluster).memory.path == other  # type: ignore[union-attr]
    shipped = {"transient.policy.history": None, "transient.policy.history-half-life": "1 day"}
    with dask.config.set(shipped), warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _deadline_policy(cluster).memory is None
