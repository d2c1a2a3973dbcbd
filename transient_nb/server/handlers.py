"""REST routes of the JupyterLab panel, under ``/transient-nb/``.

====================================================  =============================================
``GET    /transient-nb/clusters[?version=V&wait=S]``  every cluster's model; with ``version``, a long
                                                      poll that answers when the list changes
``POST   /transient-nb/clusters``                     start a cluster here (JSON: its parameters)
``GET    /transient-nb/clusters/NAME``                one cluster's model
``DELETE /transient-nb/clusters/NAME``                stop it (a stale one is just removed)
``POST   /transient-nb/clusters/NAME/scale``          ``{"workers": n[, "gpu": "v100"]}`` or a mix;
                                                      ``"on_demand": m`` (or ``"p100=1"``) of them
``POST   /transient-nb/clusters/NAME/scale-ps``       ``{"hosts": n}``: PS hosts, one shard each
``POST   /transient-nb/clusters/NAME/move-ps``        ``{"zone": "us-east1-c"}``: the PS moves there
``POST   /transient-nb/clusters/NAME/preempt``        ``{"worker": "w-0", "notice": true}``
``POST   /transient-nb/clusters/NAME/adapt``          ``{"goal": "deadline:2h"}``, ``"off"``...
``GET    /transient-nb/options``                      what the "new cluster" form offers
====================================================  =============================================

Every verb needs an authenticated user, and the server's Authorizer
(:class:`jupyter_server.auth.Authorizer`) must allow the user to ``read`` (``GET``) or ``write``
(every other verb: create, scale, preempt, adapt, stop) the resource :data:`AUTH_RESOURCE`: a
server shared read-only (an Authorizer that allows only ``read``) lets its guests watch the
clusters, never change them. Bad input gets a 4xx with ``{"message": ...}``; the handlers hold no
state, the :class:`~transient_nb.server.manager.ClusterManager` does.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import tornado.web
from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join

from transient_nb.server.manager import ClusterManager, ClusterNotFound

#: Longest long poll a client may ask for, in seconds.
MAX_WAIT_S = 30.0
_NAME = r"(?P<name>[^/]+)"
#: The resource the server's Authorizer is asked about (``read`` to list, ``write`` to change).
AUTH_RESOURCE = "transient_nb"


class _BaseHandler(APIHandler):
    """Shared plumbing: the manager, the JSON body, and errors as JSON with a message."""

    auth_resource = AUTH_RESOURCE

    @property
    def manager(self) -> ClusterManager:
        manager: ClusterManager = self.settings["transient_nb_manager"]
        return manager

    def fail(self, status: int, message: str) -> None:
        # Written here rather than raised as HTTPError: its message would go through %-formatting.
        self.log.info(
            "transient-nb: %s %s -> %d %s", self.request.method, self.request.path, status, message
        )
        self.set_status(status)
        self.finish(json.dumps({"message": message}))

    def reply(self, payload: Any, status: int = 200) -> None:
        self.set_status(status)
        self.finish(json.dumps(payload))

    def body(self) -> dict[str, Any]:
        """The request's JSON object; ``ValueError`` with a sentence if it is not one."""
        raw = self.request.body or b"{}"
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise ValueError(f"The request body is not valid JSON ({e}).") from None
        if not isinstance(data, dict):
            raise ValueError("The request body must be a JSON object.")
        return data

    async def run(self, action: Any, status: int = 200) -> None:
        """Await ``action`` and answer with its result, or with the right 4xx for its error."""
        try:
            result = await action
        except ClusterNotFound as e:
            self.fail(404, str(e))
        except ValueError as e:  # bad parameters, refused control requests
            self.fail(400, str(e))
        except TypeError as e:  # a parameter of the wrong kind that slipped past the checks
            self.fail(400, str(e))
        except (TimeoutError, asyncio.TimeoutError):  # distinct classes before Python 3.11
            self.fail(504, "The cluster's scheduler did not answer in time.")
        else:
            self.reply(result, status)


class ClustersHandler(_BaseHandler):
    """``/transient-nb/clusters``: list (long poll) and create."""

    @tornado.web.authenticated
    @authorized("read")
    async def get(self) -> None:
        version = self.get_query_argument("version", None)
        try:
            wait = float(self.get_query_argument("wait", "0"))
        except ValueError:
            return self.fail(400, "wait must be a number of seconds.")
        if not 0 <= wait <= MAX_WAIT_S:
            return self.fail(400, f"wait must be between 0 and {MAX_WAIT_S:g} seconds.")

        async def listing() -> dict[str, Any]:
            models, current = await self.manager.wait_for_change(
                version, wait, gone=lambda: self._hung_up
            )
            return {"clusters": models, "version": current}

        await self.run(listing())

    _hung_up = False

    def on_connection_close(self) -> None:
        # The panel aborts a pending long poll when it asks again (or the tab goes away).
        self._hung_up = True
        super().on_connection_close()

    @tornado.web.authenticated
    @authorized("write")
    async def post(self) -> None:
        try:
            params = self.body()
        except ValueError as e:
            return self.fail(400, str(e))
        await self.run(self.manager.create(params), status=201)


