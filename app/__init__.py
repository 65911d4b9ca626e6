"""ParaPlan's user-facing layer, above ``costmodel`` (the analytical model) and ``search`` (the config
space and its engines), in three rooms:

* ``app.cli``: the ``paraplan`` command line (``main.py``, ``commands/`` for serve/worker/submit/report/
  export, ``console.py`` for the terminal);
* ``app.service``: the HTTP service (``main.py``: the FastAPI app; ``api/``, ``schemas/``, ``db/``,
  ``services/``, ``core/``) and its job worker (``worker.py``);
* ``app.formats``: what ParaPlan reads and writes (model/cluster/config input and its bounds, Hugging Face
  ``config.json``, evaluation results, launch arguments, the HTML report, run validation).

Imports go one way: ``cli`` and ``service`` use ``formats``; ``formats`` uses neither; ``cli`` starts the
service only inside its serve/worker commands.
"""
