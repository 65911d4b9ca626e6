"""Service commands of the ``paraplan`` CLI: ``serve``, ``worker`` (``service``) and ``submit`` (``submit``)."""

from .service import serve, worker
from .submit import submit

__all__ = ["serve", "submit", "worker"]
