"""The service's settings, read from the environment in one place.

``DATABASE_URL`` and ``PARAPLAN_API_KEYS`` are the contract's names; every other setting is
``PARAPLAN_<NAME>`` (e.g. ``PARAPLAN_MAX_TRIALS=2000``). docs/reference/settings.md lists them (generated from this class).
"""

from __future__ import annotations

from functools import lru_cache

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.formats.bounds import MAX_DEVICES, MAX_TIMEOUT_S, MAX_TOP_K, MAX_TRIALS


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PARAPLAN_", extra="ignore", populate_by_name=True)

    database_url: str = Field("sqlite:///./paraplan.db",
                              validation_alias=AliasChoices("DATABASE_URL", "PARAPLAN_DATABASE_URL"),
                              description="SQLAlchemy URL of the jobs database (also holds the Optuna studies).")
    api_keys: str = Field("", validation_alias=AliasChoices("PARAPLAN_API_KEYS"),
                          description="Comma-separated keys; when set, /v1 and /metrics need "
                                      "`Authorization: Bearer KEY`.")

    # Caps on what one request may ask for (bad input beyond them is a 4xx, never work). Their upper bounds are
    # the ceilings the OpenAPI document declares (app/service/schemas): a setting can lower a cap, not raise it past those.
    # 10,000 trials and 100,000 devices are the documented floor of what a job may ask for by default.
    max_trials: int = Field(10_000, ge=1, le=MAX_TRIALS, description="Largest search.n_trials a job may ask for.")
    max_top_k: int = Field(100, ge=1, le=MAX_TOP_K, description="Largest search.top_k.")
    max_timeout_s: float = Field(3600.0, gt=0, le=MAX_TIMEOUT_S, description="Largest search.timeout_s.")
    max_devices: int = Field(MAX_DEVICES, ge=1, le=MAX_DEVICES, description="Largest device count.")
    max_body_bytes: int = Field(1_048_576, ge=1024, description="Largest request body (bytes); larger is 413.")
    max_queued_jobs: int = Field(1000, ge=1, description="Queued jobs per API key beyond which that key's "
                                                         "POST /v1/jobs is 429 (one shared count when the "
                                                         "server has no keys).")

    # Database: timeouts and pool. A database that is away or frozen answers 503 within these bounds
    # instead of holding requests; the pool has a connection for every thread that uses one at once.
    db_connect_timeout_s: int = Field(5, ge=1, le=300, description="Seconds to open a database connection "
                                                                   "(PostgreSQL connect_timeout).")
    db_statement_timeout_s: float = Field(30.0, gt=0, le=3600, description="Longest statement (PostgreSQL "
                                                                           "statement_timeout).")
    db_busy_timeout_s: float = Field(30.0, gt=0, le=3600, description="SQLite: how long a writer waits for "
                                                                      "the file's write lock.")
    db_pool_timeout_s: float = Field(10.0, gt=0, le=300, description="Longest wait for a free pooled "
                                                                     "connection.")
    api_threads: int = Field(16, ge=1, le=256, description="Threads that serve the API's blocking routes; the "
                                                           "connection pool holds this many plus the worker's.")
    db_request_timeout_s: float = Field(10.0, gt=0, le=600, description="Longest a request waits for its "
                                                                       "database work (a thread, a connection, "
                                                                       "its queries); after it, 503 with "
                                                                       "Retry-After.")
    ready_timeout_s: float = Field(2.0, gt=0, le=60, description="/readyz answers not ready when the database "
                                                                 "does not answer `SELECT 1` within this.")

    # Heavy evaluates: a deep pipeline's evaluate (more than 256 virtual stages) costs up to a few
    # seconds of CPU and tens of MB; so many at once run that the API's memory stays bounded, the rest wait.
    max_heavy_evaluates: int = Field(2, ge=1, le=64, description="`POST /v1/evaluate` requests of more than 256 "
                                                                 "virtual stages scored at once; others wait.")
    heavy_wait_s: float = Field(30.0, gt=0, le=600, description="Longest wait of a heavy evaluate for its turn; "
                                                                "after it, 503 with Retry-After.")

    # Calibration: a refit scores every measurement of the cluster once per candidate factor set
    # (a population of candidates per call: tens of microseconds per candidate and run on one core), in the heavy turns above; these bound one refit's CPU time.
    max_calibration_evals: int = Field(8000, ge=10, le=100_000, description="Candidate factor sets a profile "
                                                                           "refit scores at most (its default "
                                                                           "and the cap of `max_evals`).")
    max_calibration_run_evals: int = Field(400_000, ge=100, le=10_000_000, description="Run scorings one refit "
                                                                                      "does at most (about a minute "
                                                                                      "on one core): `max_evals` is "
                                                                                      "lowered to this over the "
                                                                                      "number of measurements.")
    max_measurements: int = Field(200, ge=1, le=10_000, description="Measurements one API key may keep per "
                                                                    "cluster (a refit fits on all of them).")

    # Worker.
    lease_s: float = Field(15.0, gt=1, description="A worker's lease on a running job, renewed every half second; "
                                                   "when a worker dies another takes the job this long after.")
    trial_heartbeat_s: int = Field(1, ge=1, description="Optuna's trial heartbeat interval (RDBStorage "
                                                        "heartbeat_interval, whole seconds).")
    trial_grace_s: int = Field(10, ge=1, description="A running trial with no heartbeat for this long is failed and "
                                                     "run again (RDBStorage grace_period, whole seconds).")
    poll_s: float = Field(0.5, gt=0, description="How often an idle worker looks for a queued job.")
    progress_s: float = Field(1.0, gt=0, description="How often a running job's progress is written.")
    max_attempts: int = Field(3, ge=1, description="Losses of a job's workers after which it fails (leases found run out "
                                                   "in one look count once: a database outage is one loss).")
    embedded_worker: bool = Field(True, description="`paraplan serve` runs a worker thread beside the API.")
    worker_jobs: int = Field(1, ge=1, le=1024, description="Processes a worker runs an exhaustive search, a plan "
                                                            "or an RL job on (`--jobs` of the CLI; "
                                                            "docs/concepts/parallel.md); 1: in the worker itself.")

    # Fair shares across API keys (app/service/fair_share.py).
    max_workers_per_key: int = Field(0, ge=0, description="Workers one API key's jobs hold at once (0: no cap).")
    max_running_jobs_per_key: int = Field(0, ge=0, description="Jobs of one API key running at once (0: no cap).")
    fair_yield_s: float = Field(3.0, gt=0, le=3600, description="A queued job of another key that has waited this "
                                                                "long takes a worker from a key holding at least "
                                                                "two more (the worker leaves a shared job).")

    @staticmethod
    def variable(field: str) -> str:
        """The environment variable a setting is read from (``worker_jobs`` -> ``PARAPLAN_WORKER_JOBS``)."""
        alias = Settings.model_fields[field].validation_alias if field in Settings.model_fields else None
        return alias.choices[0] if isinstance(alias, AliasChoices) else f"PARAPLAN_{field.upper()}"

    @property
    def pool_size(self) -> int:
        """Connections in the service engine's pool: one per API thread, one for the routes on the event
        loop, and four for the embedded worker (its loop, the lease heartbeat, the metrics, a spare)."""
        return self.api_threads + 5

    @property
    def api_key_list(self) -> list[str]:
        return [k.strip() for k in self.api_keys.split(",") if k.strip()]


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
