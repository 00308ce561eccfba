"""Deterministic simulation of a whole quorumq cluster: the real replica code (RaftNode over
pysyncobj, group commit, durable journal, snapshots, pre-vote) in one process, on a virtual
clock, a simulated network and a crash/power-loss disk; see raft/sim/README.md.

`run_seed(seed, SimParams())` runs one seed and returns its `SimResult` (trace hash, checker
violations, queue verdict); `shrink` makes a failing schedule shorter.
"""

from raft.sim.faults import Fault, encode_faults, parse_faults
from raft.sim.run import (
    ROTATE,
    SimParams,
    SimResult,
    reproduce_command,
    run_seed,
    seed_params,
    shrink,
)

__all__ = [
    "ROTATE",
    "Fault",
    "SimParams",
    "SimResult",
    "encode_faults",
    "parse_faults",
    "reproduce_command",
    "run_seed",
    "seed_params",
    "shrink",
]
