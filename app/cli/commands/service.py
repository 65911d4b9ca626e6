"""``paraplan serve`` (the HTTP API with an embedded worker) and ``paraplan worker`` (a worker alone).

Both read ``DATABASE_URL`` (default ``sqlite:///./paraplan.db``), refuse a damaged SQLite file (exit 1,
``app/service/db/integrity.py``) and upgrade the database to the newest schema on start. Both log to stderr, one JSON object per line by default (``--log-format text`` for
people); uvicorn's own lines go through the same handler. Heavy imports happen inside the commands so
that ``paraplan evaluate`` stays fast.
"""

from __future__ import annotations

import logging
import signal
import sys

import click

LOG_LEVELS = click.Choice(["debug", "info", "warning", "error"])
LOG_FORMATS = click.Choice(["json", "text"])


def _settings():
    from pydantic import ValidationError

    from app.service.core.config import Settings, get_settings

    try:
        return get_settings()
    except ValidationError as exc:
        err = exc.errors()[0]
        name = '.'.join(map(str, err['loc']))
        click.echo(f"error: setting {name} ({Settings.variable(name)}): {err['msg']}", err=True)
        sys.exit(2)


def _check_database(url: str) -> None:
    """Refuse to start on a damaged SQLite file (exit 1 with what SQLite found)."""
    from app.service.db.integrity import DatabaseDamaged, check_sqlite_file

    try:
        check_sqlite_file(url)
    except DatabaseDamaged as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535), help="Port to listen on.")
@click.option("--no-worker", is_flag=True, help="Serve the API only (run `paraplan worker` beside it).")
@click.option("--access-log/--no-access-log", default=False, show_default=True,
              help="Also write uvicorn's access log (the service already logs one line per request, with its "
                   "request id).")
@click.option("--log-level", type=LOG_LEVELS, default="info", show_default=True)
@click.option("--log-format", type=LOG_FORMATS, default="json", show_default=True,
              help="One JSON object per line, or plain text.")
def serve(host, port, no_worker, access_log, log_level, log_format) -> None:
    """Run the HTTP service (Swagger UI at /docs) with an embedded worker."""
    import uvicorn

    from app.service.core.logging import configure_logging
    from app.service.main import create_app

    configure_logging(log_level, log_format)
    settings = _settings()
    _check_database(settings.database_url)
    app = create_app(settings, run_worker=settings.embedded_worker and not no_worker)
    # log_config=None: uvicorn keeps its hands off logging, and its loggers propagate to our handler
    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=access_log, log_config=None,
                timeout_graceful_shutdown=5)


@click.command()
@click.option("--log-level", type=LOG_LEVELS, default="info", show_default=True)
@click.option("--log-format", type=LOG_FORMATS, default="json", show_default=True,
              help="One JSON object per line, or plain text.")
def worker(log_level, log_format) -> None:
    """Run a worker alone against DATABASE_URL (jobs are claimed one at a time under a lease)."""
    from app.service.core.logging import configure_logging
    from app.service.db.migrate import upgrade
    from app.service.worker import Worker

    configure_logging(log_level, log_format)
    settings = _settings()
    _check_database(settings.database_url)
    upgrade(settings.database_url)
    w = Worker(settings)

    def stop(signum, _frame):
        logging.getLogger("paraplan.worker").info("signal %d: stopping", signum)
        w.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    w.run_forever()
