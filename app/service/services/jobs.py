"""Jobs as stored rows: creating one (inputs checked and resolved first), reading, listing, cancelling,
deleting, and the row -> API shape."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import secrets
import threading
import time
import uuid

from sqlalchemy import delete, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, defer

from app.formats.results import FACT_HUGE, FACT_TINY, degenerate_facts
from app.service.core.config import Settings
from app.service.db.models import FINISHED, Job, JobConfig, JobLease, utcnow
from app.service.schemas.jobs import PLAN_FIELDS, RL_FIELDS, JobCreate
from costmodel import ClusterProfile
from costmodel.resilience import ResilienceOptions
from costmodel.result import PARAPLAN_VERSION
from search import SpaceError, build_space, validate_fixed
from search.space import check_pins
from search.samplers import SAMPLERS
from search.frameworks import default_framework
from search.margin import margin_fields, margin_problem

from .errors import field_loc, http_error, invalid, not_found
from .inputs import (GRID_CAP, check_config_ints, check_layout, check_stages, grid_estimate, resolve_cluster,
                     resolve_model)
from .profiles import versioned_cluster
from .studies import optuna_storage, study_name  # noqa: F401 - study_name: also the name callers know here

log = logging.getLogger("paraplan.jobs")

REQUEST_FIELDS = ("model", "cluster", "devices", "global_batch_size", "precision", "moe_load_imbalance",
                  "seq_length")


def _space_error(exc: SpaceError):
    field, reason = exc.field, str(exc).split(": ", 1)[-1]
    if field == "fix":
        return invalid(["body", "search", "fixed"], reason)
    if field.startswith("fix."):
        return invalid(["body", "search", "fixed", *field_loc(field[4:], "")[1:]], reason)
    if field in REQUEST_FIELDS:
        return invalid(["body", field], reason)
    if field == "framework":
        return invalid(["body", "search", "framework"], reason)
    return invalid(["body", "devices"], f"{field}: {reason}")


def _check_caps(body: JobCreate, settings: Settings) -> None:
    s = body.search
    _check_device_cap("devices", body.devices, settings)
    if s.n_trials > settings.max_trials:
        raise invalid(["body", "search", "n_trials"], f"at most {settings.max_trials:,} trials per job "
                                                      "(PARAPLAN_MAX_TRIALS)", "less_than_equal")
    if s.top_k > settings.max_top_k:
        raise invalid(["body", "search", "top_k"], f"at most {settings.max_top_k}", "less_than_equal")
    if s.timeout_s is not None and s.timeout_s > settings.max_timeout_s:
        raise invalid(["body", "search", "timeout_s"], f"at most {settings.max_timeout_s:g} s", "less_than_equal")


def request_hash(body: JobCreate) -> str:
    # the rl fields a body leaves out are not hashed: search and plan bodies hash as before rl jobs existed
    data = {k: v for k, v in body.model_dump(mode="json").items() if not (k in RL_FIELDS and v is None)}
    if data.get("kind") == "search":  # a search body hashes as before plan jobs existed (stored keys still replay)
        data = {k: v for k, v in data.items() if k != "kind" and not (k in PLAN_FIELDS and v is None)}
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _check_training_options(body: JobCreate, profile: ClusterProfile) -> None:
    """What a search and a plan job check alike before a search space is built (422 naming the field): fp8
    needs the profile's FP8 peak, and the margin must fit the device."""
    if body.precision == "fp8" and not profile.has_fp8:
        raise invalid(["body", "precision"], f"fp8 needs an FP8 peak, which profile {profile.name} does not have")
    if (problem := margin_problem(body.search.memory_margin_gib, profile.fact("memory_gib"))) is not None:
        raise invalid(["body", "search", "memory_margin_gib"], problem)


