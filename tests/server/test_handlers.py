"""REST routes of the JupyterLab panel, against a real Jupyter server and real small clusters."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import psutil
import pytest
from jupyter_server.auth.authorizer import Authorizer
from tornado.httpclient import HTTPClientError, HTTPResponse

from tests.conftest import wait_for  # tests/conftest.py: the suite's wait helper
from transient_nb import TransientCluster
from transient_nb.deploy import registry

Fetch = Callable[..., Awaitable[HTTPResponse]]


# -- helpers ----------------------------------------------------------------------------------------
async def call(
    jp_fetch: Fetch, *parts: str, method: str = "GET", body: Any = None, **kw: Any
) -> tuple[int, Any]:
    """Status and decoded JSON of one request; 4xx/5xx answers are returned, not raised."""
    if body is not None and not isinstance(body, (str, bytes)):
        body = json.dumps(body)
    if body is None and method == "POST":
        body = "{}"
    response = await jp_fetch(
        "transient-nb", *parts, method=method, body=body, raise_error=False, **kw
    )
    payload = json.loads(response.body) if response.body else None
    return response.code, payload


async def listing(jp_fetch: Fetch) -> dict[str, dict[str, Any]]:
    code, data = await call(jp_fetch, "clusters")
    assert code == 200, data
    return {m["name"]: m for m in data["clusters"]}


async def wait_model(
    jp_fetch: Fetch,
    predicate: Callable[[dict[str, dict[str, Any]]], Any],
    timeout: float = 60,
) -> dict[str, dict[str, Any]]:
    """Poll the list route until ``predicate(models by name)`` holds; return the models."""
    models: dict[str, dict[str, Any]] = {}

    async def check() -> bool:
        nonlocal models
        models = await listing(jp_fetch)
        return bool(predicate(models))

    try:
        await wait_for(check, timeout=timeout)
    except TimeoutError:
        raise AssertionError(f"condition not met; models: {json.dumps(models)[:2000]}") from None
    return models


def states(model: dict[str, Any]) -> dict[str, str]:
    return {w["name"]: w["state"] for w in model["workers"]}


@asynccontextmanager
async def kernel_cluster(
    name: str, workers: Any = 2, **kwargs: Any
) -> AsyncIterator[TransientCluster]:
    """A cluster as a kernel would create it (it registers itself), closed at the end."""
    cluster = await TransientCluster(
        workers=workers,
        name=name,
        provisioning_delay=0,
        notice="1s",
        asynchronous=True,
        **kwargs,
    )
    try:
        await cluster._wait_for_workers(timeout=60)
        yield cluster
    finally:
        await cluster.close()


def register_stale(name: str) -> None:
    """A registry entry whose owning process is gone, as a crashed kernel leaves it."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    path = registry.register(name, {"backend": "local", "scheduler_address": "tcp://127.0.0.1:9"})
    with open(path) as f:
        entry = json.load(f)
    entry["pid"] = proc.pid
    with open(path, "w") as f:
        json.dump(entry, f)


# -- listing ----------------------------------------------------------------------------------------
async def test_empty_list(jp_fetch: Fetch) -> None:
    code, data = await call(jp_fetch, "clusters")
    assert code == 200
    assert data["clusters"] == []
    assert isinstance(data["version"], str)


async def test_options_offer_catalog_choices(jp_fetch: Fetch) -> None:
    code, data = await call(jp_fetch, "options")
    assert code == 200
    assert "t4" in data["gpus"]
    assert data["defaults"]["zone"] in data["zones"]


