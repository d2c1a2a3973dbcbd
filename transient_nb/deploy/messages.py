"""Control messages: what a client may ask of the cluster that owns a scheduler, checked once.

Every surface that acts on a cluster it does not own (a remote handle, the CLI through it, the
JupyterLab panel through its server) builds its request here, so a malformed one is refused
with the same words everywhere, before it is posted on the scheduler's ``transient-control``
topic; the owning cluster's dispatcher (:mod:`transient_nb.deploy.control`) then checks what
only it can (its catalog, its mix, its zones) and answers with a ``control`` event.
:class:`ControlRequest` is the one reading of that answer.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from transient_nb.catalog.mix import on_demand_value, parse_mix


class ControlRefused(ValueError):
    """The owning cluster refused a request; its message says why."""


def scale_message(workers: Any, gpu: Any = None, on_demand: Any = None) -> dict[str, Any]:
    """``scale``: keep ``workers`` GPU workers (a number, of type ``gpu`` if given) or a mix.

    Examples
    --------
    >>> scale_message(3, gpu="V100 ")
    {'action': 'scale', 'workers': 3, 'gpu': 'v100'}
    >>> scale_message("k80=2,v100=1", on_demand="v100=1")["workers"]
    {'k80': 2, 'v100': 1}
    >>> scale_message(-1)
    Traceback (most recent call last):
    ...
    ValueError: workers=-1: give a whole number of workers, 0 or more, or a mix such as k80=2,v100=1.
    """
    if isinstance(workers, str) and workers.strip().isdigit():
        workers = int(workers.strip())
    if isinstance(workers, Mapping) or (isinstance(workers, str) and "=" in workers):
        workers = parse_mix(workers, "")
    elif isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise ValueError(
            f"workers={workers!r}: give a whole number of workers, 0 or more, or a mix such as "
            "k80=2,v100=1."
        )
    msg: dict[str, Any] = {"action": "scale", "workers": workers}
    if gpu is not None:
        if not isinstance(gpu, str) or not gpu.strip():
            raise ValueError(f"gpu={gpu!r}: give a GPU type such as 'v100', or leave it out.")
        msg["gpu"] = gpu.strip().lower()
    if on_demand is not None:
        msg["on_demand"] = on_demand_value(on_demand)
    return msg


def scale_ps_message(hosts: Any) -> dict[str, Any]:
    """``scale-ps``: keep ``hosts`` PS hosts.

    Examples
    --------
    >>> scale_ps_message(2)
    {'action': 'scale-ps', 'hosts': 2}
    """
    if isinstance(hosts, bool) or not isinstance(hosts, int) or hosts < 1:
        raise ValueError(f"hosts={hosts!r}: give a whole number of PS hosts, 1 or more.")
    return {"action": "scale-ps", "hosts": hosts}


def move_ps_message(zone: Any, reason: Any = "") -> dict[str, Any]:
    """``move-ps``: move the PS hosts to ``zone`` (the owning cluster checks the zone against
    those it may use).

    Examples
    --------
    >>> move_ps_message(" us-east1-c ", "closer")
    {'action': 'move-ps', 'zone': 'us-east1-c', 'reason': 'closer'}
    """
    if not isinstance(zone, str) or not zone.strip():
        raise ValueError(
            f"move_ps({zone!r}): give a zone name such as 'us-east1-c' (the cluster's zone or "
            "one of its fallback_zones)."
        )
    if not isinstance(reason, str):
        raise ValueError(f"move_ps({zone!r}, reason={reason!r}): the reason is text.")
    msg: dict[str, Any] = {"action": "move-ps", "zone": zone.strip()}
    if reason:
        msg["reason"] = reason
    return msg


def preempt_message(*, worker: Any = None, count: Any = None, notice: Any = True) -> dict[str, Any]:
    """``preempt``: the worker named ``worker``, or ``count`` workers chosen by the cluster,
    with the provider's notice or (``notice=False``) without.

    Examples
    --------
    >>> preempt_message(worker="w-0")
    {'action': 'preempt', 'worker': 'w-0', 'notice': True}
    >>> preempt_message(count=2, notice=False)
    {'action': 'preempt', 'count': 2, 'notice': False}
    """
    if not isinstance(notice, bool):
        raise ValueError(f"notice={notice!r} must be true or false.")
    if (worker is None) == (count is None):
        raise ValueError("preempt: give a worker's name or a number of workers (one of them).")
    if worker is not None:
        if not isinstance(worker, str) or not worker.strip():
            raise ValueError(f"worker={worker!r}: give the name of a worker, e.g. 'w-0'.")
        return {"action": "preempt", "worker": worker.strip(), "notice": notice}
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"preempt({count!r}): the number of workers must be at least 1.")
    return {"action": "preempt", "count": count, "notice": notice}


def adapt_message(goal: str | None, **args: Any) -> dict[str, Any]:
    """``adapt``: turn a transient-aware policy on with ``goal`` (and its arguments), or off.

    Examples
    --------
    >>> adapt_message("deadline", deadline="2h")
    {'action': 'adapt', 'goal': 'deadline', 'args': {'deadline': '2h'}}
    """
    from transient_nb.policy.goals import check_goal

    if goal is not None:
        check_goal(goal, args.get("deadline"), args.get("budget"))
    return {"action": "adapt", "goal": goal, "args": args}


def stop_message() -> dict[str, Any]:
    """``stop``: close the cluster (its runs first)."""
    return {"action": "stop"}


class ControlRequest:
    """One request: its message with a fresh id, and the reading of the owner's answer.

    Examples
    --------
    >>> req = ControlRequest(stop_message())
    >>> req.answer_in([{"kind": "control", "request": "other", "ok": True}]) is None
    True
    >>> req.answer_in([{"kind": "control", "request": req.id, "ok": True}])["ok"]
    True
    """

    def __init__(self, msg: Mapping[str, Any]):
        self.id = uuid.uuid4().hex[:12]
        self.msg: dict[str, Any] = {**msg, "id": self.id}
        self.action = str(msg.get("action"))

    def answer_in(self, events: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
        """The owner's answer among ``events`` (None if not there yet); a refusal raises
        :class:`ControlRefused` with the owner's words."""
        for e in events:
            if e.get("kind") == "control" and e.get("request") == self.id:
                if not e.get("ok"):
                    raise ControlRefused(str(e.get("error") or "the cluster refused"))
                return dict(e)
        return None