def _training_pins(body: JobCreate, spec, global_batch_size: int) -> dict:
    """``search.fixed`` checked and typed through the config schema (422 naming the field): the pins of a
    search job, or of an rl job's training side."""
    s = body.search
    check_config_ints(s.fixed, ["body", "search", "fixed"])
    check_layout(s.fixed.get("pipeline_layout"), ["body", "search", "fixed", "pipeline_layout"])
    try:
        fixed = validate_fixed(dict(s.fixed), global_batch_size)
    except SpaceError as exc:
        raise _space_error(exc) from None
    check_stages(spec, fixed.get("pp"), fixed.get("vpp"), ["body", "search", "fixed"])
    return fixed


def prepare(body: JobCreate, settings: Settings, profile: ClusterProfile | None = None) -> dict:
    """Check and resolve a job's inputs (the 422s happen here, before anything is stored); ``profile``:
    the cluster already resolved (a profile version, read from the database), else ``body.cluster``'s."""
    if body.kind == "plan":
        return prepare_plan(body, settings, profile)
    if body.kind == "rl":
        return prepare_rl(body, settings, profile)
    for name in ("devices", "global_batch_size"):
        if getattr(body, name) is None:
            raise invalid(["body", name], "Field required (a search job needs it)", "missing")
    _check_caps(body, settings)
    spec = resolve_model(body.model, body.seq_length)
    profile = _job_profile(body, profile)
    s = body.search
    _check_training_options(body, profile)
    fixed = _training_pins(body, spec, body.global_batch_size)
    if grid_estimate(spec, profile, body.devices, fixed, s.allow_cross_domain_tp) > GRID_CAP:
        raise invalid(["body", "devices"], "the search space of this model on this many devices is too large for "
                                           "the service; pin some dimensions with search.fixed")
    _check_pinned_sizes(fixed, body.devices)
    framework = s.framework or default_framework(profile.name)
    try:  # what needs no enumeration of the space
        check_pins(spec, profile, body.devices, body.global_batch_size, precision=body.precision,
                   moe_load_imbalance=body.moe_load_imbalance, fixed=fixed, allow_cross_domain_tp=s.allow_cross_domain_tp,
                   framework=framework)
    except SpaceError as exc:
        raise _space_error(exc) from None
    # The search space is built by the worker that runs the job (seconds for a large MoE model: the request
    # must not wait for it); until then `auto` stays unresolved and the space size unknown, and a space
    # that turns out empty fails the job with its reason (app/service/worker.py).
    engine = s.sampler
    if engine == "exhaustive" and s.parallel_workers > 1:
        raise invalid(["body", "search", "parallel_workers"], "an exhaustive search runs on one worker (it scores "
                                                             "every config in seconds); parallel_workers is for the "
                                                             "samplers tpe, nsga2 and random")
    seed = s.seed if s.seed is not None else secrets.randbelow(2**31)
    search = {**s.model_dump(mode="json"), "fixed": json.loads(json.dumps(fixed, default=str)), "seed": seed,
              "engine": engine, "space_size": None, "framework": framework,
              "parallel_workers": s.parallel_workers if engine != "exhaustive" else 1}
    return {
        "model_spec": spec.model_dump(mode="json"),
        "cluster_name": profile.name,
        "cluster_profile": profile.model_dump(mode="json"),
        "profile_version": profile.version(),
        "devices": body.devices,
        "global_batch_size": body.global_batch_size,
        "precision": body.precision,
        "moe_load_imbalance": body.moe_load_imbalance,
        "search": search,
        "paraplan_version": PARAPLAN_VERSION,
        "trials_total": s.n_trials if engine in SAMPLERS else 0,  # an exhaustive count is known once built
    }


def _check_pinned_sizes(fixed: dict, devices: int) -> None:
    """422 for pinned tp, pp and cp whose product does not divide the device count (no data-parallel size
    is left): the one empty space found without building it; any other turns up in the worker."""
    sizes = {k: fixed[k] for k in ("tp", "pp", "cp") if isinstance(fixed.get(k), int)}
    product = math.prod(sizes.values())
    if sizes and devices % product:
        pins = " × ".join(f"{k} {v}" for k, v in sizes.items())
        raise invalid(["body", "search", "fixed"], f"the pinned {pins} = {product} does not divide the {devices:,} "
                                                   "devices (data parallelism needs a whole number of replicas)")


