"""Backends: where a transient cluster's VMs come from."""

from __future__ import annotations

from transient_nb.backends.base import Backend, CapacityError, TransientVM, VMSpec

__all__ = ["Backend", "CapacityError", "TransientVM", "VMSpec", "get_backend"]


def get_backend(name: str, **options: object) -> Backend:
    """The backend called ``name`` ("local" or "gce")."""
    if name == "local":
        from transient_nb.backends.local import LocalBackend

        return LocalBackend(**options)  # type: ignore[arg-type]
    if name == "gce":
        raise ValueError(
            "The 'gce' backend is not available in this version of transient_nb: use "
            "backend='local'."
        )
    raise ValueError(f"Unknown backend {name!r}: use 'local' or 'gce'.")