async def test_long_poll_answers_on_change_and_holds_when_idle(
    jp_fetch: Fetch, jp_serverapp: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, data = await call(jp_fetch, "clusters")
    version = data["version"]
    start = time.monotonic()
    code, same = await call(jp_fetch, "clusters", params={"version": version, "wait": "1"})
    assert code == 200 and same["version"] == version
    assert time.monotonic() - start >= 0.9  # held while nothing changed (a lower bound only)

    # Know when the next request is really waiting on the server: the manager asks whether the
    # client is gone only once it has found nothing new and is about to wait.
    manager = jp_serverapp.web_app.settings["transient_nb_manager"]
    waiting = asyncio.Event()
    answered_at_deadline: list[bool] = []
    wait_for_change = manager.wait_for_change

    async def spy(
        version: str | None, timeout: float, interval: float = 0.5, gone: Any = None
    ) -> Any:
        def gone_or_mark() -> bool:
            waiting.set()
            return bool(gone()) if gone is not None else False

        deadline = time.monotonic() + timeout
        result = await wait_for_change(version, timeout, interval=interval, gone=gone_or_mark)
        answered_at_deadline.append(time.monotonic() >= deadline)
        return result

    monkeypatch.setattr(manager, "wait_for_change", spy)
    pending = asyncio.ensure_future(
        # Under the 20 s request timeout of jp_fetch, so that a poll that is not woken answers at
        # its deadline and fails the assertion below, rather than timing out in the client.
        call(jp_fetch, "clusters", params={"version": version, "wait": "15"})
    )
    await asyncio.wait_for(waiting.wait(), timeout=30)
    assert not pending.done()
    register_stale("ghost-poll")
    code, changed = await asyncio.wait_for(pending, timeout=60)
    assert code == 200
    assert [m["name"] for m in changed["clusters"]] == ["ghost-poll"]
    assert changed["version"] != version
    # Woken by the change, not answered at its 15 s deadline with whatever was there by then.
    assert answered_at_deadline == [False]


# -- control ----------------------------------------------------------------------------------------
@pytest.mark.slow
async def test_kernel_cluster_is_listed_and_controlled(jp_fetch: Fetch) -> None:
    """A cluster created in a kernel shows up; preempt, scale and stop reach it as events."""
    async with kernel_cluster("api-ctl") as cluster:
        models = await wait_model(
            jp_fetch, lambda m: m.get("api-ctl", {}).get("counts") == {"joined": 2}
        )
        m = models["api-ctl"]
        assert m["status"] == "running"
        assert m["owner"] == "kernel"
        assert m["pid"] == os.getpid()
        assert m["backend"] == "local"
        assert m["scheduler_address"] == cluster.scheduler_address
        assert m["dashboard_link"] == cluster.dashboard_link
        assert m["gpu"] == "t4" and m["spot"] is True
        assert m["target_workers"] == 2
        assert states(m) == {"ps-0": "joined", "w-0": "joined", "w-1": "joined"}
        assert m["workers"][0]["role"] == "ps"  # the PS host first
        assert all(w["gpu"] == "t4" and w["zone"] for w in m["workers"] if w["role"] == "worker")
        assert m["preemptions"] == 0
        assert m["training"] is None
        assert m["cost"]["rate_per_hour"] > 0
        assert m["cost"]["cost_on_demand"] > m["cost"]["cost"] > 0  # spot is cheaper
        assert m["cost"]["saved"] > 0
        assert "api-ctl" in m["connect_code"] or cluster.scheduler_address in m["connect_code"]
        code, one = await call(jp_fetch, "clusters", "api-ctl")
        assert code == 200 and one["name"] == "api-ctl"

        # A worker that is not there: the owning cluster refuses, and says which ones are.
        code, answer = await call(
            jp_fetch, "clusters", "api-ctl", "preempt", method="POST", body={"worker": "w-99"}
        )
        assert code == 400 and "w-99" in answer["message"] and "w-0" in answer["message"]

        code, answer = await call(
            jp_fetch, "clusters", "api-ctl", "preempt", method="POST", body={"worker": "w-0"}
        )
        assert code == 200, answer
        assert answer["answered"] is True
        models = await wait_model(
            jp_fetch,
            lambda m: (
                states(m["api-ctl"]).get("w-0") == "preempted"
                and states(m["api-ctl"]).get("w-2") == "joined"
            ),
        )
        assert models["api-ctl"]["preemptions"] == 1
        assert models["api-ctl"]["last_control"]["action"] == "preempt"

        code, answer = await call(
            jp_fetch, "clusters", "api-ctl", "scale", method="POST", body={"workers": 3}
        )
        assert code == 200 and answer["answered"] is True, answer
        models = await wait_model(jp_fetch, lambda m: m["api-ctl"]["counts"] == {"joined": 3})
        assert models["api-ctl"]["target_workers"] == 3

        # More PS hosts: refused past four by the owning cluster, then a second one joins.
        code, answer = await call(
            jp_fetch, "clusters", "api-ctl", "scale-ps", method="POST", body={"hosts": 5}
        )
        assert code == 400 and "at most 4 PS hosts" in answer["message"], answer
        code, answer = await call(
            jp_fetch, "clusters", "api-ctl", "scale-ps", method="POST", body={"hosts": 2}
        )
        assert code == 200 and answer["answered"] is True, answer
        assert answer["action"] == "scale-ps"
        await wait_model(jp_fetch, lambda m: states(m["api-ctl"]).get("ps-1") == "joined")
        assert cluster.ps_hosts == 2

        code, answer = await call(jp_fetch, "clusters", "api-ctl", method="DELETE")
        assert code == 200 and answer["answered"] is True, answer
        await wait_model(jp_fetch, lambda m: "api-ctl" not in m)
        assert registry.entries() == []
        await wait_for(lambda: cluster.status.name == "closed", timeout=30)


@pytest.mark.slow
async def test_a_mixed_cluster_is_shown_and_scaled_by_type(jp_fetch: Fetch) -> None:
    async with kernel_cluster("api-mix", workers={"t4": 1, "v100": 1}):
        models = await wait_model(
            jp_fetch, lambda m: m.get("api-mix", {}).get("counts") == {"joined": 2}
        )
        m = models["api-mix"]
        assert m["mix"] == {"t4": 1, "v100": 1}
        types = {w["name"]: w["gpu"] for w in m["workers"] if w["role"] == "worker"}
        assert sorted(types.values()) == ["t4", "v100"]
        assert set(m["cost_by_gpu"]) == {"ps", "t4", "v100"}
        # A plain number is ambiguous for a mixed cluster: the owner says so.
        code, answer = await call(
            jp_fetch, "clusters", "api-mix", "scale", method="POST", body={"workers": 3}
        )
        assert code == 400 and "this cluster mixes t4=1,v100=1" in answer["message"], answer
        code, answer = await call(
            jp_fetch,
            "clusters",
            "api-mix",
            "scale",
            method="POST",
            body={"workers": 2, "gpu": "v100"},
        )
        assert code == 200 and answer["answered"] is True, answer
        models = await wait_model(jp_fetch, lambda m: m["api-mix"]["counts"] == {"joined": 3})
        assert models["api-mix"]["mix"] == {"t4": 1, "v100": 2}
        code, answer = await call(
            jp_fetch, "clusters", "api-mix", "scale", method="POST", body={"workers": "t4=2"}
        )
        assert code == 200, answer
        models = await wait_model(jp_fetch, lambda m: m["api-mix"]["mix"] == {"t4": 2, "v100": 0})


@pytest.mark.slow
async def test_workers_on_demand_and_a_ps_move_are_asked_from_the_panel(jp_fetch: Fetch) -> None:
    """The panel's scale with an on-demand share, and its PS move, reach the owning cluster."""
    async with kernel_cluster("api-move", workers=1, fallback_zones=["us-east1-c"]) as cluster:
        models = await wait_model(
            jp_fetch, lambda m: m.get("api-move", {}).get("counts") == {"joined": 1}
        )
        m = models["api-move"]
        assert m["zones"] == ["us-central1-a", "us-east1-c"]
        assert m["ps_zone"] == "us-central1-a"

        # One more worker, and it runs on demand; more on demand than workers is refused.
        code, answer = await call(
            jp_fetch, "clusters", "api-move", "scale", method="POST",
            body={"workers": 2, "on_demand": 3},
        )  # fmt: skip
        assert code == 400 and "3 t4 on demand, but the mix keeps 2 t4" in answer["message"]
        code, answer = await call(
            jp_fetch, "clusters", "api-move", "scale", method="POST",
            body={"workers": 2, "on_demand": "t4=1"},
        )  # fmt: skip
        assert code == 200 and answer["answered"] is True, answer
        models = await wait_model(jp_fetch, lambda m: m["api-move"]["counts"] == {"joined": 2})
        pricing = {w["name"]: w["spot"] for w in models["api-move"]["workers"]}
        assert pricing == {"ps-0": False, "w-0": True, "w-1": False}

        # A zone it may not use is refused, with the ones it may; then the PS moves.
        code, answer = await call(
            jp_fetch, "clusters", "api-move", "move-ps", method="POST",
            body={"zone": "europe-west4-a"},
        )  # fmt: skip
        assert code == 400, answer
        assert "not a zone this cluster may use (us-central1-a, us-east1-c)" in answer["message"]
        code, answer = await call(
            jp_fetch, "clusters", "api-move", "move-ps", method="POST",
            body={"zone": "us-east1-c", "reason": "closer"},
        )  # fmt: skip
        assert code == 200 and answer["action"] == "move-ps", answer
        models = await wait_model(
            jp_fetch,
            lambda m: (
                m["api-move"]["ps_zone"] == "us-east1-c"
                and states(m["api-move"]).get("ps-0") == "deleted"
            ),
        )
        ps = [w for w in models["api-move"]["workers"] if w["role"] == "ps"]
        assert [(w["name"], w["zone"], w["state"]) for w in ps] == [
            ("ps-1", "us-east1-c", "joined"),
            ("ps-0", "us-central1-a", "deleted"),
        ]
        kinds = [e["kind"] for e in cluster.monitor.events if e["kind"].startswith("ps-move")]
        assert kinds == ["ps-move"]
        move = next(e for e in cluster.monitor.events if e["kind"] == "ps-move")
        assert (move["zone_from"], move["zone"], move["reason"]) == (
            "us-central1-a",
            "us-east1-c",
            "closer",
        )


@pytest.mark.slow
async def test_a_policy_is_turned_on_and_off_and_shown(jp_fetch: Fetch) -> None:
    async with kernel_cluster("api-adapt", workers=1):
        await wait_model(jp_fetch, lambda m: m.get("api-adapt", {}).get("counts") == {"joined": 1})
        # Bad goals are refused by the server, naming the value, before the cluster is asked.
        for goal, words in [
            ("deadline:soon", "not 'soon'"),
            ("budget:-3", "budget"),
            ("faster", "'faster'"),
            (7, "goal=7"),
        ]:
            code, answer = await call(
                jp_fetch, "clusters", "api-adapt", "adapt", method="POST", body={"goal": goal}
            )
            assert code == 400 and words in answer["message"], (goal, answer)
        code, answer = await call(jp_fetch, "clusters", "api-adapt", "adapt", method="POST")
        assert code == 400 and "deadline:2h" in answer["message"], answer
        assert (await listing(jp_fetch))["api-adapt"]["policy"] is None
        code, answer = await call(
            jp_fetch, "clusters", "api-adapt", "adapt", method="POST", body={"goal": "budget:20"}
        )
        assert code == 200 and answer["answered"] is True, answer
        models = await wait_model(jp_fetch, lambda m: m["api-adapt"]["policy"] is not None)
        policy = models["api-adapt"]["policy"]
        # No run yet: the goal is on, and it has nothing to decide.
        assert policy["text"] == "Policy: budget $20.00 (waiting for a training run to plan for)"
        del policy["text"]
        assert policy == {
            "goal": "budget",
            "deadline_s": None,
            "budget": 20.0,
            "remembered_h": 0.0,  # no memory file
            "decision": None,
        }
        code, answer = await call(
            jp_fetch, "clusters", "api-adapt", "adapt", method="POST", body={"goal": "off"}
        )
        assert code == 200, answer
        await wait_model(jp_fetch, lambda m: m["api-adapt"]["policy"] is None)


@pytest.mark.slow
async def test_cluster_started_from_the_panel_is_detached(
    jp_fetch: Fetch, jp_serverapp: Any
) -> None:
    # The server answers other requests while the head starts (it starts from a thread).
    creating = asyncio.ensure_future(
        call(
            jp_fetch,
            "clusters",
            method="POST",
            body={"name": "panel-1", "workers": 1, "provisioning_delay": "0s", "notice": "1s"},
        )
    )
    code, _ = await call(jp_fetch, "options")
    assert code == 200
    assert not creating.done()  # answered while the cluster was still starting
    code, model = await creating
    assert code == 201, model
    assert model["name"] == "panel-1" and model["owner"] == "head"
    models = await wait_model(
        jp_fetch, lambda m: m.get("panel-1", {}).get("counts") == {"joined": 1}
    )
    head = int(models["panel-1"]["pid"])
    assert head != os.getpid()  # it lives in a head process of its own, not in the server
    family = [head, *(p.pid for p in psutil.Process(head).children(recursive=True))]
    assert len(family) >= 3  # the head, the PS host's and the worker's processes

    # The server going away leaves it running (stop_extension closes connections only).
    manager = jp_serverapp.web_app.settings["transient_nb_manager"]
    await manager.close()
    assert psutil.pid_exists(head)
    assert [e["name"] for e in registry.entries() if not e["stale"]] == ["panel-1"]

    code, answer = await call(jp_fetch, "clusters", "panel-1", method="DELETE")
    assert code == 200, answer
    await wait_for(
        lambda: (
            not [
                p for p in family if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"
            ]
        ),
        timeout=120,
    )
    assert registry.entries() == []


# -- stale and unreachable clusters ---------------------------------------------------------------------
async def test_stale_entry_is_shown_then_removed(jp_fetch: Fetch) -> None:
    register_stale("ghost")

    models = await listing(jp_fetch)
    assert models["ghost"]["status"] == "stale"

    code, answer = await call(
        jp_fetch, "clusters", "ghost", "scale", method="POST", body={"workers": 1}
    )
    assert code == 400 and "stale" in answer["message"]

    code, answer = await call(jp_fetch, "clusters", "ghost", method="DELETE")
    assert code == 200 and answer["removed"] is True
    assert "ghost" not in await listing(jp_fetch)


async def test_unreachable_scheduler_is_marked_not_fatal(jp_fetch: Fetch) -> None:
    # A live owner (this process) whose scheduler does not answer: port 9 (discard) is closed.
    registry.register("lost", {"backend": "local", "scheduler_address": "tcp://127.0.0.1:9"})
    models = await listing(jp_fetch)
    assert models["lost"]["status"] == "unreachable"
    code, answer = await call(
        jp_fetch, "clusters", "lost", "preempt", method="POST", body={"worker": "w-0"}
    )
    assert code == 400 and "unreachable" in answer["message"]
    registry.unregister("lost")


# -- bad input --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("method", "parts", "body"),
    [
        ("GET", ("clusters", "nope"), None),
        ("DELETE", ("clusters", "nope"), None),
        ("POST", ("clusters", "nope", "scale"), {"workers": 1}),
        ("POST", ("clusters", "nope", "preempt"), {"worker": "w-0"}),
        ("POST", ("clusters", "nope", "scale-ps"), {"hosts": 2}),
        ("POST", ("clusters", "nope", "move-ps"), {"zone": "us-east1-c"}),
    ],
)
async def test_unknown_cluster_is_404(
    jp_fetch: Fetch, method: str, parts: tuple[str, ...], body: Any
) -> None:
    code, answer = await call(jp_fetch, *parts, method=method, body=body)
    assert code == 404
    assert "nope" in answer["message"]