def _check_device_cap(name: str, devices: int, settings: Settings) -> None:
    """422 at ``["body", name]`` for a device count above the service's cap (PARAPLAN_MAX_DEVICES)."""
    if devices > settings.max_devices:
        raise invalid(["body", name], f"at most {settings.max_devices:,} devices", "less_than_equal")


def _job_profile(body: JobCreate, profile: ClusterProfile | None) -> ClusterProfile:
    """The job's profile: ``profile`` when the caller resolved it (a profile version), else ``body.cluster``'s;
    422 for facts beyond any real device."""
    profile = profile if profile is not None else resolve_cluster(body.cluster)
    _check_facts(profile)
    return profile


def _check_facts(profile: ClusterProfile) -> None:
    """422 naming the first fact of the profile beyond any real device (else ranked configs with null
    times, "feasible")."""
    if bad := degenerate_facts(profile):
        name, value = next(iter(bad.items()))
        raise invalid(["body", "cluster", "facts", name], f"{value:g} is beyond any real device ({FACT_TINY:g} "
                                                         f"to {FACT_HUGE:g}): the evaluations would not be finite")


def plan_request(job_or_body_fields: dict, spec, profile):
    """The planner's request from a plan job's stored options (``search["plan"]``)."""
    from search.capacity import PlanRequest

    o = job_or_body_fields
    return PlanRequest(spec=spec, profile=profile, tokens=o["tokens"], devices_min=o.get("devices_min"),
                       devices_max=o.get("devices_max"), devices_step=o.get("devices_step"),
                       deadline_days=o.get("deadline_days"), price_per_device_hour=o.get("price_per_device_hour"),
                       global_batch_tokens=o.get("global_batch_tokens"), precision=o.get("precision", "bf16"),
                       moe_load_imbalance=o.get("moe_load_imbalance"),
                       memory_margin_gib=o["memory_margin_gib"], framework=o.get("framework"),
                       fixed=o.get("fixed"), resilience=ResilienceOptions.model_validate(o.get("resilience") or {}))


def prepare_plan(body: JobCreate, settings: Settings, profile: ClusterProfile | None = None) -> dict:
    """A plan job's inputs, checked and resolved (422 naming the field): the same checks as ``paraplan plan``;
    ``profile`` as in ``prepare``."""
    from search.capacity import PlanError, device_counts

    if body.tokens is None:
        raise invalid(["body", "tokens"], "Field required (a plan job needs it)", "missing")
    for name in ("devices_min", "devices_max"):
        if (v := getattr(body, name)) is not None:
            _check_device_cap(name, v, settings)
    spec = resolve_model(body.model, body.seq_length)
    profile = _job_profile(body, profile)
    s = body.search
    _check_training_options(body, profile)
    check_config_ints(s.fixed, ["body", "search", "fixed"])  # typed by the planner, per count's batch
    check_layout(s.fixed.get("pipeline_layout"), ["body", "search", "fixed", "pipeline_layout"])
    options = {**{k: getattr(body, k) for k in PLAN_FIELDS}, "precision": body.precision,
               "moe_load_imbalance": body.moe_load_imbalance, "memory_margin_gib": s.memory_margin_gib,
               "framework": s.framework or default_framework(profile.name), "fixed": dict(s.fixed),
               "resilience": s.resilience.model_dump(mode="json")}
    try:
        req = plan_request(options, spec, profile).resolved()
        counts = device_counts(req.devices_min, req.devices_max, req.devices_step,
                               int(profile.fact("devices_per_node")))
    except PlanError as exc:
        raise invalid(["body", exc.field], exc.reason) from None
    except SpaceError as exc:  # a pin search.fixed cannot hold
        raise _space_error(exc) from None
    _check_device_cap("devices_max", req.devices_max, settings)  # the default range's top too
    check_stages(spec, req.fixed.get("pp"), req.fixed.get("vpp"), ["body", "search", "fixed"])
    search = {**s.model_dump(mode="json"), "kind": "plan", "plan": options, "seed": 0, "engine": "plan",
              "space_size": len(counts), "framework": options["framework"], "parallel_workers": 1}
    return {"model_spec": spec.model_dump(mode="json"), "cluster_name": profile.name,
            "cluster_profile": profile.model_dump(mode="json"), "profile_version": profile.version(),
            "devices": counts[-1], "global_batch_size": 0, "precision": body.precision,
            "moe_load_imbalance": body.moe_load_imbalance, "search": search, "paraplan_version": PARAPLAN_VERSION,
            "trials_total": len(counts)}


