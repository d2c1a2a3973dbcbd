"""The argument types of the CLI and the magic: each parses what was typed, and each error says
what to type instead (argparse shows it as ``argument --flag: ...``).

Durations and dollars are checked by :mod:`transient_nb.limits` (the one rule for money and
time); the text typed is kept where the API reads text. :mod:`transient_nb.deploy.options` gives
each option of its table one of these.

Examples
--------
>>> whole("workers", 1)("4")
4
>>> names(" t4, v100 ,")
['t4', 'v100']
"""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Callable
from typing import Any

from transient_nb.catalog.mix import parse_mix, zero_mix
from transient_nb.limits import dollars, duration


def whole(what: str, minimum: int) -> Callable[[str], int]:
    """A whole number of ``what`` of at least ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a whole number of {what} of at least {minimum}; type e.g. "
                f"{max(minimum, 4)}"
            )
        return value

    parse.__name__ = f"whole number of {what}"
    return parse


def workers(minimum: int) -> Callable[[str], int | dict[str, int]]:
    """A number of workers, or a mix of GPU types such as ``k80=2,p100=1,v100=1``."""

    def parse(text: str) -> int | dict[str, int]:
        if "=" not in text:
            return whole("workers", minimum)(text)
        try:
            return parse_mix(text, "")
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    parse.__name__ = "number of workers or TYPE=COUNT,..."
    return parse


def on_demand(text: str) -> int | dict[str, int]:
    """``scale --on-demand``: a number of workers (of the type N counts) or TYPE=COUNT pairs such
    as ``v100=1``; ``0``, or every type at 0, is none on demand."""
    if zero_mix(text):
        return {}
    return workers(0)(text)


on_demand.__name__ = "number of workers or TYPE=COUNT,..."


def positive(what: str) -> Callable[[str], float]:
    """A positive number of ``what``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not value > 0:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a positive number of {what}; type e.g. 120"
            )
        return value

    parse.__name__ = f"positive number of {what}"
    return parse


def money(what: str) -> Callable[[str], float]:
    """Positive dollars, checked by :func:`transient_nb.limits.dollars` (``what`` names it)."""

    def parse(text: str) -> float:
        try:
            value: Any = float(text)
        except ValueError:
            value = text
        try:
            return float(dollars(value, what) or 0.0)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    parse.__name__ = "dollars"
    return parse


def length(what: str, example: str) -> Callable[[str], str]:
    """A positive duration, checked by :func:`transient_nb.limits.duration`; the text is kept."""

    def parse(text: str) -> str:
        try:
            duration(text, what, example)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        return text

    parse.__name__ = "duration"
    return parse


def fraction(text: str) -> float:
    """A fraction in (0, 1]."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction in (0, 1]; type e.g. 0.9")
    return value


def names(text: str) -> list[str]:
    """Comma-separated names, such as ``t4,v100``."""
    return [t.strip() for t in text.split(",") if t.strip()]


class Renamed(argparse.Action):
    """An option's old flag, for one release: it stores its value under the new option's
    ``dest``, with a ``DeprecationWarning`` naming the new flag (``--history`` is ``--memory``)."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        new = "--" + self.dest.replace("_", "-")
        warnings.warn(
            f"{option_string} is now {new}; type {new} (the old flag goes in the next release).",
            DeprecationWarning,
            stacklevel=2,
        )
        setattr(namespace, self.dest, values)
