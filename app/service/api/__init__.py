"""The HTTP API: thin route modules (``routes/``) over ``app.service.services``."""
