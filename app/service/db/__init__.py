"""The jobs database: engine and sessions (``engine``), tables (``models``), migrations (``migrate``)."""
