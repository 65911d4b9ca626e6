"""A team's measured runs of a shipped cluster and the profile versions refitted on them.

Measurements are validated as a published run is (``app.formats.validation.parse_run``, after the
API's own rules on models and configs: a string is a preset name, never a server path; sizes within
``app/formats/bounds.py``), and must be scorable on the cluster. A version is the shipped profile
refitted on all of the owner's measurements of it by ``app.formats.calibration.refit`` (what
``paraplan calibrate`` runs), stored whole with its hash, numbered 1, 2, ... per owner and cluster;
``"cluster": "name@n"`` in a job or an evaluate names it (``name@0``: the shipped profile). Every
read is scoped to the owner (the API key's hash): another key's measurement or version is a 404 (or
a 422 naming ``cluster`` where a request names it), as if it did not exist.
"""

from __future__ import annotations

import logging
import re
import uuid
from functools import lru_cache

from sqlalchemy import delete, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.formats.calibration import published_runs, refit, score_problem
from app.formats.errors import InputError
from app.formats.validation import Run, parse_run
from app.service.db.models import Measurement, ProfileVersion
from app.service.hostile import clean
from costmodel import ClusterProfile

from .errors import field_loc, http_error, invalid
from .inputs import (check_config_for, check_stages, cluster_names, named_cluster, resolve_cluster,
                     resolve_config, resolve_model)

log = logging.getLogger("paraplan.profiles")
VERSIONED = re.compile(r"^(?P<name>[^@]+)@(?P<number>[0-9]{1,9})$")
NUMBER_RETRIES = 3  # a concurrent refit of the same owner and cluster took the number: take the next


def check_cluster(name: str) -> None:
    """404 naming the path's cluster unless it is a shipped profile."""
    if name not in cluster_names():
        raise http_error(404, ["path", "name"], f"unknown cluster profile {name!r}; known: "
                                                f"{', '.join(sorted(cluster_names()))}", "not_found")


# --- measurements -------------------------------------------------------------------------------------

def checked_run(cluster: str, body: dict) -> dict:
    """The posted run with ``cluster`` filled in, or a 422 naming the field: as a published run, and
    scorable on ``cluster`` (a run the cost model cannot score would count as |error| = 1 in every fit)."""
    if body.get("cluster") not in (None, cluster):
        raise invalid(["body", "cluster"], f"the run was measured on {body['cluster']!r}, but is posted to "
                                           f"cluster {cluster!r} (omit it, or post it to its own cluster)")
    spec = resolve_model(body["model"])
    check_stages(spec, body["config"].get("pp"), body["config"].get("vpp"), ["body", "config"])
    check_config_for(spec, resolve_config(body["config"]))
    data = {k: v for k, v in {**body, "cluster": cluster}.items() if not (k == "source" and v is None)}
    run = _parsed(data)
    if (problem := score_problem(run, named_cluster(cluster))) is not None:
        raise invalid(["body", "config"], problem)
    return data


def _parsed(data: dict) -> Run:
    try:
        run = parse_run(data)
    except InputError as exc:
        raise invalid(field_loc(exc.field), exc.reason) from None
    if run.problem is not None:
        raise invalid(field_loc(run.problem_field or "run"), run.problem.split(": ", 1)[-1])
    return run


def add_measurement(db: Session, owner: str, cluster: str, run: dict, cap: int) -> Measurement:
    """Store ``run`` (already ``checked_run``) as ``owner``'s; 422 once ``cap`` are kept for the cluster."""
    kept = db.scalar(select(func.count()).select_from(Measurement).where(
        Measurement.owner == owner, Measurement.cluster_name == cluster))
    if kept >= cap:
        raise invalid(["path", "name"], f"this API key already keeps {kept} measurements of {cluster} "
                                        "(PARAPLAN_MAX_MEASUREMENTS); delete some first", "too_many_measurements")
    row = Measurement(id=str(uuid.uuid4()), owner=owner, cluster_name=cluster, run=run)
    db.add(row)
    db.commit()
    log.info("measurement %s of %s stored", row.id, cluster)
    return row


