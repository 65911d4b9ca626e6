"""The memory of the expert all-to-all overlap: Megatron-Core's combined 1F1B runs one
more forward in its warm-up, so one more model chunk's activations are alive."""

import numpy as np
import pytest

import hardware_profiles
import model_presets
from costmodel import ConfigBatch, TrainingConfig, evaluate_batch
from costmodel.pipeline import a2a_overlap_extra_microbatches, microbatches_in_flight

GIB = 2 ** 30


def _pair(devices, **cfg):
    spec, profile = model_presets.load("tiny-moe"), hardware_profiles.load("nvidia-h100-80gb")
    configs = [TrainingConfig.model_validate({**cfg, "moe_a2a_overlap": on}) for on in (False, True)]
    return evaluate_batch(spec, profile, devices, ConfigBatch.from_configs(configs))


@pytest.mark.parametrize("pp,vpp", [(1, 1), (2, 2), (2, 3)])
def test_overlap_holds_one_more_chunk_of_activations(pp, vpp):
    """Hand-worked: the stage at the peak holds in_flight micro-batches of its activations without the
    overlap and in_flight + 1/vpp with it; states, logits and buffers do not change."""
    res = _pair(8 * pp, tp=1, pp=pp, vpp=vpp, ep=4, micro_batch_size=1, global_batch_size=16 * pp)
    assert res.valid.all()
    off, on = 0, 1
    rank = int(res.peak_rank[off])
    k = int(np.flatnonzero(res.stage_rank[off] == rank)[0])
    act_mb = res.stage_act_microbatch_bytes[off, k]
    held = microbatches_in_flight(np.array([pp]), np.array([vpp]), res.microbatches[:1], np.array([[rank]]))[0, 0]
    extra = a2a_overlap_extra_microbatches(np.array([vpp]), res.microbatches[:1], np.array([True]))[0]
    assert extra == pytest.approx(1 / vpp)
    assert res.peak_bytes[on] - res.peak_bytes[off] == pytest.approx(act_mb * extra, rel=1e-9)
    assert res.activations_bytes[on] - res.activations_bytes[off] == pytest.approx(act_mb * extra, rel=1e-9)
    assert res.params_bytes[on] == res.params_bytes[off] and res.buffers_bytes[on] == res.buffers_bytes[off]
    assert held >= 1
    # the per-stage report rebuilds the same peak
    for i in (off, on):
        assert res.stage_peaks(i).max() == pytest.approx(res.peak_bytes[i], rel=1e-9)


def test_no_extra_with_a_single_microbatch():
    res = _pair(8, tp=1, pp=1, ep=4, micro_batch_size=2, global_batch_size=4)  # dp 2 · mbs 2: one micro-batch
    assert res.microbatches[0] == 1
    assert res.peak_bytes[1] == pytest.approx(res.peak_bytes[0], rel=1e-12)
