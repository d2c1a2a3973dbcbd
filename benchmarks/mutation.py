"""Mutation score per module, with mutmut: how many deliberate bugs the unit tests catch.

Run by hand, like the other benchmarks, never in CI (minutes per module on two cores)::

    pip install -e ".[test,mutation]"
    python benchmarks/mutation.py                      # the default modules (money, preemption)
    python benchmarks/mutation.py cost prices          # some of them
    python benchmarks/mutation.py --rev HEAD           # the last commit, not the working tree
    python benchmarks/mutation.py training/ps --tests tests/training/test_ps.py

For every module, a scratch copy of the package, the tests and ``pyproject.toml`` goes to
``build/mutation/MODULE/`` (ignored by git), and ``mutmut run`` runs there with the repository's
``[tool.mutmut]`` settings, narrowed to that one module and to the fast unit tests in ``MODULES``
below (mutmut then runs, for each mutant, only those of them that call the mutated function).
Prints a markdown table (killed / survived / other, score) and writes the diff of every surviving
mutant to ``build/mutation/MODULE/survivors.txt``; survivors that are equivalent to the original
are listed with their reason in ``benchmarks/NOTES.md``.

``--max-children`` defaults to 1: the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Module (path under transient_nb/, no .py) -> the unit tests that exercise it. Fast tests only:
#: mutmut runs them once per mutant.
MODULES: dict[str, list[str]] = {
    # The bill folds the log for the views too (ClusterState feeds it): their tests count.
    "eventlog/bill": ["tests/eventlog/test_bill.py", "tests/eventlog/test_folds.py"],
    "catalog/prices": ["tests/catalog/test_prices.py"],
    "policy/placement": ["tests/policy/test_placement.py"],
    "catalog/lifetimes": ["tests/catalog/test_lifetimes.py"],
    "training/ps": ["tests/training/test_ps.py"],
    "training/trainer": ["tests/training/test_trainer.py"],
    "training/ps_link": ["tests/training/test_ps_link.py", "tests/training/test_trainer.py"],
    "training/flat": ["tests/training/test_flat.py"],
    "training/optim": ["tests/training/test_optim.py", "tests/training/test_ps.py"],
    "limits": ["tests/test_limits.py"],
    "training/checkpoint": ["tests/training/test_checkpoint.py"],
    # The driver's functions and its loop against in-process doubles (test_run.py takes minutes).
    "training/run": ["tests/training/test_run_driver.py", "tests/training/test_run_loop.py"],
    "training/run_driver": [
        "tests/training/test_run_driver.py",
        "tests/training/test_run_loop.py",
    ],
    "training/run_checkpoints": [
        "tests/training/test_run_driver.py",
        "tests/training/test_run_loop.py",
    ],
    "training/run_trainers": [
        "tests/training/test_run_driver.py",
        "tests/training/test_run_loop.py",
    ],
    "training/run_loop": ["tests/training/test_run_driver.py", "tests/training/test_run_loop.py"],
    # The transient-aware policy's model and its reading of the event log (synthetic streams).
    "policy/planner": ["tests/policy/test_planner.py"],
    # What the planner knows, and what it plans with: their own tests and the planner's.
    "policy/knowledge": ["tests/policy/test_knowledge.py", "tests/policy/test_planner.py"],
    "policy/plans": ["tests/policy/test_plans.py", "tests/policy/test_planner.py"],
    # Its one real-cluster run (minutes a mutant) left out: the synthetic streams test each rule.
    "policy/adaptive": [
        "tests/policy/test_adaptive.py",
        "tests/policy/test_memory.py",
        "-m",
        "not slow",
    ],
    "policy/learning": [
        "tests/policy/test_learning.py",
        "tests/policy/test_memory.py",
        "-m",
        "not slow",
    ],
    "policy/goals": ["tests/policy/test_goals.py"],
    "policy/memory": ["tests/policy/test_memory.py"],
}
DEFAULT = ["eventlog/bill", "catalog/prices", "policy/placement", "catalog/lifetimes"]

#: mutmut's verdicts (``mutmut results --all true``), grouped for the score.
KILLED = {"killed", "timeout", "caught by type check"}
SURVIVED = {"survived"}

# The child: runs in the scratch folder, with mutmut's configuration narrowed to one module.
_CHILD = """
import sys
import mutmut.configuration as configuration

cfg = configuration.config()
cfg.only_mutate = [{only!r}]
cfg.pytest_add_cli_args_test_selection = {tests!r}
# In mutmut's own process: pyproject's -n auto would hand each mutant's tests to xdist workers.
cfg.pytest_add_cli_args = [*cfg.pytest_add_cli_args, "-n", "0"]
from mutmut.__main__ import cli

if sys.argv[1:2] == ["show-all"]:  # one process for every survivor's diff
    for name in sys.argv[2:]:
        cli.main(["show", name], standalone_mode=False)
else:
    cli(sys.argv[1:])
