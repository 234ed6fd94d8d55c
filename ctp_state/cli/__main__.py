"""``python -m ctp_state.cli``: the ``ctp`` command."""

from ctp_state.cli import main

main()
