"""Optuna's RDB storage with fewer round trips for the trials this process runs.

Optuna's ``_CachedStorage`` (the wrapper ``optuna.create_study`` puts around an ``RDBStorage``) caches
finished trials only, so each trial a worker runs costs about 16 transactions and reads: the trial is
read back after ``ask``, every ``suggest_*`` is its own transaction (7 per trial here), the constraint
and the ``worker`` attribute are one each, and ``tell`` reads the trial twice before and after writing
its state. On SQLite that was 12 s of a 21 s 200-trial Pangu job (tests/test_service_e2e.py allows the
job 30 s over HTTP). :class:`OwnTrialsStorage` keeps the running trials this process asked in memory,
since no one else writes them (another worker may only fail one that looks stale; that is seen at the
next write, as before):

* reads of an own running trial are served from memory;
* its parameters are kept until :meth:`OwnTrialsStorage.write_params` writes each trial's in one
  transaction (the sampler calls it once a round is suggested, before scoring: a worker that dies
  while scoring leaves its trials' parameters, which the stale-trial retry runs again);
  Until then other readers (another worker, or a sampler with ``constant_liar``, which reads running
  trials from the database) see the trial without them; ParaPlan's TPE runs without the liar;
* its attributes are written with its state and values in one transaction, so that another worker
  never reads a finished trial without its constraint (Optuna's own rule: a trial's writes land
  before its state does).

This reaches into Optuna's RDB internals (the ``_without_commit`` helpers, ``models``); the Optuna
version is pinned to the minor release it was written against (pyproject.toml), and
tests/test_trial_writes.py compares what lands in the database with what plain Optuna writes.
"""

from __future__ import annotations

import copy
import datetime as dt
import threading
from collections.abc import Sequence
from typing import Any

from optuna import distributions
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import RDBStorage
from optuna.storages._cached_storage import _CachedStorage
from optuna.storages._rdb import models
from optuna.storages._rdb.storage import _create_scoped_session
from optuna.trial import FrozenTrial, TrialState