"""


def scratch(module: str, rev: str | None) -> Path:
    """A fresh copy of what mutmut needs, under build/mutation/MODULE: the working tree, or the
    commit ``rev`` (a tree others are editing may not even import)."""
    work = ROOT / "build" / "mutation" / module.replace("/", "-")
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    if rev is not None:
        archive = subprocess.run(
            ["git", "archive", rev, "transient_nb", "tests", "pyproject.toml"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(work)], input=archive, check=True)
        shutil.rmtree(work / "transient_nb" / "labextension", ignore_errors=True)
        return work
    ignore = shutil.ignore_patterns("__pycache__", "node_modules", "labextension", "*.pyc")
    shutil.copytree(ROOT / "transient_nb", work / "transient_nb", ignore=ignore)
    shutil.copytree(ROOT / "tests", work / "tests", ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", work / "pyproject.toml")
    return work


#: Fraction of their bounds the trainer's loop tests wait (``TRANSIENT_NB_TEST_PATIENCE``): a
#: mutant that breaks the loop then fails in seconds, not after a minute. mutmut's clean run must
#: pass with it, so a bound too short for this machine stops the run rather than kill mutants.
PATIENCE = "0.25"


def mutmut(work: Path, module: str, tests: list[str], *args: str) -> subprocess.CompletedProcess:
    code = _CHILD.format(only=f"transient_nb/{module}.py", tests=tests)
    # One torch/OpenMP thread: mutmut forks a child per mutant, and a forked torch thread pool
    # hangs on its first call (the mutant then "dies" by timeout and counts as killed).
    env = {
        "TRANSIENT_NB_TEST_PATIENCE": PATIENCE,
        **os.environ,
        "PYTHONDONTWRITEBYTECODE": "1",
        "OMP_NUM_THREADS": "1",
    }
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=work, env=env, capture_output=True, text=True
    )


def spaced_test_ids(work: Path) -> list[str]:
    """The test ids mutmut recorded that hold whitespace (it cannot select them)."""
    import json

    stats = json.loads((work / "mutants" / "mutmut-stats.json").read_text())
    ids = {t for tests in stats.get("tests_by_mangled_function_name", {}).values() for t in tests}
    return sorted(t for t in ids if any(c.isspace() for c in t))


def results(work: Path, module: str, tests: list[str]) -> dict[str, str]:
    """Mutant name -> verdict, for the mutants of ``module``."""
    proc = mutmut(work, module, tests, "results", "--all", "true")
    prefix = "transient_nb." + module.replace("/", ".") + "."
    verdicts = {}
    for line in proc.stdout.splitlines():
        name, sep, verdict = line.strip().rpartition(": ")
        if sep and name.startswith(prefix):
            verdicts[name] = verdict
    return verdicts


def run_module(
    module: str,
    tests: list[str],
    max_children: int,
    rev: str | None,
    only: list[str] | None = None,
) -> dict[str, object]:
    work = scratch(module, rev)
    start = time.monotonic()
    proc = mutmut(work, module, tests, "run", "--max-children", str(max_children), *(only or []))
    (work / "run.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        sys.exit(f"mutmut failed for {module} (see {work / 'run.log'}):\n{proc.stdout[-3000:]}")
    spaced = spaced_test_ids(work)
    if spaced:
        # mutmut hands test ids to pytest split on spaces: such a test is "not found" for every
        # mutant, pytest fails, and every mutant looks killed (a 100% that proves nothing).
        sys.exit(
            f"mutmut's verdicts for {module} are void: test ids with spaces ({spaced[0]!r} and "
            f"{len(spaced) - 1} more); give their parameters ids without spaces."
        )
    verdicts = results(work, module, tests)
    if only:  # the mutants asked for (fnmatch patterns, as mutmut reads them)
        import fnmatch

        verdicts = {n: v for n, v in verdicts.items() if any(fnmatch.fnmatch(n, p) for p in only)}
    survivors = sorted(n for n, v in verdicts.items() if v in SURVIVED)
    (work / "survivors.txt").write_text(mutmut(work, module, tests, "show-all", *survivors).stdout)
    killed = sum(v in KILLED for v in verdicts.values())
    other = len(verdicts) - killed - len(survivors)
    return {
        "module": module,
        "mutants": len(verdicts),
        "killed": killed,
        "survived": len(survivors),
        "other": other,  # no tests, skipped, suspicious, segfault
        "score": killed / len(verdicts) if verdicts else float("nan"),
        "minutes": (time.monotonic() - start) / 60,
        "survivors": survivors,
        "verdicts": sorted({v for v in verdicts.values()}),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", help=f"default: {' '.join(DEFAULT)}")
    parser.add_argument("--tests", nargs="+", help="test files (default: MODULES' entry)")
    parser.add_argument("--max-children", type=int, default=1)
    parser.add_argument("--rev", help="mutate this commit (e.g. HEAD), not the working tree")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument(
        "--only",
        nargs="+",
        help="only these mutants (names or fnmatch patterns, e.g. '*Trainer*_gather*')",
    )
    args = parser.parse_args(argv)
    rows = []
    for module in args.modules or DEFAULT:
        tests = args.tests or MODULES.get(module)
        if not tests:
            parser.error(f"no tests known for {module!r}: give them with --tests")
        print(f"mutating transient_nb/{module}.py against {' '.join(tests)}", file=sys.stderr)
        rows.append(run_module(module, tests, args.max_children, args.rev, args.only))
    print("| module | mutants | killed | survived | other | score | minutes |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['module']} | {r['mutants']} | {r['killed']} | {r['survived']} | {r['other']} "
            f"| {r['score']:.0%} | {r['minutes']:.1f} |"
        )
    for r in rows:
        if r["survivors"]:
            print(f"\nsurvivors of {r['module']}: {', '.join(r['survivors'])}", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
