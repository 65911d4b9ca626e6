"""Jobs: the request that creates one, its options, and the job as the API returns it."""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from app.formats.bounds import (MAX_DEVICES, MAX_GLOBAL_BATCH_SIZE, MAX_MOE_LOAD_IMBALANCE, MAX_SEED,  # noqa: F401
                        MAX_SEQ_LENGTH, MAX_TIMEOUT_S, MAX_TOP_K, MAX_TRIALS, MIN_MOE_LOAD_IMBALANCE)
from costmodel.resilience import ResilienceOptions
from search.engine import DEFAULT_TOP_K, DEFAULT_TRIALS
from search.margin import DEFAULT_MEMORY_MARGIN_GIB, MAX_MEMORY_MARGIN_GIB

from .evaluation import RankedConfig, RankedLayout

Status = Literal["queued", "running", "succeeded", "failed", "cancelled"]
Sampler = Literal["auto", "tpe", "nsga2", "random", "exhaustive"]

MODEL_FIELD = Field(
    description="A model preset name (`GET /v1/models`), a full model spec (Megatron-Core names, "
                "CONTRACT.md \"Model spec\"), or a preset with overrides: `{\"base\": \"<preset>\", ...}`.",
    examples=["pangu-ultra-moe-718b", {"base": "pangu-ultra-moe-718b", "seq_length": 8192}])
CLUSTER_FIELD = Field(
    description="A cluster profile name (`GET /v1/clusters`), a full profile, a profile with overrides: "
                "`{\"base\": \"<profile>\", \"facts\": {\"memory_gib\": {\"value\": 96, \"source\": \"...\"}}}`, "
                "or `\"<profile>@<n>\"`: the caller's profile version n, refitted on its measurements "
                "(`GET /v1/clusters/{name}/versions`; `@0` is the shipped profile).",
    examples=["ascend-910b", "ascend-910b@1"])

# Ceilings of the numbers a request may carry (app/formats/bounds.py, the same for the CLI and files), declared in the
# OpenAPI document (a value above one is a 422 naming the field). The settings PARAPLAN_MAX_DEVICES /
# _MAX_TRIALS / _MAX_TOP_K / _MAX_TIMEOUT_S may set lower caps, also answered with a 422 naming the field.


class SearchOptions(BaseModel):
    """How to search; every field is optional. Defaults: `auto` sampler, 500 trials, top 10, a random
    seed (recorded in the job, so the job can be re-run exactly), no time limit, nothing pinned, a 4 GiB
    memory margin."""

    # strict: each field takes the JSON type its schema declares (not `false` for 0 nor "8" for 8), so a body
    # the OpenAPI document calls invalid is a 422, never silently coerced.
    model_config = ConfigDict(extra="forbid", strict=True)

    sampler: Sampler = Field("auto", description="`auto` is `exhaustive` for spaces of at most 20,000,000 "
                                                 "configs, else `tpe` (docs/search.md).")
    n_trials: int = Field(DEFAULT_TRIALS, ge=1, le=MAX_TRIALS,
                          description="Optuna trials (samplers); at most PARAPLAN_MAX_TRIALS (default 10000).")
    top_k: int = Field(DEFAULT_TOP_K, ge=1, le=MAX_TOP_K,
                       description="How many ranked configs to keep (at most PARAPLAN_MAX_TOP_K, default 100).")
    seed: int | None = Field(None, ge=0, le=MAX_SEED, description="Sampler seed; same seed, same result. "
                                                                   "Chosen at random (and recorded) when absent.")
    timeout_s: float | None = Field(None, gt=0, le=MAX_TIMEOUT_S,
                                    description="Stop sampling after this many seconds (at most "
                                                "PARAPLAN_MAX_TIMEOUT_S, default 3600).")
    fixed: dict[str, Any] = Field(default_factory=dict, description="Config fields pinned to one value "
                                                                    "(as `--fix KEY=VALUE`); a plan job pins them at every count, "
                                                                    "over its planning pins.",
                                  examples=[{"recompute": "selective", "tp": 8}])
    allow_cross_domain_tp: bool = Field(False, description="Let tp span more than one scale-up domain.")
    parallel_workers: int = Field(1, ge=1, le=64, description="Workers that may run this job's Optuna study at "
                                                              "once, each adding trials until `n_trials` finished "
                                                              "trials are in the study (samplers only; an "
                                                              "exhaustive search runs on one worker).")
    memory_margin_gib: float = Field(
        DEFAULT_MEMORY_MARGIN_GIB, ge=0, le=MAX_MEMORY_MARGIN_GIB, allow_inf_nan=False,
        description="Memory headroom (GiB) a recommendation keeps for what the cost model does not count "
                    "(allocator fragmentation, communication buffers); configs short of it are still ranked, after "
                    "every config that keeps it, and flagged. Must be below the device memory. Default 4 GiB "
                    "(docs/search.md: why).")
    framework: Literal["megatron", "mindspeed"] | None = Field(
        None, description="The training framework planned for: the search offers only configs it can express, so "
                          "the launch arguments of the same format (`.../launch?format=`) carry every choice out. "
                          "Default: `mindspeed` (MindSpeed-LLM) for Ascend profiles, `megatron` (Megatron-LM) "
                          "otherwise (docs/search.md, \"Frameworks\").")
    objective: Literal["throughput", "goodput"] = Field(
        "throughput", description="What the search ranks by: tokens/s, or `goodput`, tokens/s with failures, "
                                  "checkpoints and restarts priced (docs/guides/goodput.md).")
    resilience: ResilienceOptions = Field(
        default_factory=ResilienceOptions,
        description="Checkpoint mode and interval, hot spare nodes and checkpoint bandwidth overrides that every "
                    "result's `goodput` block and a plan's effective days are priced with (docs/guides/goodput.md).")


