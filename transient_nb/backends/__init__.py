"""Backends: where a transient cluster's VMs come from."""

from __future__ import annotations

from transient_nb.backends.base import Backend, CapacityError, QuotaError, TransientVM, VMSpec

__all__ = ["Backend", "CapacityError", "QuotaError", "TransientVM", "VMSpec", "get_backend"]


def get_backend(name: str, **options: object) -> Backend:
    """The backend called ``name`` ("local" or "gce")."""
    if name == "local":
        from transient_nb.backends.local import LocalBackend

        return LocalBackend(**options)  # type: ignore[arg-type]
    if name == "gce":
        try:
            from transient_nb.backends.gce.backend import GCEBackend
        except ImportError as e:  # google-cloud-compute is an optional dependency
            raise ValueError(
                f"The 'gce' backend needs google-cloud-compute ({e}): pip install "
                "'transient_nb[gcp]', or use backend='local'."
            ) from e

        return GCEBackend(**options)  # type: ignore[arg-type]
    raise ValueError(f"Unknown backend {name!r}: use 'local' or 'gce'.")
