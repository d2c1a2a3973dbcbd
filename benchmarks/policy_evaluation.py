"""The transient-aware policy against static and reactive clusters, on the paper emulation.

Runs real worker processes on the local backend with paced GPU step times and PS capacity
(:mod:`transient_nb.experiments.evaluation`): for each preemption trace (calm, the paper's curves, a storm
near the start-up time), the static configurations (revoked workers not replaced), the reactive
one (replaced) and the policy with each goal (a deadline, a budget, cost per step), at the
paper's prices. Prints one row per run and the issue's three verdicts per trace.

Examples::

    python benchmarks/policy_evaluation.py                     # every trace (~25 min, 2 cores)
    python benchmarks/policy_evaluation.py --traces storm      # one trace
    python benchmarks/policy_evaluation.py --dynamic           # 1 K80 the policy may grow to 4
    python benchmarks/policy_evaluation.py --plateau --ps 20   # a PS slower than the paper's
    python benchmarks/policy_evaluation.py --tiny              # smoke configuration (CI)
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import fmt, log, md_table, quiet


def main(argv: list[str] | None = None) -> int:
    from transient_nb.deploy.arg_types import Renamed

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="seconds-long smoke configuration")
    parser.add_argument("--traces", nargs="+", default=["calm", "paper", "storm"])
    parser.add_argument("--steps", type=int, default=640, help="global steps standing for 64K")
    parser.add_argument(
        "--wall-pace", type=float, default=0.4, help="wall steps/s per paper step/s"
    )
    parser.add_argument("--deadline", type=float, default=None, help="deadline goal, hours")
    parser.add_argument("--budget", type=float, default=None, help="budget goal, dollars")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--goals",
        nargs="+",
        choices=["deadline", "budget", "cost-per-step"],
        default=["deadline", "budget", "cost-per-step"],
        help="the policy's goals to run",
    )
    parser.add_argument(
        "--no-static", action="store_true", help="leave out the static clusters (reactive only)"
    )
    parser.add_argument(
        "--ps",
        type=float,
        default=None,
        help="the emulated PS's capacity in global steps/s (default: the paper's 45); the "
        "policy's planner still starts from the paper's and must measure the difference",
    )
    parser.add_argument(
        "--dynamic",
        action="store_true",
        help="only the paper's dynamic experiment: 1 K80 that the policy may grow to 4",
    )
    parser.add_argument(
        "--plateau",
        action="store_true",
        help="only the PS bottleneck: 8 V100 (and 8 K80) on one PS against a policy that may "
        "add a PS shard",
    )
    parser.add_argument(
        "--memory",
        default=None,
        help="the policy's memory file: it plans its first configuration and its rounds from "
        "what earlier runs (of this script or any other) saw, and adds what it sees",
    )
    # --memory's old name, for one release.
    parser.add_argument("--history", dest="memory", action=Renamed, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    quiet()
    os.environ.setdefault("TRANSIENT_NB_STRICT_EVENTS", "1")
    import pandas as pd

    from transient_nb.experiments import evaluation

    deadline = evaluation.DEADLINE_H if args.deadline is None else args.deadline
    budget = evaluation.BUDGET if args.budget is None else args.budget
    goals = [g for g in evaluation.goals(deadline, budget) if g["goal"] in args.goals]
    static, reactive = () if args.no_static else evaluation.STATIC, (evaluation.REACTIVE,)
    if args.tiny:
        args.traces, args.steps, args.wall_pace = ["calm"], 120, 1.2
        # One static run to compare with, and the two goals test_policy.py does not run for
        # real (it runs a deadline): every goal has a real run in CI.
        static, reactive, goals = static[1:2], (), goals[1:]
    trials = evaluation.trials(
        args.traces, static=static, reactive=reactive, policy_goals=goals, memory=args.memory
    )
    if args.dynamic:
        trials = evaluation.dynamic_trials()
    if args.plateau:
        trials = evaluation.plateau_trials()
    t0, rows = time.time(), []
    for i, trial in enumerate(trials):
        log(f"[{i + 1}/{len(trials)}] {trial.trace}: {trial.label} ({trial.setup.label})")
        rows.append(
            evaluation.run_trial(
                trial,
                steps=args.steps,
                wall_pace=args.wall_pace,
                seed=args.seed,
                emulate="paper" if args.ps is None else f"paper,ps={args.ps:g}",
            )
        )
        log(f"    {rows[-1]}")  # a run's figures as soon as it has them
    table = pd.DataFrame(rows)
    cols = ["trace", "run", "start", "end", "shards", "ps_zone", "changes", "zones", "hours"]
    cols += ["cost"]
    cols += ["steps_per_dollar"]
    cols += ["revocations", "behind", "failed"]
    for c in cols:
        if c not in table:
            table[c] = ""
    print(
        md_table(
            [c.replace("_", " ") for c in cols],
            [
                [fmt(v, 3) if isinstance(v, float) else ("" if pd.isna(v) else v) for v in r]
                for r in table[cols].astype(object).values.tolist()
            ],
        )
    )
    print()
    print(
        f"seed {args.seed}, {args.steps} steps standing for 64K, wall pace {args.wall_pace}, "
        f"deadline {deadline} h, budget ${budget:.2f}, paper-2019 prices, "
        f"{time.time() - t0:.0f} s. Hours and cost are of the whole 64K-step run, from the "
        "moment every first trainer runs; 'end' is the mix at the end (a policy changes it)."
    )
    if not args.plateau:  # the plateau trials have deadlines of their own (below)
        for line in evaluation.verdicts(table, deadline, budget):
            print(f"- {line}")
    if args.dynamic and (table["failed"] == "").all():
        static, grown = table.iloc[0], table.iloc[1]
        print(
            f"- dynamic: the policy grown from 1 K80 is {1 - grown['hours'] / static['hours']:.1%} "
            f"faster and {1 - grown['cost'] / static['cost']:.1%} cheaper than static 1 K80 "
            "(the paper, growing on a schedule: 40.8% and 21.5%)"
        )
    if args.plateau and (table["failed"] == "").all():
        for i in range(0, len(table), 2):  # (static, policy) pairs, as plateau_trials orders
            static, policy, goal = table.iloc[i], table.iloc[i + 1], trials[i + 1].goal
            print(
                f"- plateau, {static['run']} on one PS against a policy with a deadline of "
                f"{goal['deadline']}: it ended with {policy['end']} on {policy['shards']} PS "
                f"shard(s), {policy['hours']:.3f} h for ${policy['cost']:.2f}, against "
                f"{static['hours']:.3f} h for ${static['cost']:.2f}"
            )
    if (pd.to_numeric(table["behind"], errors="coerce").fillna(0) > 0).any():
        print("WARNING: this host could not keep the emulated pace in some runs (see 'behind').")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
