"""ParaPlan's user-facing layer: the command line (and, later, the HTTP service)."""
