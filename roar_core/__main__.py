"""`python -m roar_core`: the same as the `roar-core` console script."""

from roar_core.cli.entry import main

main()
