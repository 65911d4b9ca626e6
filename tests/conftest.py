"""Shared fixtures of the cost-model tests: presets, profiles, profiles with chosen factors, and a
seeded sampler of training configs (valid and invalid) for the invariant and batch tests.

Hand-worked tests never read efficiency factors or facts from the shipped YAML files (another
engineer calibrates them): they build a profile with ``make_profile`` and every number they use set
explicitly, so that the expected values can be written as arithmetic in the test.

The suite runs in parallel (``scripts/test``: pytest-xdist, one worker per core and one more), so a test
must not share a file, a port or a database with another: write under ``tmp_path``, start servers on ``free_port()``
(``service_util.Server`` does), and take PostgreSQL databases from ``postgres_url`` / ``database_url`` (a
new database per test). A test that measures time or progress under load (a latency bound, a worker that
must advance beside CPU-bound processes) is marked ``@pytest.mark.serial``: the serial tests run one after
another on one worker. tests/README.md says more.
"""

from __future__ import annotations

import functools
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

import hardware_profiles
import model_presets
from costmodel.spec import RECOMPUTE_MODULES, ClusterProfile, ModelSpec, TrainingConfig

# ------------------------------------------------------------------------------------------------
# running in parallel

SERIAL_GROUP = "serial"
# Seconds each module took in a whole run (PARAPLAN_STORE_DURATIONS=1 scripts/test rewrites it): only the order
# in which the workers take modules up, longest first, so that no long module starts last and runs alone.
DURATIONS_FILE = Path(__file__).with_name("durations.json")


def _group(item) -> str:
    """The xdist group of a test: its own ``xdist_group`` mark if it has one (modules that share an
    in-process cache name one group), ``serial`` for the serial-marked, else its module, so that a module's
    ``scope="module"`` fixtures (servers, searches) are built once, on the one worker that runs the module.

    The PostgreSQL-marked tests are serial too: they share the one server ``scripts/test`` starts, and some
    of them take it away (SIGSTOP of the whole server, connections held on their database), which a test of
    another module running beside them would see as its own failure."""
    if (mark := item.get_closest_marker("xdist_group")) is not None:
        return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
    serial = item.get_closest_marker("serial") or item.get_closest_marker("postgres")
    return SERIAL_GROUP if serial else item.nodeid.split("::")[0]


def _tag(item, group: str) -> None:
    """Puts ``item`` in xdist group ``group`` as ``--dist loadgroup`` reads it: the suffix ``@group`` on its
    node id. pytest-xdist's own ``xdist_group`` handling sets ``item._nodeid``, which pytest >= 9.2 no longer
    reads (the id comes from ``item._id``), so every test would be scheduled alone; this sets both."""
    tagged = f"{str(item.nodeid).split('@')[0]}@{group}"
    item._nodeid = tagged
    if hasattr(item, "_id"):
        from _pytest.nodeid import NodeId

        item._id = NodeId.parse(tagged)


@pytest.hookimpl(trylast=True)  # after xdist's own hook, whose tag this replaces
def pytest_collection_modifyitems(config, items):
    """Groups every test (``_group``) on an xdist worker run with ``--dist loadgroup``: a worker takes a
    whole group and runs it in order, so no two serial tests overlap. Groups are queued longest first: the
    serial group, then the others by their modules' seconds in DURATIONS_FILE (scripts/test passes
    ``--no-loadscope-reorder`` so that xdist keeps this order)."""
    try:
        module_s = json.loads(DURATIONS_FILE.read_text())
    except (OSError, ValueError):
        module_s = {}
    groups = [(_group(item), str(item.nodeid).split("::")[0]) for item in items]
    group_s: dict[str, float] = {}
    for group, module in dict.fromkeys(groups):  # each module once
        group_s[group] = group_s.get(group, 0.0) + module_s.get(module, 0.0)
    order = sorted(range(len(items)), key=lambda i: (groups[i][0] != SERIAL_GROUP, -group_s[groups[i][0]], groups[i][0]))
    tag = hasattr(config, "workerinput") and config.getvalue("loadgroup")
    if tag:
        for i in order:
            _tag(items[i], groups[i][0])
    items[:] = [items[i] for i in order]