class OwnTrialsStorage(_CachedStorage):
    """``_CachedStorage`` over ``backend`` that holds this process's running trials in memory (see the
    module docstring). Trials of other processes go through the plain cached storage."""

    def __init__(self, backend: RDBStorage) -> None:
        super().__init__(backend)
        self._own: dict[int, FrozenTrial] = {}  # trial id -> this process's view of its own trial
        self._params: dict[int, list[tuple[str, float, distributions.BaseDistribution]]] = {}
        self._attrs: dict[int, list[tuple[type, str, Any]]] = {}
        self._own_lock = threading.Lock()

    # ---- taking a trial -------------------------------------------------------------------------
    def create_new_trial(self, study_id: int, template_trial: FrozenTrial | None = None) -> int:
        trial_id = super().create_new_trial(study_id, template_trial)
        frozen = self._cached(trial_id)
        if frozen.state == TrialState.RUNNING:  # asked by this process (a WAITING retry or enqueue is not)
            with self._own_lock:
                self._own[trial_id] = copy.deepcopy(frozen)
        return trial_id

    def set_trial_state_values(self, trial_id: int, state: TrialState, values: Sequence[float] | None = None) -> bool:
        if trial_id in self._own:
            self._finish(trial_id, state, values)
            return True
        taken = super().set_trial_state_values(trial_id, state=state, values=values)
        if taken and state == TrialState.RUNNING:  # a waiting trial (a retry, an enqueued one) is now ours
            frozen = self._backend.get_trial(trial_id)
            with self._own_lock:
                self._own[trial_id] = frozen
        return taken

    def _cached(self, trial_id: int) -> FrozenTrial:
        study_id, number = self._trial_id_to_study_id_and_number[trial_id]
        return self._studies[study_id].trials[number]

    # ---- reads ----------------------------------------------------------------------------------
    def get_trial(self, trial_id: int) -> FrozenTrial:
        own = self._own.get(trial_id)
        return copy.deepcopy(own) if own is not None else super().get_trial(trial_id)

    # ---- writes kept until the round is suggested, or the trial finishes ------------------------
    def set_trial_param(self, trial_id: int, param_name: str, param_value_internal: float,
                        distribution: distributions.BaseDistribution) -> None:
        own = self._own.get(trial_id)
        if own is None or own.state.is_finished():
            return super().set_trial_param(trial_id, param_name, param_value_internal, distribution)
        study_id, _ = self._trial_id_to_study_id_and_number[trial_id]
        known = self._studies[study_id].param_distribution.get(param_name)
        if known is not None:  # what Optuna checks at once is still checked at once
            distributions.check_distribution_compatibility(known, distribution)
        with self._own_lock:
            self._params.setdefault(trial_id, []).append((param_name, param_value_internal, distribution))
            own.params = {**own.params, param_name: distribution.to_external_repr(param_value_internal)}
            own.distributions = {**own.distributions, param_name: distribution}

    def set_trial_user_attr(self, trial_id: int, key: str, value: Any) -> None:
        if not self._keep_attr(trial_id, models.TrialUserAttributeModel, key, value):
            super().set_trial_user_attr(trial_id, key, value)

    def set_trial_system_attr(self, trial_id: int, key: str, value) -> None:
        if not self._keep_attr(trial_id, models.TrialSystemAttributeModel, key, value):
            super().set_trial_system_attr(trial_id, key, value)

    def _keep_attr(self, trial_id: int, model_cls: type, key: str, value: Any) -> bool:
        own = self._own.get(trial_id)
        if own is None or own.state.is_finished():
            return False
        with self._own_lock:
            self._attrs.setdefault(trial_id, []).append((model_cls, key, value))
            if model_cls is models.TrialUserAttributeModel:
                own.user_attrs = {**own.user_attrs, key: value}
            else:
                own.system_attrs = {**own.system_attrs, key: value}
        return True

    def write_params(self) -> None:
        """Write the kept parameters of every own running trial, one transaction per trial. A trial
        finished meanwhile by another worker (failed as stale) raises nothing here: it is dropped, and
        its ``tell`` finds it finished."""
        with self._own_lock:
            pending, self._params = self._params, {}
        for trial_id, params in pending.items():
            try:
                with _create_scoped_session(self._backend.scoped_session) as session:
                    trial = models.TrialModel.find_or_raise_by_id(trial_id, session)
                    self._backend.check_trial_is_updatable(trial_id, trial.state)
                    self._write_params(session, trial_id, params)
            except UpdateFinishedTrialError:
                with self._own_lock:
                    self._own.pop(trial_id, None)
                    self._attrs.pop(trial_id, None)
            except Exception:
                with self._own_lock:  # kept for the trial's tell, which writes them with its state
                    self._params[trial_id] = params + self._params.get(trial_id, [])
                raise

    def _write_params(self, session, trial_id: int, params) -> None:
        """Add the parameter rows (the caller checked that the trial is updatable). What Optuna's
        ``_set_trial_param_without_commit`` does, without reading the trial again for every row."""
        study_id, _ = self._trial_id_to_study_id_and_number[trial_id]
        seen = self._studies[study_id].param_distribution
        for name, value, dist in params:
            if name not in seen:  # the study's first use of this name here: check it against the stored one
                self._backend._set_trial_param_without_commit(session, trial_id, name, value, dist)  # noqa: SLF001
                seen[name] = dist
                continue
            distributions.check_distribution_compatibility(seen[name], dist)
            session.add(models.TrialParamModel(trial_id=trial_id, param_name=name, param_value=value,
                                               distribution_json=distributions.distribution_to_json(dist)))

    def _finish(self, trial_id: int, state: TrialState, values: Sequence[float] | None) -> None:
        """The trial's kept parameters and attributes, its values and its state, in one transaction;
        raises ``UpdateFinishedTrialError`` when another worker finished it first (as Optuna does)."""
        with self._own_lock:
            params, attrs = self._params.pop(trial_id, []), self._attrs.pop(trial_id, [])
            own = self._own.pop(trial_id)
        with _create_scoped_session(self._backend.scoped_session) as session:
            trial = models.TrialModel.find_or_raise_by_id(trial_id, session, for_update=True)
            self._backend.check_trial_is_updatable(trial_id, trial.state)
            self._write_params(session, trial_id, params)
            for model_cls, key, value in attrs:
                self._backend._set_trial_attr_without_commit(session, model_cls, trial_id, key, value)  # noqa: SLF001
            for objective, value in enumerate(values or ()):
                self._backend._set_trial_value_without_commit(session, trial, objective, value)  # noqa: SLF001
            now = dt.datetime.now()
            trial.state = state
            if state.is_finished():
                trial.datetime_complete = now
        if not state.is_finished():
            return
        own.state, own.values, own.datetime_complete = state, list(values) if values is not None else None, now
        with self._lock:  # the finished trial as the cache will read it back, without a read
            study_id, number = self._trial_id_to_study_id_and_number[trial_id]
            info = self._studies[study_id]
            if not info.trials[number].state.is_finished():
                info.trials[number] = own
