"""An RL workload from user input (CLI flags or an API body): ``workload(...)`` checks every field and
raises ``InputError`` naming the first bad one."""

from __future__ import annotations

import json

from costmodel.rl import ALGORITHMS, Workload

from .bounds import MAX_GLOBAL_BATCH_SIZE, MAX_SEQ_LENGTH, int_problem
from .errors import InputError

# The default workload (a documented GRPO step): MindSpeed-RL's DeepSeek-R1-Zero 671B recipe on Atlas A3
# (docs/solutions/r1_zero_deepseek_671b.md: gbs 384 prompts, 32 samples each, input 1024, output 2048
# tokens), the published GRPO recipe closest to Pangu Ultra MoE on CloudMatrix 384 in size and hardware.
DEFAULTS = {"algorithm": "grpo", "prompts_per_step": 384, "responses_per_prompt": 32, "prompt_length": 1024,
            "response_length": 2048}


def workload(algorithm: str = "grpo", prompts_per_step: int = 384, responses_per_prompt: int = 32,
             prompt_length: int = 1024, response_length: int = 2048, reference: bool | None = None,
             critic: bool | None = None, stale_sync: bool = False,
             max_response_length: int | None = None) -> Workload:
    """The workload; ``reference`` / ``critic`` None take the algorithm preset's value."""
    if algorithm not in ALGORITHMS:
        raise InputError("algorithm", f"{algorithm!r} is not one of {', '.join(ALGORITHMS)}")
    for name, value, cap in (("prompts_per_step", prompts_per_step, MAX_GLOBAL_BATCH_SIZE),
                             ("responses_per_prompt", responses_per_prompt, MAX_GLOBAL_BATCH_SIZE),
                             ("prompt_length", prompt_length, MAX_SEQ_LENGTH),
                             ("response_length", response_length, MAX_SEQ_LENGTH)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise InputError(name, f"{value!r} is not an integer")
        if (problem := int_problem(value, cap)) is not None:
            raise InputError(name, problem)
    if max_response_length is not None:
        if (problem := int_problem(max_response_length, MAX_SEQ_LENGTH)) is not None:
            raise InputError("max_response_length", problem)
        if max_response_length < response_length:
            raise InputError("max_response_length", f"{max_response_length} is below the mean response_length "
                                                    f"({response_length})")
    if prompts_per_step * responses_per_prompt > MAX_GLOBAL_BATCH_SIZE:
        raise InputError("responses_per_prompt", f"{prompts_per_step * responses_per_prompt:,} samples per step is "
                                                 f"beyond any real run (at most {MAX_GLOBAL_BATCH_SIZE:,})")
    if prompt_length + response_length > MAX_SEQ_LENGTH:
        raise InputError("response_length", f"prompt + response ({prompt_length + response_length:,} tokens) is "
                                             f"beyond any real run (at most {MAX_SEQ_LENGTH:,})")
    preset = ALGORITHMS[algorithm]
    reference = preset["reference"] if reference is None else reference
    critic = preset["critic"] if critic is None else critic
    if algorithm == "grpo" and responses_per_prompt < 2:
        raise InputError("responses_per_prompt", "GRPO needs at least 2 responses per prompt: its advantage is "
                                                 "each response's reward against its group's mean")
    if algorithm == "ppo" and not critic:
        raise InputError("critic", "PPO needs a critic (its advantage comes from the critic's values); "
                                   "use --algorithm grpo for a critic-free step")
    return Workload(prompts_per_step, responses_per_prompt, prompt_length, response_length, algorithm=algorithm,
                    reference=reference, critic=critic, stale_sync=stale_sync,
                    max_response_length=max_response_length)


def is_rl(result) -> bool:
    """Whether a JSON result is an RL plan (``paraplan rl --json``): it has both modes' plans."""
    return isinstance(result, dict) and "colocated" in result and "disaggregated" in result


def rl_inputs(spec, profile, devices: int, wl: Workload, model_label) -> dict:
    """The ``inputs`` of an RL result: the model's name (``model_label``: the preset or file given when the
    spec has no name), its full spec (``model_spec``, what ``paraplan export`` needs), the profile's name,
    the devices and the workload with its samples per step."""
    from dataclasses import asdict

    return {"model": spec.name or model_label, "model_spec": spec.model_dump(mode="json", exclude_none=True),
            "cluster": profile.name, "devices": devices, "workload": {**asdict(wl), "samples": wl.samples}}


def rl_result(req, model_label, progress=None, check=None) -> dict:
    """What ``paraplan rl --json`` prints (and an ``rl`` job's result) for ``req`` (a ``search.rl.RLRequest``):
    ``{"inputs", **run_rl_search}``, the inputs with the training pins (``fixed``) and the ``seed``; ``progress(done, total)`` counts training searches, ``check()`` may raise
    to stop."""
    from search.rl import run_rl_search

    result = run_rl_search(req, progress, check)
    inputs = {**rl_inputs(req.spec, req.profile, req.devices, req.workload, model_label),
              "fixed": json.loads(json.dumps(req.fixed, default=str)), "seed": req.seed}
    return {"inputs": inputs, **result}
