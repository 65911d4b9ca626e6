"""Configs out of a space: batches of cost-model columns from layout rows and option indices (the
enumeration) or from per-dimension choices (the samplers), and the config dicts of single pairs."""

from __future__ import annotations


import numpy as np

from costmodel import ConfigBatch
from costmodel.batch import (ATTENTION_KERNEL_CODES, CP_COMM_CODES, DISPATCHER_CODES, DTYPE_BYTES, EMA_CODES,
                             FP8_RECIPE_CODES, NO_VALUE, OFFLOAD_BITS, PRECISION_CODES, RECOMPUTE_CODES,
                             SCHEDULE_CODES, SHARDING_CODES, modules_mask)

from .dimensions import CP_COMM_NAMES, SPLIT_FIELDS
from .splits import _overlap_column, _schedule_fields, _split_fields


class Columns:
    """``SearchSpace``'s batch and config construction (a mixin: it reads the space's fields)."""

    def layout_index(self, layout: str) -> int:
        """The index of a ``pipeline_layout`` string in ``layouts`` (added if new)."""
        if layout not in self.layouts:
            self.layouts.append(layout)
        return self.layouts.index(layout)

    def make_batch(self, rows: np.ndarray, opts: np.ndarray) -> ConfigBatch:
        """Configs from layout indices and option indices (arrays of equal length)."""
        return self._columns_batch({k: v[rows] for k, v in self.parallel.items()}, opts)

    def _columns_batch(self, par: dict[str, np.ndarray], opts: np.ndarray) -> ConfigBatch:
        n = len(opts)
        opt_cols = self._option_columns()
        o = {k: v[opts] for k, v in opt_cols.items()}
        const = lambda value, dtype=np.int64: np.full(n, value, dtype=dtype)  # noqa: E731
        f = self.fixed
        return ConfigBatch(
            tp=par["tp"], pp=par["pp"], vpp=par["vpp"], cp=par["cp"], ep=par["ep"], etp=par["etp"],
            dp=const(NO_VALUE), micro_batch_size=par["micro_batch_size"],
            global_batch_size=const(self.global_batch_size),
            sequence_parallel=np.full(n, f["sequence_parallel"]) if "sequence_parallel" in f else par["tp"] > 1,
            tp_comm_overlap=o["tp_comm_overlap"], recompute=o["recompute"],
            recompute_modules=o["recompute_modules"], recompute_num_layers=o["recompute_num_layers"],
            distributed_optimizer=o["distributed_optimizer"],
            overlap_grad_reduce=_overlap_column(f, "overlap_grad_reduce", par["schedule"]),
            overlap_param_gather=_overlap_column(f, "overlap_param_gather", par["schedule"]),
            first_stage_layers=par["first_stage_layers"], last_stage_layers=par["last_stage_layers"],
            account_for_embedding=par["account_for_embedding"], account_for_loss=par["account_for_loss"],
            layout_id=par["layout_id"], precision=const(PRECISION_CODES[self.precision]),
            moe_a2a_overlap=o["moe_a2a_overlap"],
            moe_load_imbalance=self._imbalance_column(par["ep"]), layouts=self.layouts,
            moe_a2a_hierarchical=np.asarray(par["moe_a2a_hierarchical"], dtype=bool),
            cp_comm=np.asarray(par["cp_comm"], dtype=np.int64), schedule=np.asarray(par["schedule"], dtype=np.int64),
            offload_modules=o["offload_modules"], moe_expert_replicas=const(self.routing.get("moe_expert_replicas", 0)),
            **self._constant_columns(n))

    def _imbalance_column(self, ep: np.ndarray) -> np.ndarray:
        """max/mean tokens per EP rank of each config: the search's constant, or its routing's at that ep."""
        if not self.imbalance_by_ep:
            return np.full(len(ep), self.moe_load_imbalance, dtype=np.float64)
        lut = np.ones(max(self.imbalance_by_ep) + 1)  # an ep that does not divide the experts is invalid anyway
        for e, imb in self.imbalance_by_ep.items():
            lut[e] = imb
        return lut[ep]

    def _constant_columns(self, n: int) -> dict[str, np.ndarray]:
        """The batch columns of the per-search constants (``constants``; each column's default otherwise)."""
        c, out = self.constants, {}
        for key in ("main_grads", "main_params", "exp_avg", "exp_avg_sq"):
            if f"{key}_dtype" in c:
                out[f"{key}_bytes"] = np.full(n, DTYPE_BYTES[c[f"{key}_dtype"]], dtype=np.float64)
        if "data_parallel_sharding_strategy" in c:
            out["sharding"] = np.full(n, SHARDING_CODES[c["data_parallel_sharding_strategy"]], dtype=np.int64)
        if "moe_token_dispatcher_type" in c:
            out["moe_dispatcher"] = np.full(n, DISPATCHER_CODES[c["moe_token_dispatcher_type"]], dtype=np.int64)
        if "attention_kernel" in c:
            out["attention_kernel"] = np.full(n, ATTENTION_KERNEL_CODES[c["attention_kernel"]], dtype=np.int64)
        if c.get("fp8_recipe") is not None:
            out["fp8_recipe"] = np.full(n, FP8_RECIPE_CODES[c["fp8_recipe"]], dtype=np.int64)
        if c.get("delay_wgrad_compute") is not None:
            out["delay_wgrad"] = np.full(n, int(c["delay_wgrad_compute"]), dtype=np.int64)
        if "activation_func_fp8_input_store" in c:
            out["act_fp8_input_store"] = np.full(n, bool(c["activation_func_fp8_input_store"]))
        if "parameter_ema" in c:
            out["parameter_ema"] = np.full(n, EMA_CODES[c["parameter_ema"]], dtype=np.int64)
        if "mla_fa_without_pad" in c:
            out["mla_fa_without_pad"] = np.full(n, bool(c["mla_fa_without_pad"]))
        return out

    def _option_columns(self) -> dict[str, np.ndarray]:
        rec = [o[0] for o in self.options]
        return {
            "recompute": np.array([RECOMPUTE_CODES[r.recompute] for r in rec], dtype=np.int64),
            "recompute_modules": np.array([modules_mask(r.modules or ("core_attn",)) for r in rec], dtype=np.int64),
            "recompute_num_layers": np.array([NO_VALUE if r.num_layers is None else r.num_layers for r in rec],
                                             dtype=np.int64),
            "offload_modules": np.array([modules_mask(r.offload or (), OFFLOAD_BITS) for r in rec], dtype=np.int64),
            "distributed_optimizer": np.array([o[1] for o in self.options]),
            "tp_comm_overlap": np.array([o[2] for o in self.options]),
            "moe_a2a_overlap": np.array([o[3] for o in self.options]),
        }

    def config(self, row: int, opt: int) -> dict:
        """The training config (contract field names) of one layout/option pair."""
        return self._row_config({k: v[row].item() for k, v in self.parallel.items()}, opt)

    def _row_config(self, p: dict, opt: int) -> dict:
        rec, dist, tp_ov, a2a = self.options[opt]
        cfg = {"tp": p["tp"], "pp": p["pp"], "vpp": p["vpp"], "cp": p["cp"], "ep": p["ep"], "etp": p["etp"],
               "dp": self.devices // (p["tp"] * p["pp"] * p["cp"]),
               "micro_batch_size": p["micro_batch_size"], "global_batch_size": self.global_batch_size,
               "sequence_parallel": self.fixed.get("sequence_parallel", p["tp"] > 1),
               "tp_comm_overlap": bool(tp_ov), **rec.fields(), "distributed_optimizer": bool(dist),
               "overlap_grad_reduce": self.fixed.get("overlap_grad_reduce", True),
               "overlap_param_gather": self.fixed.get("overlap_param_gather", True),
               "precision": self.precision, "moe_a2a_overlap": bool(a2a),
               **(self.routing if self.imbalance_by_ep else {"moe_load_imbalance": self.moe_load_imbalance,
                                                             **self.routing}),
               **self.constants}
        # the searched algorithms: stated for MoE models (the dispatch) and with cp > 1, or when pinned
        if self.spec.is_moe or "moe_a2a_algorithm" in self.fixed:
            cfg["moe_a2a_algorithm"] = "hierarchical" if p["moe_a2a_hierarchical"] else "flat"
        if p["cp"] > 1 or "cp_comm_type" in self.fixed:
            cfg["cp_comm_type"] = CP_COMM_NAMES[int(p["cp_comm"])]
        if p["layout_id"] != NO_VALUE:
            cfg["pipeline_layout"] = self.layouts[p["layout_id"]]
        if p["first_stage_layers"] != NO_VALUE:
            cfg["first_stage_layers"] = p["first_stage_layers"]
        if p["last_stage_layers"] != NO_VALUE:
            cfg["last_stage_layers"] = p["last_stage_layers"]
        if p["account_for_embedding"]:
            cfg["account_for_embedding_in_pipeline_split"] = True
        if p["account_for_loss"]:
            cfg["account_for_loss_in_pipeline_split"] = True
        cfg.update(_schedule_fields(self.fixed, p["schedule"]))
        return cfg

    def choice_columns(self, choices: list[dict]) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        """Layout columns, option indices and a split-accepted mask for per-dimension choices (what a
        sampler suggests); choices need not be valid, the cost model says which are."""
        par = {k: np.array([c[k] for c in choices], dtype=np.int64)
               for k in ("tp", "cp", "pp", "vpp", "ep", "etp", "micro_batch_size")}
        splits = []
        for c in choices:
            splits.append({k: self.fixed[k] for k in SPLIT_FIELDS if k in self.fixed} if c["split"] == "fixed"
                          else _split_fields(self.spec, c["pp"], c["vpp"], c["split"]))
        split_ok = np.array([f is not None for f in splits], dtype=bool)
        splits = [f or {} for f in splits]
        par["first_stage_layers"] = np.array([f.get("first_stage_layers", NO_VALUE) for f in splits], dtype=np.int64)
        par["last_stage_layers"] = np.array([f.get("last_stage_layers", NO_VALUE) for f in splits], dtype=np.int64)
        par["account_for_embedding"] = np.array(
            [f.get("account_for_embedding_in_pipeline_split", False) for f in splits], dtype=bool)
        par["account_for_loss"] = np.array(
            [f.get("account_for_loss_in_pipeline_split", False) for f in splits], dtype=bool)
        par["layout_id"] = np.array([self.layout_index(f["pipeline_layout"]) if "pipeline_layout" in f else NO_VALUE
                                     for f in splits], dtype=np.int64)
        par["schedule"] = np.array([SCHEDULE_CODES[f.get("pipeline_schedule") or "1f1b"] for f in splits],
                                   dtype=np.int64)
        a2a, cpc = self.resting("moe_a2a_algorithm"), self.resting("cp_comm_type")
        par["moe_a2a_hierarchical"] = np.array([c.get("moe_a2a_algorithm", a2a) == "hierarchical" for c in choices],
                                               dtype=bool)
        par["cp_comm"] = np.array([CP_COMM_CODES[c.get("cp_comm_type", cpc)] for c in choices], dtype=np.int64)
        opts = np.array([c["option"] for c in choices], dtype=np.int64)
        return par, opts, split_ok

    def choice_batch(self, choices: list[dict]) -> tuple[ConfigBatch, np.ndarray]:
        par, opts, split_ok = self.choice_columns(choices)
        return self._columns_batch(par, opts), split_ok

    def choice_config(self, choice: dict) -> dict:
        par, opts, _ = self.choice_columns([choice])
        return self._row_config({k: v[0].item() for k, v in par.items()}, int(opts[0]))
