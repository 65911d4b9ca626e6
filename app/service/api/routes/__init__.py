"""Route modules: ``jobs``, ``evaluate``, ``catalog``, ``health``."""