@pytest.mark.parametrize(
    ("parts", "body", "fragment"),
    [
        (("scale",), {"workers": -1}, "whole number"),
        (("scale",), {"workers": 1.5}, "whole number"),
        (("scale",), {"workers": "two"}, "whole number"),
        (("scale",), {"workers": True}, "whole number"),
        (("scale",), {"workers": "k80=-1"}, "k80=-1 is not a number of workers"),
        (("scale",), {"workers": {}}, "asks for no workers"),
        (("scale",), {"workers": 2, "gpu": 7}, "give a GPU type"),
        (("scale",), {"workers": 2, "on_demand": -1}, "on_demand=-1): give a whole number"),
        (("scale",), {"workers": 2, "on_demand": 1.5}, "on_demand=1.5): give a whole number"),
        (("scale",), {"workers": 2, "on_demand": "t4=x"}, "t4='x' is not a number of workers"),
        (("scale",), {}, "workers"),
        (("scale",), "{not json", "not valid JSON"),
        (("scale",), "[1, 2]", "JSON object"),
        (("scale-ps",), {"hosts": 0}, "hosts=0: give a whole number of PS hosts"),
        (("scale-ps",), {"hosts": True}, "whole number of PS hosts"),
        (("scale-ps",), {"hosts": "2"}, "whole number of PS hosts"),
        (("scale-ps",), {}, '{"hosts": n}'),
        (("move-ps",), {"zone": 3}, "move_ps(3): give a zone name such as 'us-east1-c'"),
        (("move-ps",), {"zone": " "}, "move_ps(' '): give a zone name"),
        (("move-ps",), {"zone": "us-east1-c", "reason": 1}, "reason=1): the reason is text"),
        (("move-ps",), {}, '{"zone": ZONE}'),
        (("preempt",), {"worker": 3}, "name of a worker"),
        (("preempt",), {"worker": "w-0", "notice": "yes"}, "true or false"),
        (("preempt",), {}, "worker"),
    ],
)
async def test_bad_control_input_is_400(
    jp_fetch: Fetch, parts: tuple[str, ...], body: Any, fragment: str
) -> None:
    # Checked before the cluster is looked up: a malformed request is wrong for any cluster.
    code, answer = await call(jp_fetch, "clusters", "any", *parts, method="POST", body=body)
    assert code == 400, answer
    assert fragment in answer["message"]


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"gpu": "h9000"}, "Unknown GPU type 'h9000'"),
        ({"zone": "mars-1a"}, "Unknown zone"),
        ({"workers": 0}, "at least 1"),
        ({"workers": "2"}, "must be a whole number"),
        # A mix of GPU types (the form's workers field): every type priced, counts whole.
        ({"workers": "t4=1,h9000=1"}, "Unknown GPU type 'h9000'"),
        ({"workers": "t4=two"}, "t4='two' is not a number of workers"),
        ({"workers": {}}, "asks for no workers"),
        ({"workers": [1, 2]}, "must be a whole number or a string or an object"),
        ({"preemption": "sometimes"}, "sometimes"),
        ({"name": "Bad Name"}, "not allowed"),
        ({"colour": "red"}, "Unknown parameter 'colour'"),
        ("{oops", "not valid JSON"),
    ],
)
async def test_bad_create_input_is_400(jp_fetch: Fetch, body: Any, fragment: str) -> None:
    code, answer = await call(jp_fetch, "clusters", method="POST", body=body)
    assert code == 400, answer
    assert fragment in answer["message"]
    assert registry.entries() == []