def rl_workload(body: JobCreate):
    """The rl job's workload from its body: ``paraplan rl``'s defaults (``app.formats.rl.DEFAULTS``) for the
    fields left out; 422 naming the field on ``workload``'s ``InputError``."""
    from app.formats.errors import InputError
    from app.formats.rl import DEFAULTS, workload

    given = {k: getattr(body, k) for k in RL_FIELDS if getattr(body, k) is not None}
    try:
        return workload(**{**DEFAULTS, **given})
    except InputError as exc:
        raise invalid(["body", exc.field], exc.reason) from None


def rl_request(options: dict, devices: int, spec, profile):
    """The RL search request from an rl job's stored options (``search["rl"]``)."""
    from costmodel.rl import Workload
    from search.rl import RLRequest

    return RLRequest(spec=spec, profile=profile, devices=devices, workload=Workload(**options["workload"]),
                     framework=options["framework"], memory_margin_gib=options["memory_margin_gib"],
                     fixed=dict(options.get("fixed", {})), seed=options.get("seed", 0))


def prepare_rl(body: JobCreate, settings: Settings, profile: ClusterProfile | None = None) -> dict:
    """An rl job's inputs, checked and resolved (422 naming the field): the checks of ``paraplan rl``, and the
    service's device cap and search-space bound; ``profile`` as in ``prepare``. Its progress counts training
    searches: the co-located one and one per disaggregated split (``search.rl.run_rl_search``)."""
    from dataclasses import asdict

    from costmodel.hardware import Hardware
    from search.rl import splits

    _check_device_cap("devices", body.devices, settings)
    wl = rl_workload(body)
    spec = resolve_model(body.model)
    profile = _job_profile(body, profile)
    s = body.search
    _check_training_options(body, profile)
    training = spec.model_copy(update={"seq_length": wl.seq_length})
    fixed = _training_pins(body, training, wl.samples)
    if grid_estimate(training, profile, body.devices, fixed, False) > GRID_CAP:
        raise invalid(["body", "devices"], "the training search space of this model on this many devices is too "
                                           "large for the service")
    framework = s.framework or default_framework(profile.name)
    try:  # pins no config on all the devices takes are a 422 now, not a failed job later
        build_space(training, profile, body.devices, wl.samples, fixed=fixed, framework=framework)
    except SpaceError as exc:
        raise _space_error(exc) from None
    options = {"workload": asdict(wl), "memory_margin_gib": s.memory_margin_gib, "framework": framework,
               "fixed": json.loads(json.dumps(fixed, default=str)), "seed": 0 if s.seed is None else s.seed}
    req = rl_request(options, body.devices, spec, profile)
    total = 1 + len(splits(req, Hardware.from_profile(profile)))
    search = {**s.model_dump(mode="json"), "kind": "rl", "rl": options, "seed": options["seed"], "engine": "rl",
              "space_size": total, "framework": options["framework"], "parallel_workers": 1}
    return {"model_spec": spec.model_dump(mode="json"), "cluster_name": profile.name,
            "cluster_profile": profile.model_dump(mode="json"), "profile_version": profile.version(),
            "devices": body.devices, "global_batch_size": wl.samples, "precision": "bf16",
            "moe_load_imbalance": None, "search": search, "paraplan_version": PARAPLAN_VERSION,
            "trials_total": total}


