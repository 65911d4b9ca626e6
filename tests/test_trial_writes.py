"""search.trial_writes.OwnTrialsStorage writes what plain Optuna writes, in fewer transactions.

The same seeded study is run through Optuna's own cached RDB storage and through OwnTrialsStorage on two
real SQLite files; every trial read back from each file (state, values, parameters, distributions, user
and system attributes) must be the same. The cases where the in-memory view could go stale are run
against the database: a trial failed by another worker meanwhile, a waiting (retried) trial taken by
``ask``, parameters written before scoring.
"""

from __future__ import annotations

import optuna
import pytest
from optuna.storages import RDBStorage
from optuna.trial import TrialState
from sqlalchemy import create_engine, event, text

from search.samplers import make_sampler
from search.trial_writes import OwnTrialsStorage

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _run(storage, n: int = 40) -> None:
    study = optuna.create_study(storage=storage, study_name="s", direction="maximize",
                                sampler=make_sampler("tpe", 3))  # the search's own TPE (20 startup trials)
    study.enqueue_trial({"tp": 4, "pp": 2})
    for _ in range(n // 4):  # rounds of 4, as run_sampler asks them
        trials = [study.ask() for _ in range(4)]
        for t in trials:
            tp = t.suggest_categorical("tp", [1, 2, 4, 8])
            pp = t.suggest_categorical("pp", [1, 2, 4])
            if pp > 1:
                t.suggest_int("vpp", 1, 4)
        if hasattr(storage, "write_params"):
            storage.write_params()
        for t in trials:
            t.set_constraint("memory_over_capacity_gib", float(t.params["tp"] * t.params["pp"] < 4))
            t.set_user_attr("worker", "w1")
            study.tell(t, float(t.params["tp"] * 10 + t.params["pp"]))


def _read(url: str) -> list[tuple]:
    study = optuna.load_study(study_name="s", storage=url)
    return [(t.number, t.state, t.values, t.params, t.distributions, t.user_attrs, t.system_attrs)
            for t in study.get_trials(deepcopy=False)]


def test_the_database_holds_what_plain_optuna_writes(tmp_path):
    plain, own = f"sqlite:///{tmp_path / 'plain.db'}", f"sqlite:///{tmp_path / 'own.db'}"
    statements = {}
    for url, wrap in ((plain, lambda rdb: rdb), (own, OwnTrialsStorage)):
        rdb = RDBStorage(url)
        statements[url] = 0

        def counted(*_, url=url):
            statements[url] += 1

        event.listen(rdb.engine, "before_cursor_execute", counted)
        _run(wrap(rdb))
    a, b = _read(plain), _read(own)
    assert statements[own] < 0.6 * statements[plain], statements  # the point of it: fewer round trips
    assert len(a) == 40 and all(t[1] == TrialState.COMPLETE for t in a)
    assert a == b
    assert a[0][3] == {"tp": 4, "pp": 2, "vpp": a[0][3]["vpp"]}  # the enqueued trial kept its fixed params


@pytest.fixture
def own_study(tmp_path):
    """(URL, OwnTrialsStorage, a study on it) on a new SQLite file."""
    url = f"sqlite:///{tmp_path / 'q.db'}"
    storage = OwnTrialsStorage(RDBStorage(url))
    return url, storage, optuna.create_study(storage=storage, study_name="s")


def test_params_land_before_scoring_and_reads_come_from_memory(own_study):
    url, storage, study = own_study
    t = study.ask()
    t.suggest_float("x", 0.0, 1.0)
    t.set_user_attr("worker", "w1")
    engine = create_engine(url)

    def count(table: str) -> int:
        with engine.connect() as conn:
            return conn.execute(text(f"SELECT COUNT(*) FROM {table}")).scalar()

    assert count("trial_params") == 0 and storage.get_trial(t._trial_id).params == {"x": t.params["x"]}
    storage.write_params()
    assert count("trial_params") == 1  # a worker dying now leaves the parameters its retry runs again
    assert count("trial_user_attributes") == 0  # attributes land with the state, in one transaction
    study.tell(t, 1.0)
    assert count("trial_user_attributes") == 1
    assert optuna.load_study(study_name="s", storage=url).trials[0].user_attrs == {"worker": "w1"}


def test_a_trial_failed_by_another_worker_stays_failed(own_study):
    url, storage, study = own_study
    t = study.ask()
    t.suggest_float("x", 0.0, 1.0)
    RDBStorage(url).set_trial_state_values(t._trial_id, TrialState.FAIL)  # another worker found it stale
    storage.write_params()  # dropped, no error; the trial is read from the database from now on
    assert study.tell(t, 1.0, skip_if_finished=True).state == TrialState.FAIL

    u = study.ask()  # failed before anything of it was written: its tell is refused, as Optuna refuses it
    u.suggest_float("x", 0.0, 1.0)
    RDBStorage(url).set_trial_state_values(u._trial_id, TrialState.FAIL)
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):
        study.tell(u, 1.0, skip_if_finished=True)
    assert [t.state for t in optuna.load_study(study_name="s", storage=url).trials] == [TrialState.FAIL] * 2


def test_a_waiting_retry_is_taken_as_its_own_trial_with_its_params(own_study):
    url, storage, study = own_study
    study.enqueue_trial({"x": 0.25})
    assert study.trials[0].state == TrialState.WAITING  # a waiting trial is nobody's yet
    t = study.ask()
    assert t.suggest_float("x", 0.0, 1.0) == 0.25
    study.tell(t, 2.0)
    back = optuna.load_study(study_name="s", storage=url).trials[0]
    assert (back.state, back.params, back.value) == (TrialState.COMPLETE, {"x": 0.25}, 2.0)