# The fields only some job kinds take (besides model, cluster, kind and search, which every kind takes): a body
# with a field its kind does not take is a 422 naming the field, never a field silently ignored.
PLAN_FIELDS = ("tokens", "devices_min", "devices_max", "devices_step", "deadline_days", "price_per_device_hour",
               "global_batch_tokens")
RL_FIELDS = ("algorithm", "prompts_per_step", "responses_per_prompt", "prompt_length", "response_length",
             "max_response_length", "reference", "critic", "stale_sync")
_TRAINING = ("precision", "moe_load_imbalance", "seq_length")
KIND_FIELDS = {"search": ("devices", "global_batch_size", *_TRAINING), "plan": (*PLAN_FIELDS, *_TRAINING),
               "rl": ("devices", *RL_FIELDS)}
KIND_REQUIRED = {"search": ("devices", "global_batch_size"), "rl": ("devices",)}
# The `search` options a kind's runs do not read (a plan is one exhaustive search per count; an rl job's
# training searches take the request's sampler, top 3 and seed): given, they are a 422 naming them.
_SAMPLING = ("sampler", "n_trials", "top_k", "timeout_s", "parallel_workers", "allow_cross_domain_tp")
KIND_UNUSED_OPTIONS = {"search": (), "plan": (*_SAMPLING, "seed", "objective"),
                       "rl": (*_SAMPLING, "objective", "resilience")}


def _kind_errors(data) -> list[dict]:
    """Validation errors of a raw body's kind: fields it needs but lacks (``missing``), fields of other kinds it
    carries (``kind_field``)."""
    from pydantic_core import PydanticCustomError

    kind = data.get("kind", "search") if isinstance(data, dict) else None
    if not isinstance(kind, str) or kind not in KIND_FIELDS:
        return []  # not an object, or a kind not known (or not a string): the field validation names it
    errors = [{"type": "missing", "loc": (name,), "input": data}
              for name in KIND_REQUIRED.get(kind, ()) if data.get(name) is None]
    for name in dict.fromkeys(f for fields in KIND_FIELDS.values() for f in fields):
        if name not in KIND_FIELDS[kind] and data.get(name) is not None:
            takers = " and ".join(k for k, fields in KIND_FIELDS.items() if name in fields)
            errors.append({"type": PydanticCustomError("kind_field", "{kind} jobs do not take this field (a field "
                                                       "of {takers} jobs)", {"kind": kind, "takers": takers}),
                           "loc": (name,), "input": data[name]})
    options = data.get("search")
    for name in KIND_UNUSED_OPTIONS[kind] if isinstance(options, dict) else ():
        if options.get(name) is not None:  # null counts as absent, as at the top level
            errors.append({"type": PydanticCustomError("kind_option", "{kind} jobs do not use this search option "
                                                       "(only search jobs do)", {"kind": kind}),
                           "loc": ("search", name), "input": options[name]})
    return errors