# Idempotency-Keys whose first request is being created in this process: a concurrent duplicate
# is answered 409 at once, without a database round trip, instead of also building the search space and
# holding a pooled connection until its INSERT loses to the first one's. Across processes the unique index
# on (idempotency_scope, idempotency_key) decides and the loser replays the winner's job.
_in_flight: set[tuple[str, str]] = set()
_in_flight_lock = threading.Lock()
IN_FLIGHT_RETRY_S = 1


def _in_progress(key: str):
    return http_error(409, ["header", "Idempotency-Key"], "a request with this Idempotency-Key is still being "
                                                         f"processed; retry in {IN_FLIGHT_RETRY_S} s to get its job",
                      "idempotency_in_progress", headers={"Retry-After": str(IN_FLIGHT_RETRY_S)})


@contextlib.contextmanager
def idempotency_slot(scope: str, key: str | None):
    """Hold ``key``'s slot while its job is created; a 409 ``idempotency_in_progress`` (with Retry-After)
    when another request of this process holds it. No database access: the route takes the slot on the
    event loop, so that a burst of duplicates costs neither threads nor connections."""
    if key is None:
        yield
        return
    slot = (scope, key)
    with _in_flight_lock:
        if slot in _in_flight:
            raise _in_progress(key)
        _in_flight.add(slot)
    try:
        yield
    finally:
        with _in_flight_lock:
            _in_flight.discard(slot)


def create(db: Session, body: JobCreate, settings: Settings, scope: str,
           idempotency_key: str | None) -> tuple[Job, bool]:
    """The new job, owned by ``scope`` (the caller's API-key hash); or, for a replayed Idempotency-Key with
    the same body, the existing one (``True``). A duplicate that arrives while the first request with its
    key is still being created here is a 409 ``idempotency_in_progress`` with ``Retry-After``."""
    with idempotency_slot(scope, idempotency_key):
        return create_in_slot(db, body, settings, scope, idempotency_key)


def create_in_slot(db: Session, body: JobCreate, settings: Settings, scope: str,
                   idempotency_key: str | None) -> tuple[Job, bool]:
    """``create`` for a caller that holds ``idempotency_slot(scope, idempotency_key)``."""
    replay, profile = admit(db, body, settings, scope, idempotency_key)
    if replay is not None:
        return replay, True
    return store(db, body, prepare(body, settings, profile), scope, idempotency_key)


def admit(db: Session, body: JobCreate, settings: Settings, scope: str,
          idempotency_key: str | None) -> tuple[Job | None, ClusterProfile | None]:
    """The database half of a submission before its inputs are resolved: the job a replayed
    Idempotency-Key made (409 for another body), else the queue cap (429) and the profile version the body
    names (None: resolve ``body.cluster``). Ends its reads, so that no connection is held while the inputs
    are resolved and the space is built (CPU work, ``prepare``)."""
    if idempotency_key is not None:
        existing = _by_key(db, scope, idempotency_key)
        if existing is not None:
            db.commit()  # end the read (nothing expires): the connection goes back to the pool
            return _replay(existing, request_hash(body)), None
    _check_queue(db, scope, settings.max_queued_jobs)
    profile = versioned_cluster(db, scope, body.cluster)  # "name@n": the caller's profile version n
    db.commit()
    return None, profile


def store(db: Session, body: JobCreate, fields: dict, scope: str,
          idempotency_key: str | None) -> tuple[Job, bool]:
    """Insert the job ``prepare`` resolved; a concurrent submission of the same Idempotency-Key that won
    the insert is replayed instead (``True``)."""
    digest = request_hash(body)
    now = utcnow()
    job = Job(id=str(uuid.uuid4()), status="queued", created_at=now, updated_at=now,
              request=body.model_dump(mode="json", exclude_unset=True), trials_done=0, cancel_requested=False,
              attempts=0, owner=scope, idempotency_scope=scope if idempotency_key is not None else None,
              idempotency_key=idempotency_key, request_hash=digest, **fields)
    db.add(job)
    try:
        db.commit()
    except IntegrityError:  # the same key, submitted concurrently
        db.rollback()
        existing = _by_key(db, scope, idempotency_key)
        if existing is None:
            raise
        return _replay(existing, digest), True
    log.info("job %s queued", job.id, extra={"job_id": job.id})
    return job, False