async def test_a_price_catalog_file_from_a_request_is_refused(
    jp_fetch: Fetch, tmp_path: Any
) -> None:
    """A request names a packaged catalog only: a path would have the server read any YAML
    file, and price a cluster (and its limits) from it. A valid catalog file is still refused."""
    from importlib import resources

    cheap = tmp_path / "cheap.yaml"
    cheap.write_text((resources.files("transient_nb.catalog") / "gce-2025.yaml").read_text())
    body = {"workers": 1, "prices": str(cheap), "name": "byfile", "time_scale": 60}
    code, answer = await call(jp_fetch, "clusters", method="POST", body=body)
    assert code == 400, answer
    assert "not one of the packaged price catalogs (gce-2025, paper-2019)" in answer["message"]
    assert "TransientCluster(prices='/path/catalog.yaml')" in answer["message"]
    assert registry.entries() == []


async def test_bad_wait_is_400(jp_fetch: Fetch) -> None:
    code, answer = await call(jp_fetch, "clusters", params={"wait": "soon"})
    assert code == 400 and "wait" in answer["message"]
    code, answer = await call(jp_fetch, "clusters", params={"wait": "999"})
    assert code == 400


# -- authentication -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "transient-nb/clusters"),
        ("POST", "transient-nb/clusters"),
        ("GET", "transient-nb/clusters/x"),
        ("DELETE", "transient-nb/clusters/x"),
        ("POST", "transient-nb/clusters/x/scale"),
        ("POST", "transient-nb/clusters/x/preempt"),
        ("POST", "transient-nb/clusters/x/adapt"),
        ("GET", "transient-nb/options"),
    ],
)
async def test_unauthenticated_requests_are_refused(
    jp_fetch: Fetch, method: str, path: str
) -> None:
    body = "{}" if method == "POST" else None
    try:
        response = await jp_fetch(
            *path.split("/"),
            method=method,
            body=body,
            headers={"Authorization": "token wrong"},
            raise_error=False,
        )
    except HTTPClientError as e:  # pragma: no cover - depends on the tornado version
        response = e.response  # type: ignore[assignment]
    assert response.code in (401, 403)
    assert registry.entries() == []