class JobCreate(BaseModel):
    """A search job (the inputs of `paraplan search`), or with `"kind": "plan"` a capacity plan (the inputs of
    `paraplan plan`: `tokens` and the optional plan fields; `devices` and `global_batch_size` not needed), or with
    `"kind": "rl"` an RL post-training plan (the inputs of `paraplan rl`: `devices` and the optional workload
    fields). A field of another kind is a 422 naming it."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [{
        "model": "pangu-ultra-moe-718b", "cluster": "ascend-910b", "devices": 6144,
        "global_batch_size": 7680, "search": {"sampler": "tpe", "n_trials": 200, "seed": 7}}]})

    model: str | dict[str, Any] = MODEL_FIELD
    cluster: str | dict[str, Any] = CLUSTER_FIELD
    kind: Literal["search", "plan", "rl"] = Field(
        "search", description="`search` (the default); `plan`: a capacity plan over device counts "
                              "(docs/guides/capacity.md), its result the job's `plan`; `rl`: the best co-located and "
                              "disaggregated plan of an RL post-training step (docs/guides/rl.md), its "
                              "result the job's `rl`.")
    devices: int | None = Field(None, ge=1, le=MAX_DEVICES, description="Number of devices (at most "
                                "PARAPLAN_MAX_DEVICES). Required for a search and an rl job.",
                                examples=[6144])
    global_batch_size: int | None = Field(None, ge=1, le=MAX_GLOBAL_BATCH_SIZE, description="Sequences per step "
                                          "(at most 100,000,000, as in a config). Required for a search.",
                                          examples=[7680])
    tokens: float | None = Field(None, gt=0, le=1e18, allow_inf_nan=False,
                                 description="Plan: tokens to train (required for a plan).", examples=[19e12])
    devices_min: int | None = Field(None, ge=1, le=MAX_DEVICES, description="Plan: smallest count (default one node).")
    devices_max: int | None = Field(None, ge=1, le=MAX_DEVICES, description="Plan: largest count (default 16384).")
    devices_step: int | None = Field(None, ge=1, le=MAX_DEVICES, description="Plan: step between counts (default: "
                                     "the node size × the smallest power of two giving at most 32 counts).")
    deadline_days: float | None = Field(None, gt=0, le=1e6, allow_inf_nan=False, description="Plan: deadline.")
    price_per_device_hour: float | None = Field(None, ge=0, le=1e9, allow_inf_nan=False,
                                                description="Plan: price of one device-hour (any currency).")
    global_batch_tokens: float | None = Field(None, gt=0, le=1e15, allow_inf_nan=False,
                                              description="Plan: tokens per step held across counts (default: "
                                                          "the preset's published batch, else 4M).")
    precision: Literal["bf16", "fp8"] = Field("bf16", description="`fp8` needs a profile FP8 peak.")
    algorithm: Literal["grpo", "ppo"] | None = Field(None, description="RL: `grpo` (the default: reference on, no "
                                                                        "critic) or `ppo` (reference and critic).")
    prompts_per_step: int | None = Field(None, ge=1, le=MAX_GLOBAL_BATCH_SIZE, description="RL: prompts per step "
                                         "(default 384).", examples=[384])
    responses_per_prompt: int | None = Field(None, ge=1, le=MAX_GLOBAL_BATCH_SIZE, description="RL: responses per "
                                             "prompt (default 32; GRPO needs at least 2).", examples=[32])
    prompt_length: int | None = Field(None, ge=1, le=MAX_SEQ_LENGTH, description="RL: prompt tokens (default 1024).")
    response_length: int | None = Field(None, ge=1, le=MAX_SEQ_LENGTH, description="RL: tokens generated per "
                                        "response, the mean (default 2048).")
    max_response_length: int | None = Field(None, ge=1, le=MAX_SEQ_LENGTH, description="RL: the longest response "
                                            "(default: every response is `response_length`); at least "
                                            "`response_length`.")
    reference: bool | None = Field(None, description="RL: the reference model's log-prob pass (default: the "
                                                     "algorithm's, on for both).")
    critic: bool | None = Field(None, description="RL: train a critic (default: the algorithm's; PPO needs one).")
    stale_sync: bool | None = Field(None, description="RL: one step of staleness, the pools of a disaggregated plan "
                                                      "overlap (default false).")
    moe_load_imbalance: float | None = Field(None, ge=MIN_MOE_LOAD_IMBALANCE, le=MAX_MOE_LOAD_IMBALANCE,
                                            description="max/mean routed tokens per EP rank; default 1.15.")
    seq_length: int | None = Field(None, ge=1, le=MAX_SEQ_LENGTH, description="Override the model's "
                                                                          "seq_length (as `--seq-length`).")
    search: SearchOptions = Field(default_factory=SearchOptions)

    @model_validator(mode="wrap")
    @classmethod
    def _fields_of_the_kind(cls, data, handler):
        """A search (the default kind) needs ``devices`` and ``global_batch_size``, an rl job ``devices``:
        reported as missing fields beside any other field's error, as when they were required fields; a field
        of another kind is an error naming it (``_kind_errors``)."""
        errors = _kind_errors(data)
        try:
            job = handler(data)
        except ValidationError as exc:
            if not errors:
                raise
            raise ValidationError.from_exception_data(exc.title, exc.errors() + errors) from None
        if errors:
            raise ValidationError.from_exception_data(cls.__name__, errors)
        return job


class Progress(BaseModel):
    trials_done: int = Field(description="Finished trials (configs scored for `exhaustive`); "
                                         "updated at least every 2 s while running.", examples=[120])
    trials_total: int = Field(description="Trials asked for (the space size for `exhaustive`: 0 until a worker has "
                                          "built the space).", examples=[200])


class ResolvedSearch(SearchOptions):
    seed: int = Field(description="The seed used (chosen at random when the request had none).")
    engine: str = Field(description="The engine that runs. `auto` until a worker has built the job's search space "
                                    "(a job is accepted before its space is built), then the engine it chose.",
                        examples=["tpe"])
    space_size: int | None = Field(description="Configs in the search space; null until a worker has built it "
                                               "(seconds after the job starts).", examples=[11894960])
    memory_margin_gib: float | None = Field(None, description="The memory margin the job ranks with (GiB); null "
                                                              "for jobs submitted before margins existed.")
    framework: Literal["megatron", "mindspeed"] | None = Field(
        None, description="The framework planned for (the default resolved at submission); null for jobs submitted "
                          "before frameworks existed, which searched every option.", examples=["mindspeed"])
    kind: Literal["search", "plan", "rl"] | None = Field(None, description="`plan` for a plan job, `rl` for an rl "
                                                                        "job (absent: a search).")
    plan: dict[str, Any] | None = Field(None, description="A plan job's plan fields (tokens, devices_min, ...) "
                                                          "with the precision, imbalance, margin and framework.")
    rl: dict[str, Any] | None = Field(None, description="An rl job's options: its `workload` (every field resolved, "
                                                        "defaults included), margin and framework.")


class JobInputs(BaseModel):
    """The exact inputs of the job: enough to reproduce its result."""

    model: dict[str, Any] = Field(description="The model spec after loading (preset and overrides merged).")
    cluster: str = Field(description="The cluster profile's name.", examples=["ascend-910b"])
    profile_version: str = Field(description="Hash of the profile used (facts and calibrated factors).",
                                 examples=["4f6c1a0e9b2d"])
    devices: int = Field(description="A plan job: its largest device count.")
    global_batch_size: int = Field(description="A plan job: 0 (the plan holds the batch in tokens); an rl job: the "
                                               "samples per step (prompts × responses), the training batch.")
    precision: str
    moe_load_imbalance: float | None
    search: ResolvedSearch
    paraplan_version: str


class JobSummary(BaseModel):
    """What the search did (as in `paraplan search --json`, without the ranked lists)."""

    model_config = ConfigDict(extra="allow")

    engine: str
    space_size: int
    trials: int = Field(description="Configs scored (`exhaustive`) or Optuna trials (samplers).")
    feasible_trials: int
    search_time_s: float
    configs_scored: int | None = None
    study_name: str | None = Field(None, description="The job's Optuna study, stored in the same database.")
    smallest_peak_gib: float | None = None
    smallest_peak_config: dict[str, Any] | None = None


class JobOut(BaseModel):
    kind: Literal["search", "plan", "rl"] = Field("search", description="What the job runs.")
    plan: dict[str, Any] | None = Field(None, description="A succeeded `plan` job's plan, as `paraplan plan "
                                                          "--json` prints it; null otherwise.")
    rl: dict[str, Any] | None = Field(None, description="A succeeded `rl` job's result, as `paraplan rl --json` "
                                                        "prints it (`colocated`, `disaggregated`, `best`: null where "
                                                        "no plan fits, the job still `succeeded`); null otherwise.")
    id: str = Field(description="A UUID.", examples=["0b5c8c52-3c2e-4a53-9f43-3f3f7f2a8f10"])
    status: Status = Field(description="`queued` → `running` → `succeeded` | `failed` | `cancelled`.")
    progress: Progress
    best: RankedConfig | None = Field(description="Rank 1 once succeeded; null while not finished, and when "
                                                  "no config fits (the job still `succeeded`).")
    error: str | None = Field(description="Why the job failed, in words.", examples=[None])
    inputs: JobInputs
    summary: JobSummary | None = Field(description="Counts of a finished search.")
    created_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    updated_at: dt.datetime


class JobPage(BaseModel):
    items: list[JobOut]
    total: int
    limit: int
    offset: int


class ConfigPage(BaseModel):
    items: list[RankedConfig]
    total: int
    limit: int
    offset: int


class LayoutPage(BaseModel):
    items: list[RankedLayout]
    total: int
    limit: int
    offset: int