def _check_queue(db: Session, scope: str, cap: int) -> None:
    """429 when this API key already has ``cap`` queued jobs. The cap is per key so that one busy client
    cannot lock the others out (without keys every caller shares the scope "" and so one count)."""
    queued = db.scalar(select(func.count()).select_from(Job).where(Job.owner == scope, Job.status == "queued"))
    if queued >= cap:
        raise http_error(429, ["body"], f"this API key already has {queued} queued jobs "
                                        "(PARAPLAN_MAX_QUEUED_JOBS); retry later", "too_many_jobs",
                         headers={"Retry-After": "30"})


def _by_key(db: Session, scope: str, key: str) -> Job | None:
    return db.scalar(select(Job).where(Job.idempotency_scope == scope, Job.idempotency_key == key))


def _replay(job: Job, digest: str) -> Job:
    if job.request_hash != digest:
        raise http_error(409, ["header", "Idempotency-Key"], "this Idempotency-Key was used with another body "
                                                             f"(job {job.id})", "idempotency_conflict")
    return job


# Columns the API never shows (the exact inputs kept for reproduction) or shows on their own route (the
# layouts): not read for the job views.
_HEAVY = (defer(Job.cluster_profile), defer(Job.request), defer(Job.layouts))


def get(db: Session, job_id: str, *, owner: str) -> Job:
    """The job if ``owner`` (the caller's scope) created it; else 404, the same as for an unknown id, so that
    a key cannot even learn that another key's job exists."""
    job = db.scalar(select(Job).options(*_HEAVY).where(Job.id == job_id, Job.owner == owner)) \
        if _is_uuid(job_id) else None
    if job is None:
        raise not_found(job_id)
    return job


def _is_uuid(text: str) -> bool:
    try:
        return str(uuid.UUID(text)) == text.lower()
    except (ValueError, AttributeError, TypeError):
        return False


def list_jobs(db: Session, status: str | None, limit: int, offset: int, *, owner: str) -> tuple[list[Job], int]:
    """A page of ``owner``'s jobs, newest first, and how many of its jobs match."""
    q = select(Job).options(*_HEAVY).where(Job.owner == owner)
    count = select(func.count()).select_from(Job).where(Job.owner == owner)
    if status:
        q, count = q.where(Job.status == status), count.where(Job.status == status)
    total = db.scalar(count)
    rows = db.scalars(q.order_by(Job.created_at.desc(), Job.id).limit(limit).offset(offset)).all()
    return list(rows), int(total)


def best_of(db: Session, jobs: list[Job]) -> dict[str, JobConfig]:
    ids = [j.id for j in jobs if j.status == "succeeded"]
    if not ids:
        return {}
    rows = db.scalars(select(JobConfig).where(JobConfig.job_id.in_(ids), JobConfig.rank == 1)).all()
    return {r.job_id: r for r in rows}


CONFIG_SORTS = {"rank": JobConfig.rank.asc(), "tokens_per_s": JobConfig.tokens_per_s.desc(),
                "mfu": JobConfig.mfu.desc(), "peak_gib": JobConfig.peak_gib.asc()}


def exists(db: Session, job_id: str, *, owner: str) -> None:
    """404 unless ``owner`` has this job (a cheap check: no JSON columns are read)."""
    if not _is_uuid(job_id) or db.scalar(select(Job.id).where(Job.id == job_id, Job.owner == owner)) is None:
        raise not_found(job_id)


