"""The policy's memory: what earlier runs saw of each Spot kind, kept on disk for the
transient-aware policy.

(Before 0.2 this was ``transient_nb.policy.history`` and :class:`PolicyMemory` was
``PolicyHistory``: both old names still work for one release, with a ``DeprecationWarning``.
"History" is a run's training curve alone, ``run.history``.)

A policy that starts from the paper's calm priors learns a storm by losing workers to it: under
a storm whose lifetimes are about a start-up long, most of a 0.6 h deadline was gone by the time
it knew (round eleven). The revocations, the hours exposed, the fraction of their places' time
the Spot workers trained and the start-ups of the workers asked for are what the next run in
the same zones needs from the start. They are kept per backend (a simulated storm on the local
backend says nothing of a cloud's zones), in a small JSON file, and weigh less as they age (a
half-life: a zone's Spot capacity changes over hours and days).

Each run keeps its own record (the totals it saw so far, replaced at each save), so that the
policies of several clusters can share a file: each writes its record under a lock, and a load
adds them up, each weighed by its age. Records that weigh under 1% are dropped. The file
(written whole, atomically)::

    {"version": 1, "scopes": {"local": {"runs": {"3f2a...": {"saved": 1796200000.0,
        "kinds": {"p100@us-central1-a": {"revocations": 25.0, "exposure_h": 2.1,
                                         "held_h": 3.0, "trained_h": 1.1}},
        "startups": [221.0, ...], "loads": [123.0, ...]}}}}}
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from filelock import FileLock

from transient_nb._moved import renamed

VERSION = 1
#: Start-ups kept (the newest): enough for a median, few enough that old ones drop out.
KEEP_STARTUPS = 50
#: A run's record weighing less than this (about 6.6 half-lives old) is dropped at a save.
FORGET_BELOW = 0.01
#: The fields of one kind's record, in this order in :attr:`Observations.kinds`.
KIND_FIELDS = ("revocations", "exposure_h", "held_h", "trained_h")


@dataclass(frozen=True)
class Observations:
    """What a planner saw (or earlier runs saw) of the Spot workers, summed over workers.

    ``kinds``: ``(gpu, zone)`` -> ``(revocations, exposure_h, held_h, trained_h)``: workers
    revoked, hours their VMs ran, hours they held their places in the cluster (from a
    replacement's request) and hours of those they trained. ``startups`` and ``loads``:
    seconds from asking for a worker to its training, and of those from its VM running.
    """

    kinds: Mapping[tuple[str, str], tuple[float, float, float, float]] = field(default_factory=dict)
    startups: tuple[float, ...] = ()
    loads: tuple[float, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.kinds or self.startups)

    def scaled(self, weight: float) -> Observations:
        """These observations weighing ``weight`` as much (the start-ups unchanged)."""
        return Observations(
            {k: tuple(v * weight for v in r) for k, r in self.kinds.items()},  # type: ignore[misc]
            self.startups,
            self.loads,
        )

    def __add__(self, other: Observations) -> Observations:
        kinds = dict(self.kinds)
        for k, r in other.kinds.items():
            mine = kinds.get(k, (0.0, 0.0, 0.0, 0.0))
            kinds[k] = tuple(a + b for a, b in zip(mine, r, strict=True))  # type: ignore[assignment]
        return Observations(
            kinds,
            (self.startups + other.startups)[-KEEP_STARTUPS:],
            (self.loads + other.loads)[-KEEP_STARTUPS:],
        )


class PolicyMemory:
    """The observations of earlier runs in a JSON file, for one backend: what the policy
    remembers.

    Parameters
    ----------
    path
        The file (created with its folder on the first save; ``~`` is expanded).
    scope
        Whose observations: the backend's name (``"local"``, ``"gce"``).
    half_life
        Seconds after which an observation weighs half as much.

    Examples
    --------
    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "memory.json")
    >>> m = PolicyMemory(path, "local", half_life=3600)
    >>> m.load(now=0.0)
    Observations(kinds={}, startups=(), loads=())
    >>> m.save(Observations({("p100", "us-central1-a"): (4.0, 2.0, 3.0, 1.5)}, (200.0,)), now=0.0)
    >>> PolicyMemory(path, "local", half_life=3600).load(now=3600.0).kinds
    {('p100', 'us-central1-a'): (2.0, 1.0, 1.5, 0.75)}
    """

    def __init__(self, path: str | os.PathLike[str], scope: str, half_life: float = 86400.0):
        if isinstance(half_life, bool) or not isinstance(half_life, (int, float)):
            raise ValueError(f"half_life={half_life!r} must be a number of seconds above 0.")
        if not half_life > 0 or not math.isfinite(half_life):
            raise ValueError(f"half_life={half_life!r} must be a number of seconds above 0.")
        self.path = Path(os.path.expanduser(os.fspath(path)))
        self.scope = str(scope)
        self.half_life = float(half_life)
        #: This run's record in the file (each save replaces it).
        self.run_id = uuid.uuid4().hex

    def load(self, now: float | None = None) -> Observations:
        """The earlier runs' observations of this scope, each weighed by its age at ``now``;
        nothing when the file does not exist yet. A file that is not a policy memory is refused (with
        its path) rather than overwritten."""
        now = time.time() if now is None else now
        total = Observations()
        runs = self._runs(self._read())
        for saved, seen in sorted(runs.values(), key=lambda r: r[0]):
            total = total + seen.scaled(self.weight(saved, now))
        return total

    def weight(self, saved: float, now: float) -> float:
        """How much an observation saved at ``saved`` weighs at ``now`` (1 when new)."""
        return float(0.5 ** (max(0.0, now - saved) / self.half_life))

    def save(self, run: Observations, now: float | None = None) -> None:
        """Keep ``run``, this run's observations so far, as its record (replacing the one its
        last save wrote); the other runs' records stay, but those too old to matter."""
        now = time.time() if now is None else now
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(f"{self.path}.lock", timeout=30):
            data = self._read()
            runs = {
                run_id: record
                for run_id, record in self._runs(data).items()
                if self.weight(record[0], now) >= FORGET_BELOW
            }
            runs[self.run_id] = (now, run)
            data[self.scope] = {"runs": {k: _record(*r) for k, r in runs.items()}}
            # Whole or not at all: a kernel killed mid-write leaves the last memory.
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".memory-", suffix=".json")
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump({"version": VERSION, "scopes": data}, f, indent=1)
                os.replace(tmp, self.path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise

    def _runs(self, data: Mapping[str, Any]) -> dict[str, tuple[float, Observations]]:
        """Run id -> (when saved, its observations) of this scope, checked."""
        try:
            return {
                str(run_id): _parse_record(record)
                for run_id, record in dict(data.get(self.scope, {}).get("runs") or {}).items()
            }
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            raise ValueError(
                f"{self.path}: its {self.scope!r} observations are not a policy memory ({e}); "
                "delete the file or give another path."
            ) from None

    def _read(self) -> dict[str, Any]:
        """The file's scopes ({} when there is no file)."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        try:
            data = json.loads(text)
            scopes = data["scopes"]
            if data.get("version") != VERSION or not isinstance(scopes, dict):
                raise ValueError(f"version {data.get('version')!r}")
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(
                f"{self.path} is not a policy memory ({e}); delete it or give another path."
            ) from None
        return dict(scopes)


def _record(saved: float, seen: Observations) -> dict[str, Any]:
    return {
        "saved": saved,
        "kinds": {
            f"{gpu}@{zone}": dict(zip(KIND_FIELDS, r, strict=True))
            for (gpu, zone), r in sorted(seen.kinds.items())
        },
        "startups": list(seen.startups)[-KEEP_STARTUPS:],
        "loads": list(seen.loads)[-KEEP_STARTUPS:],
    }


def _parse_record(record: Mapping[str, Any]) -> tuple[float, Observations]:
    kinds = {}
    for key, values in dict(record.get("kinds") or {}).items():
        kind = _kind_key(key)
        kinds[kind] = _kind_values(key, values)
    seen = Observations(
        kinds,
        tuple(float(s) for s in record.get("startups") or ())[-KEEP_STARTUPS:],
        tuple(float(s) for s in record.get("loads") or ())[-KEEP_STARTUPS:],
    )
    return float(record["saved"]), seen


def _kind_key(key: str) -> tuple[str, str]:
    gpu, _, zone = str(key).partition("@")
    if not gpu or not zone:
        raise ValueError(f"bad record {key!r}: its key is not GPU@ZONE")
    return gpu, zone


def _kind_values(key: str, record: Any) -> tuple[float, float, float, float]:
    try:
        values = tuple(float(record[f]) for f in KIND_FIELDS)
    except (KeyError, TypeError, ValueError):
        values = ()
    if len(values) != len(KIND_FIELDS) or not all(math.isfinite(v) and v >= 0 for v in values):
        raise ValueError(
            f"bad record {key!r}: {record!r} (give {', '.join(KIND_FIELDS)}, each 0 or more)"
        )
    return values  # type: ignore[return-value]


# PolicyMemory's name before 0.2, for one release.
__getattr__ = renamed(__name__, {"PolicyHistory": "PolicyMemory"})
