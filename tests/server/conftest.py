"""Fixtures of the server-extension tests: a Jupyter server with transient_nb enabled.

pytest-jupyter's server fixtures and hooks are imported here rather than named in
``pytest_plugins``: pytest allows that only in the root conftest, and here they stay scoped to
this folder, so their autouse fixtures do not run for the rest of the suite.
"""

from __future__ import annotations

from typing import Any

import pytest
from pytest_jupyter.jupyter_server import *  # noqa: F403


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    return {
        "ServerApp": {"jpserver_extensions": {"transient_nb": True}},
        # Short waits keep the "unreachable" and "no answer" paths fast.
        "TransientServerExtension": {"rpc_timeout": 1.0, "answer_timeout": 5.0},
    }
