"""``python -m app.cli``: the ``paraplan`` command line."""

from .main import main

main()
