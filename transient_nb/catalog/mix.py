"""The worker mix: how many workers of each GPU type a cluster keeps.

A cluster asks for ``workers=4`` (four workers of its ``gpu`` type) or for a mix such as
``workers={"k80": 2, "p100": 1, "v100": 1}`` (the paper's heterogeneous clusters, its §7 item 7).
The magic, the CLI and the JupyterLab panel spell a mix as text, ``"k80=2,p100=1,v100=1"``. One
parser here serves them all, so every surface accepts the same spellings and refuses the same
mistakes with the same words.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: A mix: GPU type -> number of workers of that type, in the order the user gave them.
Mix = dict[str, int]


def _count(value: Any, gpu: str) -> int:
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            value = value.strip()
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(
            f"workers: {gpu}={value!r} is not a number of workers: give a whole number, 0 or more "
            "(e.g. k80=2)."
        )
    return value


def parse_mix(workers: int | str | Mapping[str, Any], gpu: str) -> Mix:
    """The mix that ``workers`` asks for; ``gpu`` is the type of a plain number.

    Parameters
    ----------
    workers
        A number of workers (all of type ``gpu``), a mapping GPU type -> count, or the same as
        text: ``"3"`` or ``"k80=2,p100=1,v100=1"``.
    gpu
        The GPU type of a plain number of workers.

    Returns
    -------
    GPU type (lower case) -> count, in the order given. Types whose count is 0 are dropped.

    Raises
    ------
    ValueError
        A negative or non-whole count, a type given twice, an empty mix, or a mix whose
        counts are all 0; the message names the value.

    Examples
    --------
    >>> parse_mix(3, "t4")
    {'t4': 3}
    >>> parse_mix("k80=2, V100=1", "t4")
    {'k80': 2, 'v100': 1}
    >>> parse_mix({"k80": 2, "p100": 0}, "t4")
    {'k80': 2}
    """
    if isinstance(workers, bool):
        raise ValueError(
            f"workers={workers!r} must be a whole number of at least 1, or a mix like k80=2."
        )
    if isinstance(workers, int):
        return {gpu.lower(): _positive(workers)}
    if isinstance(workers, str):
        text = workers.strip()
        if text.isdigit():
            return {gpu.lower(): _positive(int(text))}
        pairs: list[tuple[str, Any]] = []
        for part in text.split(","):
            if not part.strip():
                continue
            key, sep, value = part.partition("=")
            if not sep or not key.strip():
                raise ValueError(
                    f"workers={workers!r}: {part.strip()!r} is not TYPE=COUNT; write a number of "
                    "workers or a mix like k80=2,p100=1,v100=1."
                )
            pairs.append((key, value))
    elif isinstance(workers, Mapping):
        pairs = list(workers.items())
    else:
        raise ValueError(
            f"workers={workers!r} must be a whole number of at least 1, or a mix like "
            "{'k80': 2, 'v100': 1}."
        )
    mix: Mix = {}
    for key, value in pairs:
        if not isinstance(key, str) or not key.strip():
            raise ValueError(f"workers: {key!r} is not a GPU type (e.g. 'k80', 'v100').")
        name = key.strip().lower()
        if name in mix:
            raise ValueError(f"workers: GPU type {name!r} is given twice; give each type once.")
        mix[name] = _count(value, name)
    mix = {g: n for g, n in mix.items() if n > 0}
    if not mix:
        raise ValueError(
            f"workers={workers!r} asks for no workers: give at least one, e.g. k80=2,v100=1."
        )
    return mix


def zero_mix(text: str) -> bool:
    """Whether ``text`` is TYPE=COUNT pairs that all count 0 (``"v100=0"``): as a mix, one that
    :func:`parse_mix` refuses (it asks for no workers); as an on-demand share, none."""
    if "=" not in text:
        return False
    try:
        parse_mix(text, "")
    except ValueError as e:
        return "asks for no workers" in str(e)
    return False


def on_demand_value(on_demand: Any) -> int | dict[str, int]:
    """``scale(on_demand=...)`` as the control message carries it: a number, or GPU type ->
    number (text such as ``"v100=1"`` is parsed as a mix is; every type at 0 is none). The
    owning cluster checks the counts against its mix; this checks only the form.

    Examples
    --------
    >>> on_demand_value("2"), on_demand_value("v100=1"), on_demand_value("v100=0")
    (2, {'v100': 1}, {})
    """
    if isinstance(on_demand, str) and on_demand.strip().isdigit():
        on_demand = int(on_demand.strip())
    if (
        isinstance(on_demand, bool)
        or not isinstance(on_demand, (int, str, Mapping))
        or (isinstance(on_demand, int) and on_demand < 0)
    ):
        raise ValueError(
            f"scale(on_demand={on_demand!r}): give a whole number of workers, 0 or more, or GPU "
            "type -> number, e.g. on_demand={'v100': 1}."
        )
    if isinstance(on_demand, int):
        return on_demand
    if isinstance(on_demand, Mapping):
        return dict(on_demand)
    if zero_mix(on_demand):
        return {}  # every type named at 0: none on demand
    try:
        return parse_mix(on_demand, "")
    except ValueError as e:
        raise ValueError(f"scale(on_demand={on_demand!r}): {e}") from None


def _positive(n: int) -> int:
    if n < 1:
        raise ValueError(f"workers={n!r} must be a whole number of at least 1.")
    return n


def format_mix(mix: Mapping[str, int]) -> str:
    """``mix`` as text, the way the magic, the CLI and the panel take it.

    Examples
    --------
    >>> format_mix({"k80": 2, "v100": 1})
    'k80=2,v100=1'
    """
    return ",".join(f"{g}={n}" for g, n in mix.items())