def measurement_out(row: Measurement) -> dict:
    # clean: a run stored before bodies were checked may hold lone surrogates (app/service/hostile.py)
    return {"id": row.id, "cluster": row.cluster_name, "created_at": row.created_at, "run": clean(row.run)}


def list_measurements(db: Session, owner: str, cluster: str, limit: int, offset: int) -> tuple[list, int]:
    """A page of ``owner``'s measurements of ``cluster``, oldest first, and how many there are."""
    where = (Measurement.owner == owner, Measurement.cluster_name == cluster)
    total = db.scalar(select(func.count()).select_from(Measurement).where(*where))
    rows = db.scalars(select(Measurement).where(*where).order_by(Measurement.created_at, Measurement.id)
                      .limit(limit).offset(offset)).all()
    return list(rows), int(total)


def get_measurement(db: Session, owner: str, cluster: str, measurement_id: str) -> Measurement:
    row = db.scalar(select(Measurement).where(Measurement.id == measurement_id, Measurement.owner == owner,
                                              Measurement.cluster_name == cluster))
    if row is None:
        raise http_error(404, ["path", "measurement_id"], f"no measurement {measurement_id!r} of {cluster}",
                         "not_found")
    return row


def delete_measurement(db: Session, owner: str, cluster: str, measurement_id: str) -> None:
    row = get_measurement(db, owner, cluster, measurement_id)
    db.execute(delete(Measurement).where(Measurement.id == row.id))
    db.commit()


# --- versions -----------------------------------------------------------------------------------------

