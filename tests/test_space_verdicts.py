"""The framework mask's remembered verdicts (search/space/verdicts.py): a probe's verdict is the rule's own on
that config, however many probes share a path through the rule, and a rule the memo cannot follow fails
loudly instead of being remembered wrongly."""

import itertools

import pytest

import hardware_profiles
import model_presets
from costmodel import TrainingConfig
from search import frameworks
from search.space import build_space
from search.space.expressible import OPTION_FIELDS
from search.space.verdicts import Verdicts, shared


def _space(model, cluster, devices, gbs, framework):
    return build_space(model_presets.load(model), hardware_profiles.load(cluster), devices, gbs, framework=framework)


@pytest.mark.parametrize("framework", ["megatron", "mindspeed"])
def test_every_remembered_verdict_is_the_rules_own_on_the_real_config(framework):
    """Each (tp, ep, etp) and option of a space: the memo's verdict against ``refusals`` on a validated
    TrainingConfig built from the same fields; and the rule ran for far fewer probes than were asked."""
    space = _space("tiny-mla-moe", "ascend-910b", 32, 64, framework)
    spec, domain = space.spec, int(space.profile.fact("scale_up_domain"))
    base = {**space._probe_fields(), "moe_a2a_algorithm": "flat"}
    names = ("tp", "ep", "etp") + OPTION_FIELDS
    verdicts = Verdicts(lambda cfg: not frameworks.refusals(cfg, spec, framework, domain, split_rules=False), base,
                        names)
    asked = 0
    seen = set()
    for tp, ep, etp in itertools.product(space.values["tp"], space.values["ep"], space.values["etp"]):
        for values in space._option_values():
            probe = (tp, ep, etp) + values
            fields = {n: list(v) if isinstance(v, tuple) else v for n, v in zip(names, probe)}
            real = TrainingConfig.model_validate({**base, **fields})
            assert verdicts(probe) == (not frameworks.refusals(real, spec, framework, domain, split_rules=False)), probe
            asked += 1
            seen.add(verdicts(probe))
    assert seen == {True, False}  # the probes cover both verdicts: the comparison can fail either way
    assert verdicts.runs < asked / 4, (verdicts.runs, asked)


def test_a_rule_reading_anything_but_fields_and_properties_fails():
    """A rule that calls a method of the config (not a field or property) cannot be followed by the memo."""
    base = dict(TrainingConfig.model_validate({"global_batch_size": 8}))
    verdicts = Verdicts(lambda cfg: bool(cfg.model_dump()), base, ("tp",))
    with pytest.raises(AttributeError, match="model_dump"):
        verdicts((2,))


def test_properties_are_read_through_the_fields_they_read():
    """``sp`` reads tp where sequence_parallel is unset: tp 1 and tp 2 take different paths, tp 2 and tp 4
    the same (one run for both)."""
    base = dict(TrainingConfig.model_validate({"global_batch_size": 8}))
    verdicts = Verdicts(lambda cfg: cfg.sp, base, ("tp",))
    assert (verdicts((1,)), verdicts((2,)), verdicts((4,))) == (False, True, True)
    assert verdicts.runs == 3  # tp is read as a value, so each value is a path of its own
    pinned = Verdicts(lambda cfg: cfg.sp, {**base, "sequence_parallel": False}, ("tp",))
    assert (pinned((1,)), pinned((2,)), pinned((4,))) == (False, False, False)
    assert pinned.runs == 1  # a pinned sequence_parallel: tp is never read, one run serves every tp


def test_a_rule_that_reads_other_fields_on_the_same_values_is_refused():
    calls = []

    def fickle(cfg):
        calls.append(1)
        return cfg.tp if len(calls) == 1 else cfg.cp

    base = dict(TrainingConfig.model_validate({"global_batch_size": 8}))
    verdicts = Verdicts(fickle, base, ("tp", "cp"))
    verdicts((1, 1))
    with pytest.raises(RuntimeError, match="read"):
        verdicts((2, 1))  # a new tp: the rule runs again and reads cp first this time


def test_a_value_shared_by_the_probes_must_not_read_what_they_vary():
    base = dict(TrainingConfig.model_validate({"global_batch_size": 8}))
    spec = model_presets.load("tiny-moe")
    split = shared(lambda cfg: frameworks.pipeline_split(cfg, spec, "megatron"), base, OPTION_FIELDS)
    assert split.num_layers == spec.num_layers
    with pytest.raises(RuntimeError, match="vary"):
        shared(lambda cfg: frameworks.pipeline_split(cfg, spec, "megatron"), base, ("pp",))
