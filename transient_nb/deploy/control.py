"""Control requests: what other views (the JupyterLab panel, a remote handle, the CLI) ask of the
cluster that owns a scheduler, posted on its ``transient-control`` topic, and the answers.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

from transient_nb.backends import TransientVM
from transient_nb.deploy.ps_hosts import PSHosts

logger = logging.getLogger(__name__)


class Control(PSHosts):
    """The one dispatcher of control requests (each action goes through the public method that
    checks its arguments)."""

    # -- control requests from other views (the JupyterLab panel) -------------------------------
    def _on_control(self, msg: dict[str, Any]) -> None:
        """Act on a control request posted on the scheduler (topic ``transient-control``)."""
        self._spawn(self._control(msg))

    async def _control(self, msg: dict[str, Any]) -> None:
        action = msg.get("action")
        if action == "provider-notice":
            # Only the monitor's check (the worker of the VM named, over its own connection)
            # lets this one through; see TransientMonitor.provider_notice.
            # A VM's own preemption notice (GCE: its metadata server), sent by its worker: the
            # same path as a simulated preemption, with no notice left to deliver.
            vm = self.workers.get(str(msg.get("vm")))
            if isinstance(vm, TransientVM) and not vm.stopped and not self._closing:
                vm.provider_notice = True
                await self._preempt_one(vm.name, True, str(msg.get("source", "provider")))
            return
        handler = self.control_handlers.get(str(action))
        if handler is not None:
            try:
                answer = await asyncio.to_thread(handler, msg)
            except Exception as e:
                await self._post(
                    "control", action=action, ok=False, error=str(e), request=msg.get("id")
                )
                return
            await self._post(
                "control", action=action, ok=True, request=msg.get("id"), **(answer or {})
            )
            return
        try:
            if action == "scale":
                workers = msg["workers"]
                if isinstance(workers, float):
                    workers = int(workers)
                # The on-demand share: a number (of the type a number counts, or the one type)
                # or GPU type -> number; scale checks it (and names a bad value).
                on_demand = msg.get("on_demand")
                if isinstance(on_demand, float) and on_demand.is_integer():
                    on_demand = int(on_demand)
                # A number, a mix ({"k80": 2} or "k80=2,v100=1"), and the type a number counts.
                self.scale(workers, gpu=msg.get("gpu") or None, on_demand=on_demand)
            elif action == "scale-ps":
                self.scale_ps(cast(int, msg.get("hosts")))  # scale_ps names a bad value
            elif action == "move-ps":
                # move_ps names a zone the cluster may not use, or a move already under way.
                self.move_ps(cast(str, msg.get("zone")), reason=str(msg.get("reason") or ""))
            elif action == "preempt":
                target = msg.get("worker") or int(msg.get("count", 1))
                await self._preempt(target, notice=bool(msg.get("notice", True)))
            elif action == "adapt":
                goal = msg.get("goal")
                self.adapt(None if goal is None else str(goal), **dict(msg.get("args") or {}))
            elif action == "stop":
                await self._post("control", action="stop", ok=True, request=msg.get("id"))
                self._spawn(self._close())
                return
            else:
                raise ValueError(f"unknown action {action!r}")
            await self._post("control", action=action, ok=True, request=msg.get("id"))
        except Exception as e:
            await self._post(
                "control", action=action, ok=False, error=str(e), request=msg.get("id")
            )
