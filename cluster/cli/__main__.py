"""`python -m cluster.cli ...`: the `quorumq` CLI without the console script (spawns nodes)."""

from cluster.cli.main import main

if __name__ == "__main__":
    main()
