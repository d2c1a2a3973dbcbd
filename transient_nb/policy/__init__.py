"""What the cluster decides: where workers go (placement, spares), and the transient-aware policy
with its planner and its memory of earlier runs.

Before 0.2 ``transient_nb.policy`` was the policy's module; its names (``TransientPolicy``,
``check_goal`` ...) are still found here for one release, with a ``DeprecationWarning``: import
them from :mod:`transient_nb.policy.adaptive`.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    from transient_nb._moved import forward

    return forward("policy", "policy.adaptive", name)
