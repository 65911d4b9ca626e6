"""Service plumbing shared by the API and the worker: settings (``config``)."""
