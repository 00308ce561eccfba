"""Run a campaign with one planted bug until a seed fails (issue 26, acceptance 1).

    .venv/bin/python -m tests.raft.sim.find_planted dropped_connection_down --seconds 30

prints one JSON line: the first failing seed, its violations, its trace hash (run twice), the
simulated and wall seconds the campaign took to reach it, and whether the fixed code passes
the same seed and schedule.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

from raft.sim import ROTATE, SimParams, run_seed, seed_params
from raft.sim.network import WIRES
from tests.raft.sim.plants import PLANTS


def main() -> None:
    """Parse the arguments, run the campaign, print the finding."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("plant", choices=sorted(PLANTS))
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--wire", choices=(*WIRES, ROTATE), default=ROTATE)
    args = parser.parse_args()
    params = dataclasses.replace(SimParams(), seconds=args.seconds, wire=args.wire)
    started = time.perf_counter()
    sim_total = 0.0
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        if time.perf_counter() - started > args.minutes * 60:
            break
        with PLANTS[args.plant]():
            result = run_seed(seed, params)
        sim_total += result.sim_seconds
        if result.failed:
            wall = time.perf_counter() - started
            with PLANTS[args.plant]():
                again = run_seed(seed, params)
            fixed = run_seed(seed, params, result.faults)
            row = {
                "plant": args.plant,
                "seed": seed,
                "params": dataclasses.asdict(seed_params(seed, params)),
                "seeds_run": seed - args.first_seed + 1,
                "sim_s_to_find": round(sim_total, 1),
                "wall_s_to_find": round(wall, 1),
                "violations": result.violations[:3],
                "trace_hash": [result.trace_hash, again.trace_hash],
                "fixed_code_passes": not fixed.failed,
                "fixed_violations": fixed.violations[:3],
            }
            print(json.dumps(row))
            return
    print(json.dumps({"plant": args.plant, "found": False, "sim_s": round(sim_total, 1)}))


if __name__ == "__main__":
    main()
