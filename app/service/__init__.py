"""The HTTP service: ``main.py`` (``create_app``: the FastAPI app), ``api/`` (routes),
``schemas/``, ``db/`` (engine, models, migrations), ``services/`` (the logic behind the routes), ``core/``
(settings, logging) and ``worker.py`` (the job worker)."""