class ClusterHandler(_BaseHandler):
    """``/transient-nb/clusters/NAME``: one model, or stop."""

    @tornado.web.authenticated
    @authorized("read")
    async def get(self, name: str) -> None:
        await self.run(self.manager.get_cluster(name))

    @tornado.web.authenticated
    @authorized("write")
    async def delete(self, name: str) -> None:
        await self.run(self.manager.stop(name))


class ScaleHandler(_BaseHandler):
    """``/transient-nb/clusters/NAME/scale``: ``{"workers": n}``, ``{"workers": n, "gpu": "v100"}``
    or a whole mix, ``{"workers": "k80=2,v100=1"}``; with ``"on_demand": m`` (or ``"p100=1"``),
    how many of them run on demand."""

    @tornado.web.authenticated
    @authorized("write")
    async def post(self, name: str) -> None:
        try:
            body = self.body()
            if "workers" not in body:
                raise ValueError('Send {"workers": n}, the number of GPU workers to keep.')
        except ValueError as e:
            return self.fail(400, str(e))
        await self.run(
            self.manager.scale(name, body["workers"], body.get("gpu"), body.get("on_demand"))
        )


class ScalePsHandler(_BaseHandler):
    """``/transient-nb/clusters/NAME/scale-ps``: ``{"hosts": n}``, the PS hosts to keep."""

    @tornado.web.authenticated
    @authorized("write")
    async def post(self, name: str) -> None:
        try:
            body = self.body()
            if "hosts" not in body:
                raise ValueError('Send {"hosts": n}, the number of PS hosts to keep (1-4).')
        except ValueError as e:
            return self.fail(400, str(e))
        await self.run(self.manager.scale_ps(name, body["hosts"]))


class MovePsHandler(_BaseHandler):
    """``/transient-nb/clusters/NAME/move-ps``: ``{"zone": "us-east1-c"[, "reason": "..."]}``."""

    @tornado.web.authenticated
    @authorized("write")
    async def post(self, name: str) -> None:
        try:
            body = self.body()
            if "zone" not in body:
                raise ValueError('Send {"zone": ZONE}, one of the zones the cluster may use.')
        except ValueError as e:
            return self.fail(400, str(e))
        await self.run(self.manager.move_ps(name, body["zone"], body.get("reason", "")))


class PreemptHandler(_BaseHandler):
    """``/transient-nb/clusters/NAME/preempt``: ``{"worker": "w-0", "notice": true}``."""

    @tornado.web.authenticated
    @authorized("write")
    async def post(self, name: str) -> None:
        try:
            body = self.body()
            if "worker" not in body:
                raise ValueError('Send {"worker": NAME, "notice": true}, NAME as in the list.')
        except ValueError as e:
            return self.fail(400, str(e))
        await self.run(self.manager.preempt(name, body["worker"], body.get("notice", True)))


class AdaptHandler(_BaseHandler):
    """``/transient-nb/clusters/NAME/adapt``: ``{"goal": "deadline:2h"}`` (or ``budget:20``,
    ``cost-per-step``, ``off``)."""

    @tornado.web.authenticated
    @authorized("write")
    async def post(self, name: str) -> None:
        try:
            body = self.body()
            if "goal" not in body:
                raise ValueError(
                    'Send {"goal": "deadline:2h"}, "budget:20", "cost-per-step" or "off".'
                )
        except ValueError as e:
            return self.fail(400, str(e))
        await self.run(self.manager.adapt(name, body["goal"]))


class OptionsHandler(_BaseHandler):
    """``/transient-nb/options``: defaults and choices of the "new cluster" form."""

    @tornado.web.authenticated
    @authorized("read")
    async def get(self) -> None:
        self.reply(self.manager.options())


def handlers(base_url: str = "/") -> list[tuple[str, type[APIHandler]]]:
    """The routes, under ``base_url`` (the server's own prefix is added by the extension app)."""
    root = url_path_join(base_url, "transient-nb")
    return [
        (url_path_join(root, "clusters"), ClustersHandler),
        (url_path_join(root, "clusters", _NAME), ClusterHandler),
        (url_path_join(root, "clusters", _NAME, "scale"), ScaleHandler),
        (url_path_join(root, "clusters", _NAME, "scale-ps"), ScalePsHandler),
        (url_path_join(root, "clusters", _NAME, "move-ps"), MovePsHandler),
        (url_path_join(root, "clusters", _NAME, "preempt"), PreemptHandler),
        (url_path_join(root, "clusters", _NAME, "adapt"), AdaptHandler),
        (url_path_join(root, "options"), OptionsHandler),
    ]