def margin_of(db: Session, job_id: str) -> float | None:
    """The memory margin a job ranks with (GiB); None for jobs from before margins."""
    return _margin((db.scalar(select(Job.search).where(Job.id == job_id)) or {}))


def _margin(search: dict) -> float | None:
    value = (search or {}).get("memory_margin_gib")
    return None if value is None else float(value)


def configs(db: Session, job_id: str, limit: int, offset: int, sort: str = "rank", min_mfu: float | None = None,
            max_peak_gib: float | None = None, margin_gib: float | None = None) -> tuple[list[dict], int]:
    """A page of ranked configs (as API dicts, with whether each keeps ``margin_gib``) and how many match."""
    where = [JobConfig.job_id == job_id]
    if min_mfu is not None:
        where.append(JobConfig.mfu >= min_mfu)
    if max_peak_gib is not None:
        where.append(JobConfig.peak_gib <= max_peak_gib)
    rows = db.execute(select(JobConfig.rank, JobConfig.config, JobConfig.evaluation).where(*where)
                      .order_by(CONFIG_SORTS[sort], JobConfig.rank).limit(limit).offset(offset)).all()
    if len(rows) < limit and (rows or offset == 0):
        total = offset + len(rows)  # the last page: no count query needed
    else:
        total = db.scalar(select(func.count()).select_from(JobConfig).where(*where))
    return [ranked_entry(r.rank, r.config, r.evaluation, margin_gib) for r in rows], int(total)


def layouts(db: Session, job_id: str, limit: int, offset: int) -> tuple[list[dict], int]:
    """A page of the job's top layouts (best first) and how many it has; none until it has succeeded."""
    items = db.scalar(select(Job.layouts).where(Job.id == job_id)) or []
    return items[offset:offset + limit], len(items)


def ranked_config(db: Session, job: Job, rank: int) -> JobConfig:
    """Config ``rank`` of a job (already checked to be the caller's); 404 naming the rank when it has none."""
    row = db.scalar(select(JobConfig).where(JobConfig.job_id == job.id, JobConfig.rank == rank))
    if row is None:
        raise http_error(404, ["path", "rank"], f"job {job.id!r} has no config of rank {rank}", "not_found")
    return row


def cancel(db: Session, job: Job) -> Job:
    """Queued or running -> cancelled at once; the worker drops a cancelled job within a second.
    A finished job is returned as it is."""
    if job.status in FINISHED:
        return job
    now = utcnow()
    db.execute(update(Job).where(Job.id == job.id, Job.status.in_(("queued", "running")))
               .values(status="cancelled", cancel_requested=True, finished_at=now, updated_at=now))
    db.execute(delete(JobLease).where(JobLease.job_id == job.id))  # its workers see that at their next beat
    db.commit()
    db.refresh(job)
    log.info("job %s cancelled", job.id, extra={"job_id": job.id})
    return job


STOP_POLL_S = 0.1


def remove(db: Session, job: Job, storage_url: str, stop_within_s: float = 15.0) -> None:
    """Delete a job, its Optuna study included even while it runs: stop its workers
    first (the job becomes ``cancelled``, its workers see that at their next beat and drop their leases;
    wait until no live lease is left, at most ``stop_within_s`` s, after which any lease left would have
    run out anyway), then delete its Optuna study and check that it is gone, then its rows. A study that
    cannot be deleted raises (503 through the API's handler for database errors) and leaves the job
    ``cancelled``, so a retried DELETE finishes the work."""
    now = utcnow()
    db.execute(update(Job).where(Job.id == job.id, Job.status.in_(("queued", "running")))
               .values(status="cancelled", cancel_requested=True, finished_at=now, updated_at=now))
    db.commit()
    waited = _wait_leases_released(db, job.id, stop_within_s)
    delete_study(storage_url, study_name(job.id))
    db.execute(delete(JobLease).where(JobLease.job_id == job.id))
    db.execute(delete(JobConfig).where(JobConfig.job_id == job.id))
    db.execute(delete(Job).where(Job.id == job.id))
    db.commit()
    log.info("job %s deleted (workers stopped after %.1f s)", job.id, waited, extra={"job_id": job.id})


