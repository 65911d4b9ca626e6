"""The search: its space against a brute-force reference, pinning, seeds, engines and the CLI."""

import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import optuna
import pytest

import hardware_profiles
import model_presets
from costmodel import ConfigBatch, TrainingConfig, evaluate_batch
from search import SearchRequest, SpaceError, build_space, run_search, validate_fixed
from search.exhaustive import run_exhaustive
from search.space import (CP_VALUES, ETP_VALUES, MBS_VALUES, SPLIT_BALANCED, SPLIT_DUALPIPE, SPLIT_DUALPIPEV,
                          SPLIT_EVEN, SPLIT_FIRST_LAST, SPLIT_SLOTS, _split_fields, divisors)

optuna.logging.set_verbosity(optuna.logging.WARNING)
ROOT = Path(__file__).resolve().parents[1]


CANON_FIELDS = {"tp": 1, "pp": 1, "vpp": 1, "cp": 1, "ep": 1, "etp": 1, "micro_batch_size": 1,
                "global_batch_size": None, "sequence_parallel": None, "tp_comm_overlap": False,
                "recompute": "none", "recompute_modules": None, "recompute_num_layers": None, "offload_modules": None,
                "distributed_optimizer": True, "first_stage_layers": None, "last_stage_layers": None,
                "account_for_embedding_in_pipeline_split": False, "account_for_loss_in_pipeline_split": False,
                "pipeline_layout": None, "pipeline_schedule": None, "overlap_grad_reduce": True, "overlap_param_gather": True, "moe_a2a_overlap": False, "moe_a2a_algorithm": "hierarchical", "cp_comm_type": "p2p"}


def _canon(cfg: dict) -> tuple:
    return tuple((k, json.dumps(cfg.get(k, d))) for k, d in CANON_FIELDS.items())


def _space_configs(space) -> list:
    rows, opts = np.nonzero(space._option_mask())
    return [_canon(space.config(int(r), int(o))) for r, o in zip(rows, opts)]


def _brute_force(spec, profile, devices, gbs) -> set:
    """Every combination of the documented value sets that the cost model calls valid: layouts are
    checked one by one through the pydantic path, then crossed with every option they allow."""
    domain = int(profile.fact("scale_up_domain"))
    heads_gcd = int(np.gcd(spec.num_attention_heads, spec.query_groups))
    recompute = build_space(spec, profile, devices, gbs).values["recompute"]  # the documented module sets
    layouts = []
    for tp, cp, pp, vpp, mode, ep, etp, mbs in itertools.product(
            [t for t in divisors(heads_gcd) if t <= domain], CP_VALUES,
            [p for p in divisors(devices) if p <= spec.num_layers], range(1, 9),
            (SPLIT_EVEN, SPLIT_SLOTS, SPLIT_FIRST_LAST, SPLIT_BALANCED, SPLIT_DUALPIPEV, SPLIT_DUALPIPE), divisors(spec.num_experts) if spec.is_moe else [1],
            ETP_VALUES if spec.is_moe else (1,), MBS_VALUES):
        split = None if (vpp > 1 and pp == 1) else _split_fields(spec, pp, vpp, mode)
        if split is not None:
            # DualPipe splits reduce gradients after the step (MindSpeed refuses the overlap with DualPipeV)
            off = {"overlap_grad_reduce": False, "overlap_param_gather": False}
            split = {**split, **off} if "pipeline_schedule" in split else split
            layouts.append({"tp": tp, "cp": cp, "pp": pp, "vpp": vpp, "ep": ep, "etp": etp,
                            "micro_batch_size": mbs, "global_batch_size": gbs, "sequence_parallel": tp > 1, **split})
    models = [TrainingConfig.model_validate(c) for c in layouts]
    valid = evaluate_batch(spec, profile, devices, ConfigBatch.from_configs(models)).valid
    out = set()
    for lay in itertools.compress(layouts, valid):
        # the dominated off values of the flags are not offered (docs/search.md); the all-to-all
        # overlap costs memory, so both of its values are offered where there is a dispatch (ep > 1)
        a2a_values = (False, True) if lay["ep"] > 1 else (False,)
        for rec, algo, a2a in itertools.product(recompute, _algorithms(spec, lay, domain), a2a_values):
            out.add(_canon({**lay, **rec.fields(), **algo, "distributed_optimizer": True,
                            "tp_comm_overlap": lay["tp"] > 1, "moe_a2a_overlap": a2a}))
    return out


