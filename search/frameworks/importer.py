"""A launch's arguments read back into a model spec and a training config: the inverse of the export.

``read_args(tokens)`` reads Megatron-LM or MindSpeed-LLM training arguments through the flag table
(``flags.py``) and the decoders below, which undo ``express`` and ``app/formats/launch.py`` concern by
concern (the pipeline split, recompute, sharding, dtypes, CP algorithm, dispatcher, schedule). Every flag
maps to a field, is ignored with a note, or is refused: ``LaunchImportError`` names the flag and the
reason, as it does for a flag without its value, a flag given twice with different values, and flags that
contradict each other. What the framework itself would refuse of the combination (``express``'s refusals:
a team may run a fork that allows it) comes back as warnings, and the config is imported as written.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from itertools import product

from pydantic import ValidationError

from costmodel import ModelSpec, TrainingConfig
from costmodel.pipeline import LayoutError, parse_layout

from . import flags as T
from .express import express
from .split import stage_tokens
from .table import LABELS, MINDSPEED_CP_ALGO, MINDSPEED_SWAP_MODULES

# Flags only MindSpeed-LLM registers: one of them, or the msrun launcher, makes the script MindSpeed-LLM's.
MINDSPEED_ONLY = ("--noop-layers", "--use-fused-rmsnorm", "--context-parallel-algo", "--padded-vocab-size",
                  "--moe-tp-extend-ep", "--schedules-method", "--use-ascend-mc2", "--swap-attention",
                  "--reuse-fp32-param", "--quant-states", "--multi-head-latent-attention", "--moe-alltoall-overlap-comm",
                  "--moe-fb-overlap", "--recompute-activation-function", "--recompute-mla-up-proj", "--mla-fa-without-pad",
                  "--geglu", "--gelu-tanh", "--first-k-dense-replace", "--n-shared-experts", "--use-ascend-coc",
                  "--moe-hierarchical-alltoallv", "--rope-scaling-type", "--enable-recompute-layers-per-pp-rank")


class LaunchImportError(ValueError):
    """The arguments cannot be imported: ``flag`` names the flag (or the field) and ``reason`` says why."""

    def __init__(self, flag: str, reason: str):
        self.flag, self.reason = flag, reason
        super().__init__(f"{flag}: {reason}")


@dataclass
class Imported:
    """A launch read back: the framework, the model, the config, the devices (nodes × processes when the
    launcher states them), notes on what was ignored and warnings on what the framework would refuse."""

    framework: str
    spec: ModelSpec
    config: TrainingConfig
    devices: int | None = None
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def guess_framework(tokens: list[str], launcher: str | None = None, entry: str | None = None) -> str:
    """MindSpeed-LLM when the launch uses msrun, its posttrain entry or a flag only it has; else Megatron-LM."""
    names = {t.split("=", 1)[0] for t in tokens if t.startswith("--")}
    if launcher == "msrun" or entry == "posttrain_gpt.py" or names & set(MINDSPEED_ONLY):
        return "mindspeed"
    return "megatron"


def parse_flags(tokens: list[str]) -> tuple[dict[str, list[str]], list[str]]:
    """``{flag: values}`` of the tokens and the notes on the ignored flags; refuses unknown and refused flags,
    a flag missing its value, a switch given a value, and a flag repeated with other values."""
    out: dict[str, list[str]] = {}
    notes: list[str] = []
    order: list[tuple[str, list[str]]] = []
    ignored: dict[str, list[str]] = {}
    for tok in tokens:
        if tok.startswith("--") and len(tok) > 2:
            name, eq, val = tok.partition("=")
            order.append((name, [val] if eq else []))
        elif order:
            order[-1][1].append(tok)
        else:
            raise LaunchImportError(tok, "an argument before any flag")
    for name, values in order:
        if not T.known(name):
            raise LaunchImportError(name, "unknown flag: ParaPlan cannot say what it does to the plan (no field, "
                                          "and not among the flags it knows to ignore)")
        if name in T.REFUSED:
            raise LaunchImportError(name, T.REFUSED[name])
        if name in T.IGNORED:
            ignored.setdefault(T.IGNORED[name], []).append(name)
            continue
        n = T.arity(name)
        if n == 0 and values:
            raise LaunchImportError(name, f"a switch takes no value (got {' '.join(values)!r})")
        if n == 1 and len(values) != 1:
            raise LaunchImportError(name, "flag without its value" if not values else
                                    f"takes one value (got {' '.join(values)!r})")
        if n == "+" and not values:
            raise LaunchImportError(name, "flag without its value")
        if name in out and out[name] != values:
            raise LaunchImportError(name, f"given twice with different values ({' '.join(out[name]) or 'on'} and "
                                          f"{' '.join(values) or 'on'})")
        out[name] = values
    notes = [f"ignored, {why}: {', '.join(sorted(set(names)))}" for why, names in ignored.items()]
    return out, notes


def read_args(tokens: list[str], framework: str | None = None, devices: int | None = None,
              launcher: str | None = None, entry: str | None = None) -> Imported:
    """The model, config and framework that ``tokens`` launch (raises ``LaunchImportError``)."""
    framework = framework or guess_framework(tokens, launcher, entry)
    a, notes = parse_flags(tokens)
    r = _Reader(a, framework, notes)
    spec_fields = r.model()
    try:
        spec = ModelSpec.model_validate(spec_fields)
    except ValidationError as exc:
        raise LaunchImportError(_flag_of(exc, "model"), _message(exc)) from None
    cfg_fields = r.config(spec)
    try:
        config = TrainingConfig.model_validate(cfg_fields)
    except ValidationError as exc:
        raise LaunchImportError(_flag_of(exc, "config"), _message(exc)) from None
    r.check_split(config, spec)
    e = express(config, spec, framework)
    warnings = [f"{LABELS[framework]} (as ParaPlan reads it) refuses {x}; imported as written" for x in e.refusals]
    return Imported(framework, spec, config, devices, r.notes, warnings)


def _flag_of(exc: ValidationError, kind: str) -> str:
    loc = exc.errors()[0].get("loc") or ()
    name = str(loc[0]) if loc else kind
    for table in (T.SPEC_INT, T.SPEC_FLOAT, T.CONFIG_INT):
        for flag, f in table.items():
            if f == name:
                return flag
    return f"{kind}.{name}" if loc else kind


def _message(exc: ValidationError) -> str:
    e = exc.errors()[0]
    return e["msg"].removeprefix("Value error, ")


class _Reader:
    def __init__(self, a: dict[str, list[str]], framework: str, notes: list[str]):
        self.a, self.fw, self.notes = a, framework, notes
        self.ms = framework == "mindspeed"

    # -- values --
    def has(self, flag: str) -> bool:
        return flag in self.a

    def int(self, flag: str, default=None, low: int = 1):
        if flag not in self.a:
            return default
        v = self.a[flag][0]
        try:
            n = int(v)
        except ValueError:
            raise LaunchImportError(flag, f"{v!r} is not an integer") from None
        if n < low:
            raise LaunchImportError(flag, f"must be at least {low} (got {n})")
        return n

    def num(self, flag: str, default=None):
        if flag not in self.a:
            return default
        v = self.a[flag][0]
        try:
            x = float(v)
        except ValueError:
            raise LaunchImportError(flag, f"{v!r} is not a number") from None
        if not math.isfinite(x):
            raise LaunchImportError(flag, f"{v!r} is not a finite number")
        return x

    def word(self, flag: str, choices, default=None):
        if flag not in self.a:
            return default
        v = self.a[flag][0]
        if v not in choices:
            raise LaunchImportError(flag, f"{v!r} is not one of {', '.join(choices)}")
        return v

    def exclusive(self, *names: str) -> None:
        given = [n for n in names if n in self.a]
        if len(given) > 1:
            raise LaunchImportError(given[1], f"contradicts {given[0]} (state one)")

    # -- the model --
    def model(self) -> dict:
        a = self.a
        m: dict = {}
        for flag in ("--num-layers", "--hidden-size", "--num-attention-heads", "--seq-length"):
            if flag not in a:
                raise LaunchImportError(flag, "missing: the model cannot be read without it")
        for flag, f in T.SPEC_INT.items():
            if flag in a:
                self._set(m, f, self.int(flag, low=0 if f in ("mtp_num_layers", "qk_pos_emb_head_dim") else 1), flag)
        for flag, f in T.SPEC_FLOAT.items():
            if flag in a:
                self._set(m, f, self.num(flag), flag)
        for flag, (f, choices) in T.SPEC_CHOICE.items():
            if flag in a:
                m[f] = self.word(flag, choices)
        for flag, (f, value) in T.SPEC_SWITCH.items():
            if flag in a:
                m[f] = value
        for f, value in T.SPEC_DEFAULTS.items():
            m.setdefault(f, value)
        self.exclusive("--swiglu", "--geglu", "--gelu-tanh")
        if self.has("--geglu") or self.has("--gelu-tanh"):
            m["swiglu"], m["activation_func"] = True, "gelu_tanh" if self.has("--gelu-tanh") else "gelu"
        if "num_query_groups" in m and not self.has("--group-query-attention"):
            self.notes.append("--num-query-groups ignored without --group-query-attention (as Megatron-LM does)")
            m.pop("num_query_groups")
        if self.has("--group-query-attention") and "num_query_groups" not in m:
            raise LaunchImportError("--group-query-attention", "needs --num-query-groups")
        self._layers(m)
        m["vocab_size"] = self._vocab()
        if "ffn_hidden_size" not in m:
            # arguments.py: 4h, or with SwiGLU 4h·2/3 rounded down to a multiple of 64
            h = m["hidden_size"]
            m["ffn_hidden_size"] = int(4 * h * 2 / 3 / 64) * 64 if m["swiglu"] else 4 * h
        self._rope_scaling(m)
        self._shared_experts(m)
        if "num_experts" not in m:
            m.pop("moe_router_topk")
        return m

    def _set(self, m: dict, f: str, value, flag: str) -> None:
        if f in m and m[f] != value:
            raise LaunchImportError(flag, f"contradicts another flag for {f} ({m[f]} and {value})")
        m[f] = value

    def _layers(self, m: dict) -> None:
        """--num-layers less MindSpeed's no-op layers; the MoE layer pattern at the real layers."""
        total = m["num_layers"]
        noop = self._noop(total)
        real = [i for i in range(total) if i not in noop]
        self.real, self.total = real, total
        m["num_layers"] = len(real)
        if not real:
            raise LaunchImportError("--noop-layers", "leaves no layer")
        if "num_experts" not in m:
            for flag in ("--moe-layer-freq", "--first-k-dense-replace"):
                if self.has(flag):
                    self.notes.append(f"{flag} ignored: a dense model (no --num-experts)")
            return
        pattern = self._freq(total)
        if self.has("--first-k-dense-replace"):
            k = self.int("--first-k-dense-replace", low=0)
            pattern = [0 if i < k else v for i, v in enumerate(pattern)]
        pattern = [pattern[i] for i in real]
        freq = self.a.get("--moe-layer-freq", ["1"])[0]
        if not noop and not self.has("--first-k-dense-replace") and re.fullmatch(r"\d+", freq):
            m["moe_layer_freq"] = int(freq)
        else:
            m["moe_layer_freq"] = pattern

    def _noop(self, total: int) -> set[int]:
        if not self.has("--noop-layers"):
            return set()
        try:
            noop = {int(x) for x in self.a["--noop-layers"][0].split(",") if x.strip()}
        except ValueError:
            raise LaunchImportError("--noop-layers", "must be layer numbers separated by commas") from None
        if any(not 0 <= i < total for i in noop):
            raise LaunchImportError("--noop-layers", f"a layer beyond --num-layers {total}")
        return noop

    def _freq(self, total: int) -> list[int]:
        freq = self.a.get("--moe-layer-freq", ["1"])[0]
        if re.fullmatch(r"\d+", freq):
            k = int(freq)
            if k < 1:
                raise LaunchImportError("--moe-layer-freq", "must be at least 1")
            return [1 if i % k == 0 else 0 for i in range(total)]
        if not re.fullmatch(r"[\[\]()0-9*+, ]+", freq):
            raise LaunchImportError("--moe-layer-freq", f"{freq!r} is neither an integer nor a list expression "
                                                        "such as ([0]*3+[1]*58)")
        try:
            pattern = list(eval(freq, {"__builtins__": {}}))  # noqa: S307 - digits, brackets, * and + only, as Megatron evaluates it
        except Exception:  # noqa: BLE001 - any malformed expression is the user's error
            raise LaunchImportError("--moe-layer-freq", f"{freq!r} is not a valid list expression") from None
        if len(pattern) != total or set(pattern) - {0, 1}:
            raise LaunchImportError("--moe-layer-freq", f"needs {total} entries of 0 or 1 (got {len(pattern)})")
        return pattern

    def _vocab(self) -> int:
        """--padded-vocab-size as given; else --vocab-size padded by Megatron's rule to a multiple of
        --make-vocab-size-divisible-by (default 128) × tp (build_tokenizer.py vocab_size_with_padding)."""
        if self.has("--padded-vocab-size"):
            return self.int("--padded-vocab-size")
        v = self.int("--vocab-size")
        if v is None:
            raise LaunchImportError("--vocab-size", "missing: the tokenizer sets it at launch; state --vocab-size "
                                                    "(or --padded-vocab-size)")
        multiple = self.int("--make-vocab-size-divisible-by", 128) * self.int("--tensor-model-parallel-size", 1)
        padded = math.ceil(v / multiple) * multiple
        if padded != v:
            self.notes.append(f"vocabulary {v} padded to {padded} (a multiple of {multiple}, as Megatron-LM pads it)")
        return padded

    def _rope_scaling(self, m: dict) -> None:
        """MindSpeed-LLM's --rope-scaling-* (YaRN only with --rope-scaling-type yarn)."""
        if not any(self.has(f) for f in ("--rope-scaling-factor", "--rope-scaling-mscale",
                                         "--rope-scaling-mscale-all-dim", "--rope-scaling-type")):
            return
        kind = self.a.get("--rope-scaling-type", [None])[0]
        if kind not in (None, "yarn"):
            raise LaunchImportError("--rope-scaling-type", f"{kind!r}: only yarn is mapped")
        if kind == "yarn":
            self._set(m, "rotary_scaling_factor", self.num("--rope-scaling-factor", 1.0), "--rope-scaling-factor")
            if self.has("--rope-scaling-mscale-all-dim"):
                self._set(m, "mscale_all_dim", self.num("--rope-scaling-mscale-all-dim"), "--rope-scaling-mscale-all-dim")
        elif self.has("--rope-scaling-factor"):
            self.notes.append("--rope-scaling-factor ignored without --rope-scaling-type yarn")
        if self.has("--rope-scaling-mscale"):
            self._set(m, "mscale", self.num("--rope-scaling-mscale"), "--rope-scaling-mscale")

    def _shared_experts(self, m: dict) -> None:
        """MindSpeed-LLM's --n-shared-experts k: k shared experts as wide as a routed one."""
        if not self.has("--n-shared-experts"):
            return
        k = self.int("--n-shared-experts", low=0)
        width = k * m.get("moe_ffn_hidden_size", m["ffn_hidden_size"])
        self._set(m, "moe_shared_expert_intermediate_size", width, "--n-shared-experts")

    # -- the config --
    def config(self, spec: ModelSpec) -> dict:
        c: dict = dict(T.CONFIG_DEFAULTS)
        for flag, f in T.CONFIG_INT.items():
            if flag in self.a:
                c[f] = self.int(flag)
        for flag, (f, value) in T.CONFIG_SWITCH.items():
            if flag in self.a:
                c[f] = value
        if "global_batch_size" not in c:
            raise LaunchImportError("--global-batch-size", "missing: the plan needs the global batch")
        tp = c.get("tp", 1)
        if "etp" not in c:
            c["etp"] = tp  # Megatron-LM's default (core_v0.12.1 arguments.py: expert_tensor_parallel_size = tp)
        if self.has("--moe-tp-extend-ep"):
            # MindSpeed-LLM: the TP ranks extend expert parallelism (experts not split by TP)
            if "--expert-tensor-parallel-size" in self.a and c["etp"] != 1:
                raise LaunchImportError("--moe-tp-extend-ep", "contradicts --expert-tensor-parallel-size "
                                                              f"{c['etp']} (the experts are not split by TP)")
            c["ep"], c["etp"] = c.get("ep", 1) * tp, 1
            self.notes.append(f"--moe-tp-extend-ep: expert parallelism {c['ep']} (ep × tp), etp 1")
        if not spec.is_moe:
            c["etp"] = 1
        self._precision(c)
        self._split(c, spec)
        self._recompute(c, spec)
        self._offload(c)
        self._sharding(c)
        self._dtypes(c)
        self._cp(c)
        self._attention(c)
        self._moe(c, spec)
        return c

    def _precision(self, c: dict) -> None:
        if not self.has("--bf16"):
            raise LaunchImportError("--bf16", "missing: without it the run is fp32, which is not modelled")
        fmt = self.a.get("--fp8-format", [None])[0]
        if fmt is not None:
            if fmt not in ("hybrid", "e4m3"):
                raise LaunchImportError("--fp8-format", f"{fmt!r} is not hybrid or e4m3")
            c["precision"] = "fp8"
            recipe = self.a.get("--fp8-recipe", [None])[0]
            if recipe is not None:
                c["fp8_recipe"] = recipe
        elif self.has("--fp8-recipe"):
            self.notes.append("--fp8-recipe ignored without --fp8-format")

    def _split(self, c: dict, spec: ModelSpec) -> None:
        """vpp and the split fields, inverse of split.py (Megatron's flags or layout, MindSpeed's no-op padding)."""
        pp = c.get("pp", 1)
        self.exclusive("--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank")
        self.exclusive("--pipeline-model-parallel-layout", "--decoder-first-pipeline-num-layers")
        self.exclusive("--pipeline-model-parallel-layout", "--num-layers-per-virtual-pipeline-stage")
        self.exclusive("--pipeline-model-parallel-layout", "--noop-layers")
        if self.has("--schedules-method"):
            c["pipeline_schedule"] = self.word("--schedules-method", ("dualpipev",))
        dualpipev = c.get("pipeline_schedule") == "dualpipev"
        if self.has("--pipeline-model-parallel-layout"):
            layout = self.a["--pipeline-model-parallel-layout"][0]
            try:
                stages = parse_layout(layout)
            except LayoutError as exc:
                raise LaunchImportError("--pipeline-model-parallel-layout", str(exc)) from None
            chunks = 2 if dualpipev else 1
            if len(stages) % (pp * chunks):
                raise LaunchImportError("--pipeline-model-parallel-layout", f"{len(stages)} stages do not divide "
                                                                            f"over pp {pp}")
            c["pipeline_layout"], c["vpp"] = layout, 1 if dualpipev else len(stages) // pp
            return
        slots = spec.num_layers + int(c.get("account_for_embedding_in_pipeline_split", False)) + int(
            c.get("account_for_loss_in_pipeline_split", False))
        vstages = self.total if self.has("--noop-layers") else slots
        if self.has("--num-layers-per-virtual-pipeline-stage"):
            per = self.int("--num-layers-per-virtual-pipeline-stage")
            if vstages % (per * pp):
                raise LaunchImportError("--num-layers-per-virtual-pipeline-stage",
                                        f"{per} layers per virtual stage do not divide {vstages} layers over pp {pp}")
            c["vpp"] = vstages // (per * pp)
        else:
            c["vpp"] = self.int("--num-virtual-stages-per-pipeline-rank", 1)
        if dualpipev:
            c["vpp"] = 1
        layer_slots = spec.num_layers + spec.mtp_num_layers + 2  # layers, MTP layers, embedding, loss
        if pp * c["vpp"] * (2 if dualpipev else 1) > layer_slots:
            flag = next((f for f in ("--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank")
                         if self.has(f) and pp <= layer_slots), "--pipeline-model-parallel-size")
            raise LaunchImportError(flag, f"pp·vpp = {pp * c['vpp']:,} virtual stages, but the model has only "
                                          f"{layer_slots} layer slots (every stage holds at least one)")
        for flag, f in (("--decoder-first-pipeline-num-layers", "first_stage_layers"),
                        ("--decoder-last-pipeline-num-layers", "last_stage_layers")):
            if self.has(flag):
                c[f] = self.int(flag, low=0)
        if self.has("--noop-layers") or (self.ms and (c["vpp"] > 1 or dualpipev)):
            self._noop_split(c, spec, 2 * pp if dualpipev else pp * c["vpp"])

    def _noop_split(self, c: dict, spec: ModelSpec, vstages: int) -> None:
        """MindSpeed's no-op padding: each virtual stage holds the real layers among its --num-layers /
        stages slots; the config fields whose split gives those counts (else a layout string)."""
        if self.total % vstages:
            raise LaunchImportError("--num-layers", f"{self.total} layers do not divide over {vstages} virtual stages")
        width = self.total // vstages
        counts = [sum(1 for i in self.real if v * width <= i < (v + 1) * width) for v in range(vstages)]
        self.counts = counts
        for ae, al in product((False, True), repeat=2):
            trial = {**c, "account_for_embedding_in_pipeline_split": ae, "account_for_loss_in_pipeline_split": al}
            try:
                tokens = stage_tokens(TrainingConfig.model_validate(trial), spec)
            except (ValidationError, ValueError, LayoutError):
                continue  # a split this rule cannot build
            if [t.count("t") for t in tokens] == counts:
                c.update(account_for_embedding_in_pipeline_split=ae, account_for_loss_in_pipeline_split=al)
                return
        stages = ["t" * n for n in counts]
        stages[0] = "E" + stages[0]
        stages[-1] += "m" * spec.mtp_num_layers + "L"
        from .split import layout_string

        c["pipeline_layout"] = layout_string(stages)

    def check_split(self, config: TrainingConfig, spec: ModelSpec) -> None:
        """The split as read places every layer (Megatron's own checks on the first/last counts)."""
        try:
            tokens = stage_tokens(config, spec)
        except (ValueError, LayoutError) as exc:
            raise LaunchImportError("--pipeline-model-parallel-size", f"the pipeline split cannot be built: {exc}") from None
        if sum(t.count("t") for t in tokens) != spec.num_layers:
            raise LaunchImportError("--pipeline-model-parallel-layout", f"places {sum(t.count('t') for t in tokens)} "
                                                                        f"layers, the model has {spec.num_layers}")

    def _recompute(self, c: dict, spec: ModelSpec) -> None:
        gran = self.word("--recompute-granularity", ("full", "selective"))
        modules = list(self.a.get("--recompute-modules", []))
        for flag, module in (("--recompute-activation-function", "moe_act"), ("--recompute-mla-up-proj", "mla_up_proj")):
            if self.has(flag):
                modules.append(module)
        if gran == "full":
            if modules:
                raise LaunchImportError("--recompute-granularity", "full contradicts the selective modules "
                                                                   f"({', '.join(modules)})")
            c["recompute"] = "full"
            method = self.word("--recompute-method", ("uniform", "block"))
            n = self.int("--recompute-num-layers", 1)
            if method is None:
                raise LaunchImportError("--recompute-method", "missing: full recompute needs uniform or block")
            if method == "uniform":
                if n != 1:
                    raise LaunchImportError("--recompute-num-layers", f"uniform recompute in groups of {n} layers is "
                                                                      "not modelled (groups of 1 is every layer)")
                return
            c["recompute_num_layers"] = self._block_layers(c, spec, n)
            return
        for flag in ("--recompute-method", "--recompute-num-layers", "--enable-recompute-layers-per-pp-rank"):
            if self.has(flag):
                raise LaunchImportError(flag, "only with --recompute-granularity full")
        if gran == "selective" or modules:
            c["recompute"] = "selective"
            if gran == "selective" and not self.has("--recompute-modules") and not self.ms:
                modules = ["core_attn"] + modules  # Megatron-LM's default module
            elif gran == "selective" and not self.has("--recompute-modules"):
                modules = ["core_attn"] + modules
            c["recompute_modules"] = list(dict.fromkeys(modules))

    def _block_layers(self, c: dict, spec: ModelSpec, n: int) -> int:
        """Block recompute of n layers per model chunk (or per pipeline rank with MindSpeed's
        --enable-recompute-layers-per-pp-rank) as the cost model's layers per stage."""
        if self.has("--enable-recompute-layers-per-pp-rank"):
            return n
        try:
            cfg = TrainingConfig.model_validate({k: v for k, v in c.items() if k != "recompute"})
            from .split import pipeline_split

            chunks = pipeline_split(cfg, spec, self.fw).chunks
        except (ValidationError, ValueError, LayoutError):
            return n * c.get("vpp", 1)
        return max(sum(min(n, k) for k in ch) for ch in chunks)

    def _offload(self, c: dict) -> None:
        if self.has("--offload-modules") and not self.has("--fine-grained-activation-offloading"):
            raise LaunchImportError("--offload-modules", "needs --fine-grained-activation-offloading")
        if self.has("--fine-grained-activation-offloading"):
            c["offload_modules"] = list(self.a.get("--offload-modules", []))
        if self.has("--swap-modules") and not self.has("--swap-attention"):
            raise LaunchImportError("--swap-modules", "needs --swap-attention")
        if self.has("--swap-attention"):
            names = self.a.get("--swap-modules", ["input_norm,self_attention,post_attention_norm"])[0].split(",")
            table = dict(MINDSPEED_SWAP_MODULES)
            bad = [x for x in names if x not in table]
            if bad:
                raise LaunchImportError("--swap-modules", f"{', '.join(bad)}: not one of {', '.join(table)}")
            c["offload_modules"] = [m for x in names for m in table[x]]

    def _sharding(self, c: dict) -> None:
        if self.has("--use-megatron-fsdp"):
            c["data_parallel_sharding_strategy"] = self.word(
                "--data-parallel-sharding-strategy", ("no_shard", "optim", "optim_grads", "optim_grads_params"), "optim_grads_params")
            if self.has("--megatron-fsdp-main-grads-dtype"):
                c["main_grads_dtype"] = self.word("--megatron-fsdp-main-grads-dtype", ("fp32", "bf16"))
        elif self.has("--data-parallel-sharding-strategy"):
            raise LaunchImportError("--data-parallel-sharding-strategy", "needs --use-megatron-fsdp")

    def _dtypes(self, c: dict) -> None:
        if self.has("--use-precision-aware-optimizer"):
            # store_param_remainders: bf16 weights and their 16-bit remainders (options.py _megatron_dtypes)
            c["main_params_dtype"] = self.word("--main-params-dtype", ("fp32", "fp16"), None) or "bf16"
            if c["main_params_dtype"] != "bf16":
                self.notes.append("--main-params-dtype as given (the export plans the remainders, bf16)")
            for flag, f in (("--main-grads-dtype", "main_grads_dtype"), ("--exp-avg-dtype", "exp_avg_dtype"),
                            ("--exp-avg-sq-dtype", "exp_avg_sq_dtype")):
                if self.has(flag):
                    c[f] = self.word(flag, ("fp32", "bf16", "fp16", "fp8"))
        else:
            for flag in ("--main-grads-dtype", "--main-params-dtype", "--exp-avg-dtype", "--exp-avg-sq-dtype"):
                if self.has(flag):
                    raise LaunchImportError(flag, "only with --use-precision-aware-optimizer")
        if self.has("--reuse-fp32-param"):
            c["main_params_dtype"] = "bf16"
        if self.has("--quant-states"):
            self.word("--quant-states", ("fp8",))
            c["exp_avg_dtype"] = c["exp_avg_sq_dtype"] = "fp8"

    def _cp(self, c: dict) -> None:
        self.exclusive("--cp-comm-type", "--context-parallel-algo")
        if self.has("--cp-comm-type"):
            c["cp_comm_type"] = self.word("--cp-comm-type", ("p2p", "a2a", "allgather", "a2a+p2p"))
        if self.has("--context-parallel-algo"):
            by_algo = {v: k for k, v in MINDSPEED_CP_ALGO.items()}
            c["cp_comm_type"] = by_algo[self.word("--context-parallel-algo", tuple(by_algo))]
        if self.has("--hierarchical-context-parallel-sizes") or self.has("--ulysses-degree-in-cp"):
            self.notes.append("the Ulysses degree of a2a+p2p follows from the cluster's scale-up domain in the cost "
                              "model (the script's stated degree is not read)")
        if c.get("cp", 1) == 1 and "cp_comm_type" in c:
            c.pop("cp_comm_type")  # no context parallelism: the algorithm has nothing to do

    def _attention(self, c: dict) -> None:
        if self.ms:
            c["attention_kernel"] = "flash" if self.has("--use-flash-attn") else "unfused"
            return
        backend = self.word("--attention-backend", ("flash", "fused", "unfused", "auto", "local"), "auto")
        if backend == "local":
            raise LaunchImportError("--attention-backend", "local (Megatron's own unfused PyTorch attention) is "
                                                           "not modelled apart from unfused")
        c["attention_kernel"] = "unfused" if backend == "unfused" else "flash"

    def _moe(self, c: dict, spec: ModelSpec) -> None:
        d = self.word("--moe-token-dispatcher-type", ("allgather", "alltoall", "alltoall_seq", "flex"))
        if not spec.is_moe:
            for flag in ("--moe-token-dispatcher-type", "--moe-grouped-gemm", "--overlap-moe-expert-parallel-comm",
                         "--moe-alltoall-overlap-comm", "--moe-fb-overlap", "--moe-hierarchical-alltoallv"):
                if self.has(flag):
                    self.notes.append(f"{flag} ignored: a dense model (no --num-experts)")
            c.pop("moe_a2a_overlap", None)
            c.pop("delay_wgrad_compute", None)
            return
        if not self.has("--moe-grouped-gemm"):
            self.notes.append("no --moe-grouped-gemm: ParaPlan prices the experts as grouped GEMMs")
        hier = self.has("--moe-hierarchical-alltoallv")
        if d == "flex":
            backend = self.a.get("--moe-flex-dispatcher-backend", ["deepep"])[0]
            if backend != "deepep":
                raise LaunchImportError("--moe-flex-dispatcher-backend", f"{backend!r}: only DeepEP is mapped")
            c["moe_a2a_algorithm"] = "hierarchical"  # DeepEP sends one copy per node (table.py ALGORITHMS)
        elif d in (None, "alltoall"):
            if d is None and not self.has("--moe-enable-deepep"):
                d = "allgather"  # Megatron-LM's default dispatcher
                c["moe_token_dispatcher_type"] = d
            elif self.has("--moe-enable-deepep"):
                c["moe_a2a_algorithm"] = "hierarchical"
            else:
                # MindSpeed core_r0.8.0's --moe-hierarchical-alltoallv: Huawei's per-node all-to-all
                c["moe_a2a_algorithm"] = "hierarchical" if hier else "flat"
        else:
            c["moe_token_dispatcher_type"] = d
            if hier:
                raise LaunchImportError("--moe-hierarchical-alltoallv", f"contradicts --moe-token-dispatcher-type {d}")
        if hier:
            self.notes.append("--moe-hierarchical-alltoallv: the hierarchical all-to-all (registered on MindSpeed's "
                              "core_r0.8.0 branches only)")
        if self.has("--moe-fb-overlap") and c.get("pipeline_schedule") != "dualpipev":
            self.notes.append("--moe-fb-overlap without dualpipev: read as the all-to-all overlap")