_MODULE_S: dict[str, float] = {}  # this run's seconds per module, when PARAPLAN_STORE_DURATIONS is set


def _storing(config) -> bool:
    """Whether this process adds up durations: the xdist controller (it sees every worker's reports) or a
    run without workers; never a worker."""
    return bool(os.environ.get("PARAPLAN_STORE_DURATIONS")) and not hasattr(config, "workerinput")


def pytest_runtest_logreport(report):
    """Adds each test's setup, call and teardown seconds to its module's."""
    module = report.nodeid.split("::")[0]
    _MODULE_S[module] = _MODULE_S.get(module, 0.0) + report.duration


def pytest_sessionfinish(session):
    """With PARAPLAN_STORE_DURATIONS=1 (run the whole suite), writes the modules' seconds to DURATIONS_FILE."""
    if _storing(session.config) and _MODULE_S:
        DURATIONS_FILE.write_text(json.dumps({k: round(v, 1) for k, v in sorted(_MODULE_S.items())}, indent=1)
                                  + "\n")


# ------------------------------------------------------------------------------------------------
# presets and profiles


@functools.lru_cache(maxsize=None)
def load_preset(name: str) -> ModelSpec:
    return model_presets.load(name)


@functools.lru_cache(maxsize=None)
def load_profile(name: str) -> ClusterProfile:
    return hardware_profiles.load(name)


@pytest.fixture(scope="session")
def preset():
    """``preset("tiny-dense")`` -> the shipped ModelSpec (cached)."""
    return load_preset


@pytest.fixture(scope="session")
def profile():
    """``profile("nvidia-h100-80gb")`` -> the shipped ClusterProfile (cached, calibrated if it is)."""
    return load_profile


def build_profile(base: str = "nvidia-h100-80gb", efficiency: dict | None = None,
                  facts: dict | None = None) -> ClusterProfile:
    """A profile that starts from ``base`` with the given efficiency factors and facts (plain numbers)
    through the dict path of ``hardware_profiles.load``. Checks that every value took effect, so that
    a calibration file merged over the priors cannot silently change a hand-worked test."""
    data: dict = {"base": base}
    if efficiency:
        data["efficiency"] = {k: {"value": v, "source": "test override"} for k, v in efficiency.items()}
    if facts:
        data["facts"] = {k: {"value": v, "source": "test override"} for k, v in facts.items()}
    prof = hardware_profiles.load(data)
    for k, v in (efficiency or {}).items():
        assert prof.efficiency[k].value == v, f"efficiency {k} override did not take effect"
    for k, v in (facts or {}).items():
        assert prof.facts[k].value == v, f"fact {k} override did not take effect"
    return prof


@pytest.fixture(scope="session")
def make_profile():
    """``make_profile(base=..., efficiency={...}, facts={...})`` -> ClusterProfile."""
    return build_profile


# A switched scale-up domain (NVSwitch-like) with round numbers, used by the hand-worked tests.
ROUND_FACTS = {
    "peak_bf16_tflops": 1000.0, "peak_fp8_tflops": 2000.0, "memory_gib": 80.0,
    "hbm_bandwidth_gbps": 2000.0, "devices_per_node": 8, "scale_up_domain": 8,
    "scale_up_bandwidth_gbps": 400.0, "scale_out_bandwidth_gbps": 50.0,
    "scale_up_latency_us": 5.0, "scale_out_latency_us": 10.0, "framework_overhead_gib": 4.0,
}
ROUND_EFFICIENCY = {
    "gemm_eff_max": 0.8, "gemm_half_gflop": 2.0, "attn_eff": 0.5, "fp8_gemm_eff_ratio": 0.75,
    "hbm_eff": 0.8, "scale_up_bw_eff": 0.75, "scale_out_bw_eff": 0.8, "tp_overlap": 0.6,
    "ep_overlap": 0.7, "dp_overlap": 0.9, "layer_overhead_us": 50.0, "softmax_gscores_per_s": 3900.0,
    "moe_gemm_eff_ratio": 1.0, "pp_chunk_overhead_us": 0.0,
    # the hand-worked effects are each alone: no straggler wait (tests/test_stragglers.py has it)
    "straggler_cv": 0.0,
}


