"""What the training framework can express: the (layout, option) mask of a space, scored with
``search.frameworks``'s rules on representative configs, and the layouts dropped where it can run none."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from costmodel import TrainingConfig
from costmodel.batch import NO_VALUE
from costmodel.pipeline import unique_rows

from .. import frameworks

from .dimensions import CP_COMM_NAMES, SpaceError
from .splits import _schedule_fields

if TYPE_CHECKING:
    from .core import SearchSpace

# The searches of one plan (a capacity plan's device counts, an RL plan's pools) ask the same verdicts:
# the framework's rules read the config's fields, the model, the framework and the scale-up domain, never
# the device count, dp or the batch (search/frameworks). So the verdicts are kept per context (model,
# framework, domain, precision, pins, constants, option table), shared by every space of that context;
# the last few contexts are kept.
_SHARED_VERDICTS: dict[tuple, dict] = {}
SHARED_CONTEXTS_MAX = 8


class Expressible:
    """``SearchSpace``'s framework mask (a mixin: it reads the space's fields)."""

    def allowed(self, par: dict[str, np.ndarray]) -> np.ndarray:
        """(configs, options) mask for layout columns ``par``: what the framework can express, with TP
        overlap on when tp > 1 and all-to-all overlap on when ep > 1 unless the framework cannot combine
        the overlap with the rest of the option (an off value is dominated only by an expressible on
        value, see the module docstring); a pinned overlap is taken as pinned."""
        tp, ep = np.asarray(par["tp"]), np.asarray(par["ep"])
        groups, inv = self._expressible_groups(par)
        # The mask depends on a config only through its expressible row, tp > 1 and ep > 1: work out each
        # distinct combination once and spread it (millions of configs, a few dozen combinations).
        key, inv = unique_rows([inv, (tp > 1).astype(np.int64), (ep > 1).astype(np.int64)])
        return self._allowed_rows(groups[key[:, 0]], key[:, 1] == 1, key[:, 2] == 1)[inv]

    def _allowed_rows(self, expr: np.ndarray, multi_tp: np.ndarray, multi_ep: np.ndarray) -> np.ndarray:
        """``allowed`` for rows of expressible masks ``expr`` and whether tp > 1, ep > 1 on each row."""
        tp_ov = np.array([o[2] for o in self.options])
        a2a = np.array([o[3] for o in self.options])
        ok = expr.copy()
        if "tp_comm_overlap" not in self.fixed:
            on = self._partner(2)
            beaten = (on >= 0)[None, :] & expr[:, np.maximum(on, 0)]
            ok &= np.where(tp_ov[None, :], multi_tp[:, None], ~multi_tp[:, None] | ~beaten)
        if "moe_a2a_overlap" not in self.fixed:
            # on only where there is a dispatch to hide; off is not dominated where it is on: the
            # overlap holds one more model chunk's activations (pipeline.a2a_overlap_extra_microbatches)
            ok &= ~a2a[None, :] | multi_ep[:, None]
        return ok

    def _partner(self, flag: int) -> np.ndarray:
        """For each option, the index of the same option with overlap ``flag`` (2: TP, 3: all-to-all) on
        (-1 when the space has no such option, or the option has it on already)."""
        index = {o: i for i, o in enumerate(self.options)}
        return np.array([-1 if o[flag] else index.get(o[:flag] + (True,) + o[flag + 1:], -1) for o in self.options])

    def expressible(self, par: dict[str, np.ndarray]) -> np.ndarray:
        """(configs, options) mask of what ``framework`` can express (all True without one). The rules of
        ``search.frameworks`` are scored on representative configs at pp = 1: per distinct (tp, ep, etp)
        and option with cp = 1 and flat dispatch (no option rule reads the algorithms), per distinct (tp,
        cp, ep, etp, dispatch, CP algorithm) with no recompute and no overlap; and the
        split rules per distinct split and option, and per etp and cp under DualPipeV (``split_refusals``
        says no other rule reads the split or fires at pp = 1, and only DualPipeV's read etp and cp)."""
        groups, inv = self._expressible_groups(par)
        return groups[inv]

    def _expressible_groups(self, par: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """``expressible`` as its distinct rows (groups, options) and each config's row index."""
        n = len(par["tp"])
        if self.framework is None or n == 0:
            return np.ones((1, len(self.options)), dtype=bool), np.zeros(n, dtype=np.intp)
        col = lambda *keys: [np.asarray(par[k]).astype(np.int64) for k in keys]  # noqa: E731
        split_keys = ("pp", "vpp", "first_stage_layers", "last_stage_layers", "account_for_embedding",
                      "account_for_loss", "layout_id", "schedule", "etp", "cp")
        parts = [self._rows(col("tp", "ep", "etp"), "options", self._options_row),
                 self._rows(col("tp", "cp", "ep", "etp", "moe_a2a_hierarchical", "cp_comm"), "layout",
                            self._layout_row),
                 self._rows(self._split_key(col(*split_keys)), "split", self._split_row)]
        key, inv = unique_rows([part_inv for _, part_inv in parts])
        groups = parts[0][0][key[:, 0]] & parts[1][0][key[:, 1]] & parts[2][0][key[:, 2]]
        return groups, inv

    @staticmethod
    def _split_key(cols: list[np.ndarray]) -> list[np.ndarray]:
        """The split rules' key columns with etp and cp set to 1 under 1F1B and interleaving (schedule 0):
        only DualPipeV's rules read them (``frameworks._schedule``: cp 1, etp 1 for its overlap), so every
        etp and cp of such a split shares one verdict, a twentieth of the probes of a large space."""
        *rest, schedule, etp, cp = cols
        plain = schedule == 0
        return [*rest, schedule, np.where(plain, 1, etp), np.where(plain, 1, cp)]

    def _rows(self, keys: list[np.ndarray], kind: str, row_fn) -> tuple[np.ndarray, np.ndarray]:
        """Rows of ``row_fn`` per distinct key (remembered) and each config's row index."""
        uniq, inv = unique_rows(keys)
        cache = self._shared_verdicts()
        rows = []
        for i, u in enumerate(uniq):
            if self.check is not None and i % 16 == 0:
                self.check()
            key = (kind, *map(int, u))
            if kind == "split" and key[7] != NO_VALUE:  # a balanced split by its layout: ids are the space's own
                key = (*key[:7], self.layouts[key[7]], *key[8:])
            if key not in cache:
                cache[key] = np.broadcast_to(row_fn(*map(int, u)), (len(self.options),))
            rows.append(cache[key])
        return np.array(rows, dtype=bool), inv

    def _shared_verdicts(self) -> dict:
        """The verdicts of this space's context (``_SHARED_VERDICTS``), keyed by kind and probe key."""
        if "verdicts" not in self._expressible_cache:
            context = (self.spec.model_dump_json(), self.framework, self._domain(), self.precision,
                       repr(sorted(self.fixed.items())), repr(sorted(self.constants.items())), repr(self.options))
            if context not in _SHARED_VERDICTS and len(_SHARED_VERDICTS) >= SHARED_CONTEXTS_MAX:
                _SHARED_VERDICTS.pop(next(iter(_SHARED_VERDICTS)))
            self._expressible_cache["verdicts"] = _SHARED_VERDICTS.setdefault(context, {})
        return self._expressible_cache["verdicts"]

    def _option_fields(self, opt: int) -> dict:
        rec, dist, tp_ov, a2a = self.options[opt]
        return {"recompute_modules": None, "recompute_num_layers": None, "offload_modules": None, **rec.fields(),
                "distributed_optimizer": bool(dist), "tp_comm_overlap": bool(tp_ov), "moe_a2a_overlap": bool(a2a)}

    def _probe(self, **fields) -> TrainingConfig:
        """A representative config (no validation: every value comes from the space)."""
        if "probe" not in self._expressible_cache:
            base = {"global_batch_size": self.global_batch_size, "precision": self.precision,
                    "overlap_grad_reduce": self.fixed.get("overlap_grad_reduce", True),
                    "overlap_param_gather": self.fixed.get("overlap_param_gather", True), **self.constants}
            if "sequence_parallel" in self.fixed:
                base["sequence_parallel"] = self.fixed["sequence_parallel"]
            if self.constants.get("delay_wgrad_compute"):  # pinned with the overlap (_constants)
                base["moe_a2a_overlap"] = True
            self._expressible_cache["probe"] = TrainingConfig.model_validate(base)
        return self._expressible_cache["probe"].model_copy(update=fields)

    def _domain(self) -> int:
        return int(self.profile.fact("scale_up_domain"))

    def _options_row(self, tp: int, ep: int, etp: int) -> np.ndarray:
        return np.array([not frameworks.refusals(self._probe(tp=tp, ep=ep, etp=etp, moe_a2a_algorithm="flat",
                                                             **self._option_fields(o)),
                                                 self.spec, self.framework, self._domain(), split_rules=False)
                         for o in range(len(self.options))])

    def _layout_row(self, tp: int, cp: int, ep: int, etp: int, hierarchical: int, cp_comm: int) -> bool:
        cfg = self._probe(tp=tp, cp=cp, ep=ep, etp=etp, moe_a2a_algorithm="hierarchical" if hierarchical else "flat",
                          cp_comm_type=CP_COMM_NAMES[cp_comm])
        return not frameworks.refusals(cfg, self.spec, self.framework, self._domain(), split_rules=False)


    def _split_row(self, pp, vpp, first, last, acc_emb, acc_loss, layout_id, schedule, etp, cp) -> np.ndarray:
        # etp and cp: MindSpeed's DualPipeV needs cp 1, and etp 1 for its forward-backward overlap
        # (frameworks._schedule)
        split = {"pp": pp, "vpp": vpp, "etp": etp, "cp": cp, "account_for_embedding_in_pipeline_split": bool(acc_emb),
                 "account_for_loss_in_pipeline_split": bool(acc_loss), **_schedule_fields(self.fixed, schedule)}
        if first != NO_VALUE:
            split["first_stage_layers"] = first
        if last != NO_VALUE:
            split["last_stage_layers"] = last
        if layout_id != NO_VALUE:
            split["pipeline_layout"] = self.layouts[layout_id]
        # split_refusals never reads offload_modules: options that differ only in it share one verdict,
        # which halves the probes where the space offers offload plans
        layout = frameworks.pipeline_split(self._probe(**split), self.spec, self.framework)  # the same for all
        verdict = {o: not frameworks.split_refusals(self._probe(**split, **self._option_fields(o)), self.spec,
                                                    self.framework, layout) for o in set(self.offload_counterpart)}
        return np.array([verdict[o] for o in self.offload_counterpart])


def _keep_expressible(space: SearchSpace) -> None:
    """Drop the layouts the framework can run with no option; none left is an input error naming why."""
    mask = space._option_mask()
    keep = mask.any(axis=1)
    if not keep.any():
        row = {k: v[0].item() for k, v in space.parallel.items()}
        cfg = TrainingConfig.model_validate(space._row_config(row, 0))
        reasons = frameworks.refusals(cfg, space.spec, space.framework, int(space.profile.fact("scale_up_domain")))
        first = reasons[0] if reasons else None
        field = f"fix.{first.field}" if first is not None and first.field in space.fixed else "framework"
        raise SpaceError(field, f"{frameworks.LABELS[space.framework]} cannot express any config of this search"
                                + (f" ({first})" if first is not None else ""))
    space.parallel = {k: v[keep] for k, v in space.parallel.items()}
    space._mask_cache = (space.parallel, mask[keep])
