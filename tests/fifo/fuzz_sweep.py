"""Run the fuzzer over many seeds for given machine versions; print one JSON line per version.

    nice -n 10 python tests/fifo/fuzz_sweep.py --seeds 200 --steps 5000 --versions 1 2 3 4

Counts runs, steps and violations (a `rejected:` reply and an exception out of apply count);
lists the first violations with their reproduce line; one JSON line per seed on stderr as it
goes. Not a test: the suite's budget is small.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import fifo.fuzz


def sweep(version: int, seeds: int, steps: int, first_seed: int) -> dict[str, object]:
    """Fuzz `seeds` seeds of one version; the counts and the first violations."""
    started = time.monotonic()
    violations: list[dict[str, object]] = []
    steps_run = 0
    for seed in range(first_seed, first_seed + seeds):
        result = fifo.fuzz.run(seed, steps, version)
        steps_run += result.steps_run
        line = {"version": version, "seed": seed, "steps_run": result.steps_run,
                "violations": [v.invariant for v in result.violations]}  # fmt: skip
        print(json.dumps(line), file=sys.stderr, flush=True)  # progress: one line per seed
        for violation in result.violations:
            if len(violations) < 20:
                violations.append(
                    {
                        "seed": seed,
                        "invariant": violation.invariant,
                        "step": violation.step,
                        "reproduce": result.reproduce,
                    }
                )
    return {"version": version, "seeds": seeds, "steps": steps, "steps_run": steps_run,
            "violations": len(violations), "first": violations,
            "seconds": round(time.monotonic() - started, 1)}  # fmt: skip


def main() -> None:
    """Parse arguments and run the sweep."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--versions", type=int, nargs="+", default=[1, 2, 3, 4])
    args = parser.parse_args()
    for version in args.versions:
        print(json.dumps(sweep(version, args.seeds, args.steps, args.first_seed)), flush=True)


if __name__ == "__main__":
    main()
