"""`quorumq completion SHELL`: how to enable shell completion (click's mechanism)."""

from __future__ import annotations

import click

INSTRUCTIONS = {
    "bash": 'eval "$(_QUORUMQ_COMPLETE=bash_source quorumq)"   # add to ~/.bashrc',
    "zsh": 'eval "$(_QUORUMQ_COMPLETE=zsh_source quorumq)"    # add to ~/.zshrc',
    "fish": "_QUORUMQ_COMPLETE=fish_source quorumq | source   # in fish/completions/quorumq.fish",
}


@click.command("completion")
@click.argument("shell", type=click.Choice(sorted(INSTRUCTIONS)), default="bash")
def completion(shell: str) -> None:
    """Print the line that enables tab completion for SHELL.

    \b
    Example:
      quorumq completion bash >> ~/.bashrc
    """
    click.echo(INSTRUCTIONS[shell])