# -- authorization --------------------------------------------------------------------------------
class ReadOnlyAuthorizer(Authorizer):
    """A server shared read-only: every user may read, nobody may write or execute."""

    def is_authorized(self, handler: Any, user: Any, action: str, resource: str) -> bool:
        return action == "read"


class TestAReadOnlyAuthorizer:
    """The server's Authorizer is asked on every route: a read-only share lists, never changes."""

    @pytest.fixture
    def jp_server_config(self) -> dict[str, Any]:
        return {
            "ServerApp": {
                "jpserver_extensions": {"transient_nb": True},
                "authorizer_class": ReadOnlyAuthorizer,
            },
            "TransientServerExtension": {"rpc_timeout": 1.0, "answer_timeout": 5.0},
        }

    async def test_lists_but_cannot_create_scale_or_stop(self, jp_fetch: Fetch) -> None:
        async with kernel_cluster("ro", workers=1) as cluster:
            models = await wait_model(jp_fetch, lambda m: "ro" in m)
            assert models["ro"]["status"] == "running"
            code, _ = await call(jp_fetch, "clusters", "ro")
            assert code == 200
            code, _ = await call(jp_fetch, "options")
            assert code == 200
            for parts, method, body in [
                (("clusters",), "POST", {"workers": 1, "name": "sneaky"}),
                (("clusters", "ro", "scale"), "POST", {"workers": 3}),
                (("clusters", "ro", "scale-ps"), "POST", {"hosts": 2}),
                (("clusters", "ro", "move-ps"), "POST", {"zone": "us-central1-a"}),
                (("clusters", "ro", "preempt"), "POST", {"worker": "w-0"}),
                (("clusters", "ro", "adapt"), "POST", {"goal": "cost-per-step"}),
                (("clusters", "ro"), "DELETE", None),
            ]:
                code, answer = await call(jp_fetch, *parts, method=method, body=body)
                assert code == 403, (parts, answer)
                assert "not authorized to write" in answer["message"], answer
            # Nothing was asked of the cluster: no control request reached it.
            assert not [e for e in cluster.monitor.events if e["kind"] == "control"]
            assert cluster.mix == {cluster.gpu: 1}
            assert [e["name"] for e in registry.entries()] == ["ro"]