def _wait_leases_released(db: Session, job_id: str, within_s: float) -> float:
    """Seconds until ``job_id`` had no live lease (its workers stopped), at most ``within_s``. Each look is
    its own short transaction, so no connection or snapshot is held while waiting."""
    started = time.monotonic()
    while True:
        live = db.scalar(select(func.count()).select_from(JobLease).where(
            JobLease.job_id == job_id, JobLease.expires_at > utcnow()))
        db.commit()
        waited = time.monotonic() - started
        if not live:
            return waited
        if waited >= within_s:
            log.warning("job %s: %d worker(s) still hold a lease after %.0f s; deleting anyway", job_id, live,
                        waited, extra={"job_id": job_id})
            return waited
        time.sleep(STOP_POLL_S)


class StudyNotDeleted(RuntimeError):
    """Optuna's delete left the study in the storage."""


def delete_study(storage_url: str, name: str) -> None:
    """Drop a job's Optuna study if there is one (Optuna's tables exist only once a study was made), and
    check that the deletion committed: the study's name is no longer in the storage."""
    from sqlalchemy import inspect

    from app.service.db.engine import get_engine

    if "studies" not in inspect(get_engine(storage_url)).get_table_names():
        return
    import optuna

    storage = optuna_storage(storage_url)
    for attempt in range(3):
        try:
            optuna.delete_study(study_name=name, storage=storage)
        except KeyError:  # no such study (an exhaustive job, or deleted by the last attempt)
            pass
        except optuna.exceptions.StorageInternalError:  # e.g. a trial written meanwhile: try again
            if attempt == 2:
                raise
        if not _study_exists(storage, name):
            return
        time.sleep(STOP_POLL_S)
    raise StudyNotDeleted(f"study {name} is still in the storage after 3 deletions")


def _study_exists(storage, name: str) -> bool:
    """Whether the storage holds study ``name`` as committed: one lookup by its (indexed, unique) name, so a
    DELETE costs the same however many studies the database holds (reading every study's summary took
    17 s with 1,464 studies)."""
    try:
        storage.get_study_id_from_name(name)
    except KeyError:
        return False
    return True


def to_out(job: Job, best: JobConfig | None) -> dict:
    """The API's job shape (``JobOut``)."""
    model = {k: v for k, v in job.model_spec.items() if v is not None}
    total = max(int(job.trials_total or 0), 0)
    summary = job.summary
    results = {k: (summary or {}).get(k) for k in ("plan", "rl")}  # a plan or rl job's result, in its summary
    if summary is not None:
        summary = {k: v for k, v in summary.items() if k not in results}
    return {
        "kind": (job.search or {}).get("kind", "search"),
        **results,
        "id": job.id,
        "status": job.status,
        "progress": {"trials_done": min(int(job.trials_done or 0), total), "trials_total": total},
        "best": config_out(best, _margin(job.search)) if best is not None else None,
        "error": job.error,
        "inputs": {"model": model, "cluster": job.cluster_name, "profile_version": job.profile_version,
                   "devices": job.devices, "global_batch_size": job.global_batch_size,
                   "precision": job.precision, "moe_load_imbalance": job.moe_load_imbalance,
                   "search": job.search, "paraplan_version": job.paraplan_version},
        "summary": summary,
        "created_at": job.created_at,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
        "updated_at": job.updated_at,
    }


def config_out(row: JobConfig, margin_gib: float | None = None) -> dict:
    return ranked_entry(row.rank, row.config, row.evaluation, margin_gib)


def ranked_entry(rank: int, config: dict, evaluation: dict, margin_gib: float | None) -> dict:
    """A ranked config as the API shows it: the margin fields come from the stored evaluation's headroom
    and the job's margin (they are not stored: a job from before margins has none)."""
    return {"rank": rank, "config": config, "evaluation": evaluation, **margin_fields(evaluation, margin_gib)}
