"""The ``paraplan`` command line: ``main.py`` (evaluate, search, validate and the group), ``commands/``
(serve, worker, submit, report, export), ``console.py`` (terminal output). ``python -m app.cli`` runs it."""

from .main import main  # noqa: F401 - ``app.cli:main``, the entry point older installs' scripts name