def create_version(db: Session, owner: str, cluster: str, max_evals: int,
                   max_run_evals: int = 400_000) -> ProfileVersion:
    """Refit ``cluster``'s shipped profile on all of ``owner``'s measurements of it and store the result
    as the owner's next version. CPU-bound for seconds: the caller runs it off the event loop, in a
    heavy turn. No connection is held during the fit. Each candidate factor set scores every run, so
    ``max_evals`` is lowered to ``max_run_evals`` over the runs: one refit's time stays bounded however
    many measurements a key keeps."""
    rows = db.scalars(select(Measurement).where(Measurement.owner == owner, Measurement.cluster_name == cluster)
                      .order_by(Measurement.created_at, Measurement.id)).all()
    ids, runs = [r.id for r in rows], [parse_run(r.run) for r in rows]
    db.commit()
    if not runs:
        raise invalid(["path", "name"], f"this API key has no measurements of {cluster} to fit on; POST them to "
                                        f"/v1/clusters/{cluster}/measurements first", "no_measurements")
    max_evals = max(1, min(max_evals, max_run_evals // len(runs)))
    start = named_cluster(cluster)
    fitted, report = refit(start, runs, name=cluster, origin=f"{len(runs)} measurements posted to the service",
                           published=_published(cluster), max_evals=max_evals)
    for _ in range(NUMBER_RETRIES):
        number = 1 + (db.scalar(select(func.max(ProfileVersion.number)).where(
            ProfileVersion.owner == owner, ProfileVersion.cluster_name == cluster)) or 0)
        fitted["name"] = f"{cluster}@{number}"
        profile = ClusterProfile.model_validate(fitted)
        pub = report["published"] or {}
        row = ProfileVersion(owner=owner, cluster_name=cluster, number=number, profile=profile.model_dump(mode="json"),
                             profile_version=profile.version(), measurement_ids=ids,
                             mape_before=report["mape_before"], mape_after=report["mape_after"],
                             published_mape_before=pub.get("mape_before"), published_mape_after=pub.get("mape_after"),
                             published_worse=report["published_worse"], fit={**report, "max_evals": max_evals})
        db.add(row)
        try:
            db.commit()
        except IntegrityError:  # the same owner's concurrent refit took this number
            db.rollback()
            continue
        log.info("profile version %s@%d fitted on %d measurements", cluster, number, len(runs))
        return row
    raise http_error(409, ["path", "name"], "concurrent refits of this cluster took every version number tried; "
                                            "retry", "version_conflict")


@lru_cache(maxsize=8)
def _published(cluster: str) -> list[Run]:
    """The published runs of a shipped cluster (read once: the file ships with the project)."""
    return published_runs(cluster)


@lru_cache(maxsize=8)
def _shipped_published(cluster: str) -> dict | None:
    """The published runs' MAPE under the shipped profile (version 0's figures)."""
    from app.formats.calibration import published_figures

    start = named_cluster(cluster)
    return published_figures(start, start.model_dump(mode="json"), _published(cluster))


def shipped_out(cluster: str) -> dict:
    """Version 0: the shipped profile, with the published set's MAPE (unchanged: nothing was fitted)."""
    profile = named_cluster(cluster)
    return {"cluster": cluster, "number": 0, "name": f"{cluster}@0", "profile_version": profile.version(),
            "created_at": None, "measurement_ids": [], "runs": 0, "mape_before": None, "mape_after": None,
            "published": _shipped_published(cluster), "published_worse": False, "factors": {}, "run_errors": [],
            "max_evals": None, "profile": profile.model_dump(mode="json")}


def version_out(row: ProfileVersion) -> dict:
    fit = row.fit or {}
    return {"cluster": row.cluster_name, "number": row.number, "name": f"{row.cluster_name}@{row.number}",
            "profile_version": row.profile_version, "created_at": row.created_at,
            "measurement_ids": row.measurement_ids, "runs": len(row.measurement_ids),
            "mape_before": row.mape_before, "mape_after": row.mape_after, "published": fit.get("published"),
            "published_worse": row.published_worse, "factors": fit.get("factors", {}),
            "run_errors": fit.get("run_errors", []), "max_evals": fit.get("max_evals"), "profile": row.profile}


def list_versions(db: Session, owner: str, cluster: str) -> list[dict]:
    """Version 0 (shipped) and ``owner``'s versions of ``cluster``, oldest first."""
    rows = db.scalars(select(ProfileVersion).where(ProfileVersion.owner == owner,
                                                   ProfileVersion.cluster_name == cluster)
                      .order_by(ProfileVersion.number)).all()
    return [shipped_out(cluster), *(version_out(r) for r in rows)]


def get_version(db: Session, owner: str, cluster: str, number: int) -> dict:
    """Version ``number`` of ``owner``'s ``cluster`` (0: shipped); 404 naming the number otherwise."""
    if number == 0:
        return shipped_out(cluster)
    row = db.get(ProfileVersion, (owner, cluster, number))
    if row is None:
        raise http_error(404, ["path", "number"], f"no version {number} of {cluster}", "not_found")
    return version_out(row)


def versioned_cluster(db: Session, owner: str, value) -> ClusterProfile | None:
    """The profile a request's ``cluster`` names when it is ``"name@n"`` (``owner``'s version n, 0 the
    shipped profile); None for anything else (a plain name or a profile, ``resolve_cluster``'s). An
    unknown cluster or version, or another key's, is a 422 naming ``cluster``."""
    if not isinstance(value, str) or "@" not in value:
        return None
    m = VERSIONED.match(value)
    if m is None or m["name"] not in cluster_names():
        raise invalid(["body", "cluster"], f"{value!r} is not <shipped profile>@<version>; known profiles: "
                                           f"{', '.join(sorted(cluster_names()))}")
    name, number = m["name"], int(m["number"])
    if number == 0:
        return named_cluster(name)
    data = db.scalar(select(ProfileVersion.profile).where(
        ProfileVersion.owner == owner, ProfileVersion.cluster_name == name, ProfileVersion.number == number))
    db.commit()  # end the read: the connection goes back to the pool
    if data is None:
        raise invalid(["body", "cluster"], f"this API key has no version {number} of {name} "
                                           f"(GET /v1/clusters/{name}/versions lists them)")
    return ClusterProfile.model_validate(data)


def resolve_cluster_for(db: Session, owner: str, value) -> ClusterProfile:
    """``resolve_cluster`` that also takes ``"name@n"`` (the owner's profile versions)."""
    return versioned_cluster(db, owner, value) or resolve_cluster(value)


def fit_report(version: dict) -> dict:
    """A version as the calibration report renders it (``refit``'s report); 409 for version 0."""
    if version["number"] == 0:
        raise http_error(409, ["path", "number"], f"version 0 is the shipped {version['cluster']} profile: nothing "
                                                  "was fitted", "no_fit")
    return version