@pytest.fixture(scope="session")
def round_profile():
    return build_profile("nvidia-h100-80gb", efficiency=ROUND_EFFICIENCY, facts=ROUND_FACTS)


# ------------------------------------------------------------------------------------------------
# random training configs


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _random_layout(rng: np.random.Generator, spec: ModelSpec, stages: int) -> str:
    """A Megatron pipeline layout with ``stages`` virtual stages; sometimes with an empty stage."""
    cuts = np.sort(rng.integers(0, spec.num_layers + 1, size=stages - 1))
    counts = np.diff(np.concatenate([[0], cuts, [spec.num_layers]]))
    parts = ["t" * int(c) for c in counts]
    parts[0] = "E" + parts[0]
    parts[-1] = parts[-1] + "m" * spec.mtp_num_layers + "L"
    return "|".join(parts)


def sample_config(rng: np.random.Generator, spec: ModelSpec, devices: int, *, p_wild: float = 0.15,
                  allow_fp8: bool = True, **fixed) -> TrainingConfig:
    """One random config for ``spec`` on ``devices`` devices. Most draws aim at a valid config (sizes
    chosen among divisors); a fraction ``p_wild`` draws sizes freely (mostly invalid). Keyword
    arguments fix fields."""
    wild = rng.random() < p_wild
    pick = lambda xs: xs[int(rng.integers(len(xs)))]  # noqa: E731
    L = spec.num_layers
    heads = math.gcd(spec.num_attention_heads, spec.query_groups)
    if wild:
        tp, pp, cp = pick([1, 2, 3, 4, 8, 16]), pick([1, 2, 3, 4, 8, 16]), pick([1, 2, 3, 4])
        vpp = pick([1, 2, 3, 4])
    else:
        tp = pick([d for d in divisors(heads) if d <= 8 and devices % d == 0])
        rest = devices // tp
        cp = pick([c for c in (1, 1, 1, 2, 4) if rest % c == 0 and spec.seq_length % (2 * c * tp) == 0])
        rest //= cp
        pp = pick([p for p in divisors(rest) if p <= min(L, 16)])
        vpp = 1 if pp == 1 else pick([1, 1, 2, 3, 4])
        if pp * vpp > L:
            vpp = 1
    dp = max(devices // (tp * pp * cp), 1)
    dense_rank = tp * cp * dp
    if spec.is_moe:
        if wild:
            ep, etp = pick([1, 2, 3, 4, 8, 16, 64]), pick([1, 2, 4])
        else:
            etp = pick([e for e in (1, 1, 1, 2, 4) if dense_rank % e == 0])
            ep = pick([e for e in divisors(math.gcd(spec.num_experts, dense_rank // etp)) if e <= 64])
    else:
        ep, etp = (pick([1, 2]), 1) if wild else (1, 1)
    mbs = pick([1, 1, 2, 4])
    m = pick([1, 2, 4, 8, 16])
    gbs = mbs * dp * m if not wild else int(rng.integers(1, 4 * mbs * dp + 2))
    recompute = pick(["none", "none", "selective", "full"])
    kw = dict(tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=etp, micro_batch_size=mbs, global_batch_size=gbs,
              recompute=recompute)
    if recompute == "selective" and rng.random() < 0.7:
        k = int(rng.integers(0, 4))
        kw["recompute_modules"] = sorted(rng.choice(RECOMPUTE_MODULES, size=k, replace=False).tolist())
    if recompute == "full" and rng.random() < 0.4:
        kw["recompute_num_layers"] = int(rng.integers(1, 4))
    if rng.random() < 0.1:
        kw["dp"] = dp if rng.random() < 0.5 else dp + 1
    sp = rng.random()
    if sp < 0.15:
        kw["sequence_parallel"] = False
    elif sp < 0.3:
        kw["sequence_parallel"] = True
    for flag in ("tp_comm_overlap", "moe_a2a_overlap"):
        kw[flag] = bool(rng.random() < 0.5)
    for flag in ("distributed_optimizer", "overlap_grad_reduce", "overlap_param_gather"):
        kw[flag] = bool(rng.random() < 0.8)
    if allow_fp8 and rng.random() < 0.2:
        kw["precision"] = "fp8"
    if spec.is_moe and rng.random() < 0.6:
        kw["moe_load_imbalance"] = float(rng.uniform(1.0, 2.0))
    split = rng.random()
    if split < 0.1 and pp > 1:
        kw["first_stage_layers"] = int(rng.integers(0, max(L // pp, 1) + 1))
        if rng.random() < 0.5:
            kw["last_stage_layers"] = int(rng.integers(0, max(L // pp, 1) + 1))
    elif split < 0.2:
        kw["account_for_embedding_in_pipeline_split"] = bool(rng.random() < 0.7)
        kw["account_for_loss_in_pipeline_split"] = bool(rng.random() < 0.7)
    elif split < 0.3:
        kw["pipeline_layout"] = _random_layout(rng, spec, pp * vpp)
    elif split < 0.4 and pp > 1 and vpp == 1:
        kw["pipeline_schedule"] = pick(["dualpipe", "dualpipev"])
    kw.update(fixed)
    return TrainingConfig(**kw)


@pytest.fixture(scope="session")
def sampler():
    """``sampler(rng, spec, devices, **fixed)`` -> a random TrainingConfig (see ``sample_config``)."""
    return sample_config


# ------------------------------------------------------------------------------------------------
# comparing result dicts


def assert_same_result(a, b, rel=1e-9, path="result"):
    """Recursive equality of two result dicts: floats to ``rel``, everything else exactly."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"{path}: keys {sorted(a)} != {sorted(b)}"
        for k in a:
            assert_same_result(a[k], b[k], rel, f"{path}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), f"{path}: {a!r} != {b!r}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_result(x, y, rel, f"{path}[{i}]")
    elif isinstance(a, float) and not isinstance(a, bool):
        assert isinstance(b, (int, float)) and not isinstance(b, bool), f"{path}: {a!r} != {b!r}"
        assert b == pytest.approx(a, rel=rel, abs=1e-300), f"{path}: {a!r} != {b!r}"
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


@pytest.fixture(scope="session")
def same_result():
    return assert_same_result


# ------------------------------------------------------------------------------------------------
# databases: SQLite files and a fresh database on the PostgreSQL server that scripts/test starts


@pytest.fixture
def postgres_url():
    """A new, empty PostgreSQL database (a SQLAlchemy URL), dropped after the test. Skipped when the
    server is not there, unless PARAPLAN_REQUIRE_POSTGRES is set (scripts/test): then it fails."""
    import os
    import uuid

    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    admin = os.environ.get("PARAPLAN_TEST_POSTGRES_URL")
    if not admin:
        if os.environ.get("PARAPLAN_REQUIRE_POSTGRES"):
            pytest.fail("PARAPLAN_REQUIRE_POSTGRES is set but PARAPLAN_TEST_POSTGRES_URL is not")
        pytest.skip("needs the PostgreSQL server that scripts/test starts (PARAPLAN_TEST_POSTGRES_URL)")
    name = f"paraplan_{uuid.uuid4().hex[:12]}"
    engine = create_engine(admin, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(admin).set(database=name).render_as_string(hide_password=False)
    yield url
    from app.service.db.engine import get_engine

    get_engine(url).dispose()
    with engine.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    engine.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request, tmp_path):
    """The same test on a SQLite file and on a PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'paraplan.db'}"
    return request.getfixturevalue("postgres_url")
