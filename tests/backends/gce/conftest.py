"""The fixture of every test against the fake Compute Engine."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.backends.gce.fake_gce import FakeGCE
from tests.backends.gce.gce_helpers import new_fake


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeGCE]:
    """A fake Compute Engine of the test's own, closed at its end."""
    f = new_fake(tmp_path)
    yield f
    f.close()
