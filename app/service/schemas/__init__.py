"""Pydantic request/response models of the HTTP API (apart from the SQLAlchemy tables in ``app.service.db``)."""