def _algorithms(spec, lay, domain) -> list[dict]:
    """The documented algorithm values of one layout: both dispatches where the EP group (ep ranks etp
    apart) spans several scale-up domains; with cp > 1 the ring, the K/V all-gather, Ulysses when the heads
    divide by cp·tp, and Ulysses inside the domain with a ring across when that is neither of the others."""
    tp, cp, ep, etp = lay["tp"], lay["cp"], lay["ep"], lay["etp"]
    a2a = ["hierarchical", "flat"] if ep > max(domain // etp, 1) else ["hierarchical"]
    kinds = ["p2p"]
    if cp > 1:
        kinds.append("allgather")
        if spec.num_attention_heads % (cp * tp) == 0:
            kinds.append("a2a")
        inside = int(np.gcd(cp, max(domain // tp, 1)))
        if 1 < inside < cp and spec.num_attention_heads % (inside * tp) == 0:
            kinds.append("a2a+p2p")
    return [{"moe_a2a_algorithm": a, "cp_comm_type": k} for a in a2a for k in kinds]


@pytest.mark.parametrize("model,devices,gbs", [("tiny-dense", 8, 32), ("tiny-moe", 8, 16), ("tiny-mla-moe", 16, 32)])
def test_space_matches_brute_force(model, devices, gbs):
    spec, profile = model_presets.load(model), hardware_profiles.load("nvidia-h100-80gb")
    space = build_space(spec, profile, devices, gbs)
    offered = _space_configs(space)
    assert len(set(offered)) == len(offered) == space.size  # no duplicates in the enumeration
    assert set(offered) == _brute_force(spec, profile, devices, gbs)


def test_space_offers_only_valid_configs():
    spec, profile = model_presets.load("tiny-mla-moe"), hardware_profiles.load("ascend-910b")
    space = build_space(spec, profile, 32, 64)
    for _, _, batch in space.batches(50_000):
        br = evaluate_batch(spec, profile, 32, batch)
        assert br.valid.all()
        assert (batch.tp <= 8).all()  # inside the Atlas 800T A2 node


def test_fixing_a_dimension_is_honoured():
    spec, profile = model_presets.load("tiny-moe"), hardware_profiles.load("nvidia-h100-80gb")
    fixed = validate_fixed({"tp": 2, "recompute": "full", "moe_a2a_overlap": False}, 64)
    res = run_search(SearchRequest(spec=spec, profile=profile, devices=16, global_batch_size=64,
                                   sampler="exhaustive", top_k=5, fixed=fixed))
    assert res["top"]
    for entry in res["top"]:
        assert entry["config"]["tp"] == 2 and entry["config"]["recompute"] == "full"
        assert entry["config"]["moe_a2a_overlap"] is False
    full = build_space(spec, profile, 16, 64)
    pinned = build_space(spec, profile, 16, 64, fixed=fixed)
    assert 0 < pinned.size < full.size


def test_bad_fix_names_the_field():
    with pytest.raises(SpaceError, match="fix.tp"):
        validate_fixed({"tp": 0}, 64)
    with pytest.raises(SpaceError, match="fix.nonsense"):
        validate_fixed({"nonsense": 1}, 64)
    spec, profile = model_presets.load("tiny-moe"), hardware_profiles.load("nvidia-h100-80gb")
    with pytest.raises(SpaceError, match="fix"):
        build_space(spec, profile, 16, 64, fixed={"tp": 3})


@pytest.mark.parametrize("sampler", ["tpe", "random", "nsga2"])
def test_same_seed_same_result(sampler):
    spec, profile = model_presets.load("tiny-moe"), hardware_profiles.load("nvidia-h100-80gb")
    runs = [run_search(SearchRequest(spec=spec, profile=profile, devices=16, global_batch_size=64,
                                     sampler=sampler, n_trials=60, top_k=5, seed=7)) for _ in range(2)]
    assert runs[0]["history"] == runs[1]["history"]
    assert [e["config"] for e in runs[0]["top"]] == [e["config"] for e in runs[1]["top"]]
    other = run_search(SearchRequest(spec=spec, profile=profile, devices=16, global_batch_size=64,
                                     sampler=sampler, n_trials=60, top_k=5, seed=8))
    assert other["history"] != runs[0]["history"]


def test_exhaustive_finds_the_best_of_an_independent_scoring():
    """The ranked best is the maximum over every valid config scored one by one."""
    spec, profile = model_presets.load("tiny-dense"), hardware_profiles.load("nvidia-a100-80gb")
    res = run_search(SearchRequest(spec=spec, profile=profile, devices=8, global_batch_size=32,
                                   sampler="exhaustive", top_k=3))
    space = build_space(spec, profile, 8, 32)
    rows, opts = np.nonzero(space._option_mask())
    configs = [TrainingConfig.model_validate(space.config(int(r), int(o))) for r, o in zip(rows, opts)]
    br = evaluate_batch(spec, profile, 8, ConfigBatch.from_configs(configs))
    best = np.max(np.where(br.feasible, br.tokens_per_s, -np.inf))
    assert res["best"]["evaluation"]["tokens_per_s"] == pytest.approx(best, rel=1e-12)
    # every config is covered; an offload plan is scored only where its counterpart without offload does
    # not keep the margin (elsewhere it repeats it, slower or as fast): the feasible configs scored
    base = np.asarray(space.offload_counterpart)[opts]
    at = {(int(r), int(o)): i for i, (r, o) in enumerate(zip(rows, opts))}
    margin = SearchRequest(spec=spec, profile=profile, devices=8, global_batch_size=32).memory_margin_gib
    keeps = br.feasible & ((br.capacity_bytes - br.peak_bytes) / 2**30 >= margin)
    scored = [base[i] == opts[i] or not keeps[at[(int(rows[i]), int(base[i]))]] for i in range(len(rows))]
    assert sum(base != opts) > 0 and not all(scored)  # the space has offload plans, and some are not scored
    # the plain full scan scores exactly those; the search's bounded scan may decide some of them unscored
    # (counted as pruned), so it counts as many feasible configs scored or fewer, and covers the space
    plain = run_exhaustive(space, 3, margin_gib=margin, prune=False)
    assert plain.trials == space.size and plain.feasible_trials == int((br.feasible & np.array(scored)).sum())
    assert res["trials"] == space.size and res["feasible_trials"] <= plain.feasible_trials
    assert res["configs_scored"] + res["configs_pruned"] + res["configs_dominated"] == space.size


def test_ranked_top_is_unique_feasible_and_sorted():
    spec, profile = model_presets.load("tiny-mla-moe"), hardware_profiles.load("nvidia-h100-80gb")
    for sampler in ("exhaustive", "tpe"):
        res = run_search(SearchRequest(spec=spec, profile=profile, devices=16, global_batch_size=64,
                                       sampler=sampler, n_trials=120, top_k=8, seed=1))
        configs = [json.dumps(e["config"], sort_keys=True) for e in res["top"]]
        assert len(configs) == len(set(configs))
        assert all(e["evaluation"]["feasible"] for e in res["top"])
        tps = [e["evaluation"]["tokens_per_s"] for e in res["top"]]
        assert tps == sorted(tps, reverse=True)
        assert [e["rank"] for e in res["top"]] == list(range(1, len(res["top"]) + 1))
        assert res["trials"] >= res["feasible_trials"]


def test_tpe_reaches_the_exhaustive_optimum_on_a_small_case():
    spec, profile = model_presets.load("tiny-moe"), hardware_profiles.load("nvidia-h100-80gb")
    exact = run_search(SearchRequest(spec=spec, profile=profile, devices=16, global_batch_size=64,
                                     sampler="exhaustive", top_k=1))
    tpe = run_search(SearchRequest(spec=spec, profile=profile, devices=16, global_batch_size=64,
                                   sampler="tpe", n_trials=300, top_k=1, seed=0))
    assert tpe["best"]["evaluation"]["tokens_per_s"] >= 0.95 * exact["best"]["evaluation"]["tokens_per_s"]


def test_nsga2_returns_a_pareto_front():
    spec, profile = model_presets.load("tiny-moe"), hardware_profiles.load("nvidia-h100-80gb")
    res = run_search(SearchRequest(spec=spec, profile=profile, devices=16, global_batch_size=64,
                                   sampler="nsga2", n_trials=150, top_k=5, seed=2))
    front = res["pareto"]
    assert front
    for a in front:  # nobody on the front is dominated by another member
        assert not any(b["tokens_per_s"] >= a["tokens_per_s"] and b["memory_headroom_gib"] >= a["memory_headroom_gib"]
                       and (b["tokens_per_s"], b["memory_headroom_gib"]) != (a["tokens_per_s"], a["memory_headroom_gib"])
                       for b in front)


def test_study_lives_in_the_given_storage(tmp_path):
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    spec, profile = model_presets.load("tiny-dense"), hardware_profiles.load("nvidia-h100-80gb")
    run_search(SearchRequest(spec=spec, profile=profile, devices=8, global_batch_size=32, sampler="random",
                             n_trials=30, seed=1, storage=url, study_name="paraplan-test"))
    study = optuna.load_study(study_name="paraplan-test", storage=url)
    assert len(study.trials) == 30


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "app.cli", *args], capture_output=True, text=True, cwd=ROOT)


def test_cli_search_json_shape():
    proc = _cli("search", "--model", "tiny-moe", "--cluster", "nvidia-h100-80gb", "--devices", "16",
                "--global-batch-size", "64", "--sampler", "tpe", "--trials", "40", "--seed", "3", "--top", "3", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert set(out) >= {"inputs", "best", "top", "history", "engine", "space_size", "trials", "feasible_trials",
                        "search_time_s"}
    assert out["inputs"]["cluster"] == "nvidia-h100-80gb" and out["inputs"]["devices"] == 16
    assert out["engine"] == "tpe" and out["trials"] == 40 and len(out["history"]) == 40
    assert out["best"] == out["top"][0] and out["best"]["rank"] == 1


def test_cli_search_exits_3_when_nothing_fits():
    proc = _cli("search", "--model", "llama3-405b", "--cluster", "nvidia-h100-80gb", "--devices", "8",
                "--global-batch-size", "64", "--json")
    assert proc.returncode == 3
    out = json.loads(proc.stdout)
    assert out["best"] is None and out["top"] == []
    assert "no config fits in 80 GiB: the smallest peak found is" in proc.stderr


def test_cli_search_bad_input_exits_2():
    proc = _cli("search", "--model", "tiny-moe", "--cluster", "nvidia-h100-80gb", "--devices", "16",
                "--global-batch-size", "64", "--fix", "recompute=sometimes")
    assert proc.returncode == 2 and "fix.recompute" in proc.stderr and "Traceback" not in proc.stderr


# ---- the communication algorithms as searched dimensions ------------------------------------------

MULTI_NODE_EP = ("tiny-mla-moe", "nvidia-h100-80gb", 32, 64)  # 16 experts, 8 GPUs per NVLink domain


def _algorithm_by_layout(space) -> dict[tuple, set]:
    rows, _ = np.nonzero(space._option_mask())
    out: dict[tuple, set] = {}
    for r in np.unique(rows):
        cfg = space.config(int(r), 0)
        key = tuple(cfg[k] for k in ("tp", "cp", "pp", "vpp", "ep", "etp", "micro_batch_size"))
        out.setdefault(key, set()).add((cfg.get("moe_a2a_algorithm"), cfg.get("cp_comm_type", "p2p")))
    return out


def test_exhaustive_enumerates_both_dispatches_where_the_ep_group_leaves_the_domain():
    model, cluster, devices, gbs = MULTI_NODE_EP
    spec, profile = model_presets.load(model), hardware_profiles.load(cluster)
    domain = int(profile.fact("scale_up_domain"))
    space = build_space(spec, profile, devices, gbs, framework="megatron")
    seen_leaving = False
    for (tp, cp, pp, vpp, ep, etp, mbs), algos in _algorithm_by_layout(space).items():
        dispatches = {a for a, _ in algos}
        if ep > domain // etp:
            seen_leaving = True
            assert dispatches == {"flat", "hierarchical"}, (tp, cp, ep, etp)
        else:  # inside one domain the two are the same plan: one of them only
            assert len(dispatches) == 1, (tp, cp, ep, etp)
    assert seen_leaving
    # the two are priced differently where they differ (what makes it worth searching)
    rows, opts = np.nonzero(space._option_mask())
    cfgs = [space.config(int(r), int(o)) for r, o in zip(rows, opts)]
    pairs = {}
    for c in cfgs:
        if c["ep"] > domain // c["etp"]:
            pairs.setdefault(json.dumps({k: v for k, v in c.items() if k != "moe_a2a_algorithm"}, sort_keys=True),
                             {})[c["moe_a2a_algorithm"]] = c
    pair = next(p for p in pairs.values() if len(p) == 2)
    br = evaluate_batch(spec, profile, devices, ConfigBatch.from_configs(
        [TrainingConfig.model_validate(pair[a]) for a in ("flat", "hierarchical")]))
    assert br.tokens_per_s[0] != br.tokens_per_s[1]
    # and the space's own batch columns price what its configs say
    batch = next(space.batches(len(rows)))[2]
    ref = evaluate_batch(spec, profile, devices, ConfigBatch.from_configs([TrainingConfig.model_validate(c) for c in cfgs]))
    got = evaluate_batch(spec, profile, devices, batch)
    np.testing.assert_allclose(got.tokens_per_s, ref.tokens_per_s, rtol=1e-12)


def test_cp_algorithms_are_searched_only_with_cp_above_one():
    spec, profile = model_presets.load("tiny-dense"), hardware_profiles.load("nvidia-h100-80gb")
    space = build_space(spec, profile, 16, 32, framework="megatron")
    kinds_by_cp: dict[int, set] = {}
    for (tp, cp, *_), algos in _algorithm_by_layout(space).items():
        kinds_by_cp.setdefault(cp, set()).update(k for _, k in algos)
    assert kinds_by_cp[1] == {"p2p"}
    assert set().union(*(v for cp, v in kinds_by_cp.items() if cp > 1)) == {"p2p", "a2a", "allgather", "a2a+p2p"}


def test_a_megatron_moe_search_tries_both_dispatches():
    model, cluster, devices, gbs = MULTI_NODE_EP
    spec, profile = model_presets.load(model), hardware_profiles.load(cluster)
    storage = optuna.storages.InMemoryStorage()
    res = run_search(SearchRequest(spec=spec, profile=profile, devices=devices, global_batch_size=gbs,
                                   sampler="tpe", n_trials=80, top_k=10, seed=4, framework="megatron",
                                   fixed={"ep": 16}, storage=storage, study_name="dispatch"))
    study = optuna.load_study(study_name="dispatch", storage=storage)
    tried = {t.params.get("moe_a2a_algorithm") for t in study.trials}
    assert {"flat", "hierarchical"} <= tried
    assert res["top"] and all(e["config"]["moe_a2a_algorithm"] in ("flat", "hierarchical") for e in res["top"])


def test_a_pinned_algorithm_is_honoured_and_one_the_framework_lacks_is_refused():
    model, cluster, devices, gbs = MULTI_NODE_EP
    spec, profile = model_presets.load(model), hardware_profiles.load(cluster)
    for fixed in ({"moe_a2a_algorithm": "flat"}, {"cp_comm_type": "allgather", "cp": 2}):
        res = run_search(SearchRequest(spec=spec, profile=profile, devices=devices, global_batch_size=gbs,
                                       sampler="exhaustive", top_k=5, framework="megatron",
                                       fixed=validate_fixed(fixed, gbs)))
        assert res["top"] and all(e["config"][k] == v for e in res["top"] for k, v in fixed.items())
    with pytest.raises(SpaceError, match="fix.moe_a2a_algorithm"):
        build_space(spec, profile, devices, gbs, fixed={"moe_a2a_algorithm": "hierarchical"}, framework="mindspeed")


@pytest.mark.parametrize("sampler", ["tpe", "exhaustive"])
def test_a_mindspeed_search_never_plans_a_dispatch_it_cannot_launch(sampler):
    from search.frameworks import refusals
    model, cluster, devices, gbs = MULTI_NODE_EP
    spec, profile = model_presets.load(model), hardware_profiles.load(cluster)
    storage = optuna.storages.InMemoryStorage()
    res = run_search(SearchRequest(spec=spec, profile=profile, devices=devices, global_batch_size=gbs,
                                   sampler=sampler, n_trials=60, top_k=10, seed=2, framework="mindspeed",
                                   fixed={"ep": 16}, storage=storage, study_name="ms"))
    configs = [e["config"] for e in res["top"]] + [lay["config"] for lay in res["layouts"]]
    assert configs
    for cfg in configs:
        assert cfg["moe_a2a_algorithm"] == "flat"
        assert not refusals(TrainingConfig.model_validate(cfg), spec, "mindspeed", int(profile.fact("scale_up_domain")))
    if sampler == "tpe":
        assert all(t.params.get("moe_a2a_algorithm", "flat") == "flat"
                   for t in optuna.load_study(study_name="ms", storage=storage).trials)


def test_a_check_stops_the_build_of_a_big_space_between_its_steps():
    """A worker's cancel is seen while Pangu's space is built (seconds), not only at the first trial."""
    spec, profile = model_presets.load("pangu-ultra-moe-718b"), hardware_profiles.load("ascend-910b")

    class Stop(Exception):
        pass

    calls = []

    def check():
        calls.append(len(calls))
        if len(calls) == 6:
            raise Stop

    with pytest.raises(Stop):
        build_space(spec, profile, 6144, 7680, framework="mindspeed", check=check)
    calls.clear()
    space = build_space(spec, profile, 6144, 7680, framework="mindspeed", check=lambda: calls.append(1))
    assert len(calls) > 10 and space.check is None  # many steps; a sampler's rounds are not stopped by it
