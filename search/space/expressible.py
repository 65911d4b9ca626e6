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
from .verdicts import Verdicts, shared

if TYPE_CHECKING:
    from .core import SearchSpace

# The searches of one plan (a capacity plan's device counts, an RL plan's pools) ask the same verdicts:
# the framework's rules read the config's fields, the model, the framework and the scale-up domain, never
# the device count, dp or the batch (search/frameworks). So the verdicts are kept per context (model,
# framework, domain, precision, pins, constants, option table), shared by every space of that context;
# the last few contexts are kept.
_SHARED_VERDICTS: dict[tuple, dict] = {}
SHARED_CONTEXTS_MAX = 8


# The option fields a probe states (``Expressible._option_values``), in this order.
OPTION_FIELDS = ("recompute", "recompute_modules", "recompute_num_layers", "offload_modules", "distributed_optimizer",
                 "tp_comm_overlap", "moe_a2a_overlap")


class Expressible:
    """``SearchSpace``'s framework mask (a mixin: it reads the space's fields)."""

    def allowed(self, par: dict[str, np.ndarray]) -> np.ndarray:
        """(configs, options) mask for layout columns ``par``: what the framework can express, with TP
        overlap on when tp > 1 and all-to-all overlap on when ep > 1 unless the framework cannot combine
        the overlap with the rest of the option (an off value is dominated only by an expressible on
        value, see the module docstring); a pinned overlap is taken as pinned."""
        return unpack_options(self.allowed_bits(par), len(self.options))

    def allowed_bits(self, par: dict[str, np.ndarray]) -> np.ndarray:
        """``allowed`` with each config's options packed eight to a byte (``np.packbits`` along the options).

        The expressible mask is the product of three parts, each a small table (distinct keys, options) and
        each config's row in it (``_expressible_parts``): the option rules per (tp, ep, etp), which also
        decide tp > 1 and ep > 1, the layout rules (one verdict per row) and the split rules. The overlap
        rules only combine columns of those rows, so they are applied to the small tables, and each config's
        mask is gathered from them, packed: a config costs a few bytes of gathers, not a pass per rule."""
        n = len(par["tp"])
        (opt, i_opt, tp, ep), rest = self._expressible_parts(par)
        tp_ov = np.array([o[2] for o in self.options])
        a2a = np.array([o[3] for o in self.options])
        multi_tp, multi_ep = (tp > 1)[:, None], (ep > 1)[:, None]
        head = opt.copy()
        beaten = None
        if "tp_comm_overlap" not in self.fixed:
            head &= ~tp_ov[None, :] | multi_tp
            # an off value is dominated where its on partner is expressible: every part at the partner's
            # column, with tp > 1
            on = self._partner(2)
            at = np.maximum(on, 0)
            beaten = (opt[:, at] & (on >= 0)[None, :] & multi_tp, i_opt,
                      [(table[:, at] if table.ndim == 2 else table, inv) for table, inv in rest])
        if "moe_a2a_overlap" not in self.fixed:
            # on only where there is a dispatch to hide; off is not dominated where it is on: the
            # overlap holds one more model chunk's activations (pipeline.a2a_overlap_extra_microbatches)
            head &= ~a2a[None, :] | multi_ep
        ok = _gather_and(head, i_opt, rest, n)
        if beaten is not None:
            ok &= ~_gather_and(*beaten, n)  # the padding bits stay 0: ok's are
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
        says no other rule reads the split or fires at pp = 1, and only DualPipeV's read etp and cp). Each
        rule runs once per path through it (``Verdicts``), not once per question."""
        (opt, i_opt, _, _), rest = self._expressible_parts(par)
        return unpack_options(_gather_and(opt, i_opt, rest, len(par["tp"])), len(self.options))

    def _expressible_parts(self, par: dict[str, np.ndarray]):
        """The expressible mask's parts: ((option table, each config's row, each row's tp and ep), [(table,
        each config's row)] of the layout part (one verdict per row) and the split part). Without a
        framework the option table is all True and there are no other parts."""
        col = lambda *keys: [np.asarray(par[k]).astype(np.int64) for k in keys]  # noqa: E731
        n = len(par["tp"])
        if n == 0:
            return (np.ones((0, len(self.options)), dtype=bool), np.zeros(0, dtype=np.intp), np.zeros(0, np.int64),
                    np.zeros(0, np.int64)), []
        if self.framework is None:
            keys, inv = unique_rows(col("tp", "ep"))
            return (np.ones((len(keys), len(self.options)), dtype=bool), inv, keys[:, 0], keys[:, 1]), []
        split_keys = ("pp", "vpp", "first_stage_layers", "last_stage_layers", "account_for_embedding",
                      "account_for_loss", "layout_id", "schedule", "etp", "cp")
        keys, opt, i_opt = self._rows(col("tp", "ep", "etp"), "options", self._options_row)
        layout = self._rows(col("tp", "cp", "ep", "etp", "moe_a2a_hierarchical", "cp_comm"), "layout",
                            self._layout_row)
        split = self._rows(self._split_key(col(*split_keys)), "split", self._split_row)
        return (opt, i_opt, keys[:, 0], keys[:, 1]), [layout[1:], split[1:]]

    @staticmethod
    def _split_key(cols: list[np.ndarray]) -> list[np.ndarray]:
        """The split rules' key columns with etp and cp set to 1 under 1F1B and interleaving (schedule 0):
        only DualPipeV's rules read them (``frameworks._schedule``: cp 1, etp 1 for its overlap), so every
        etp and cp of such a split shares one verdict, a twentieth of the probes of a large space."""
        *rest, schedule, etp, cp = cols
        plain = schedule == 0
        return [*rest, schedule, np.where(plain, 1, etp), np.where(plain, 1, cp)]

    def _rows(self, keys: list[np.ndarray], kind: str, row_fn) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The distinct keys, the rows of ``row_fn`` per distinct key (remembered; a row is one verdict
        per option, or one for all) and each config's row index."""
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
                cache[key] = row_fn(*map(int, u))
            rows.append(cache[key])
        return uniq, np.array(rows, dtype=bool), inv

    def _option_values(self) -> list[tuple]:
        """Per option, its ``OPTION_FIELDS`` values (a list field as a tuple, None where unset)."""
        if "option_values" not in self._expressible_cache:
            out = []
            for rec, dist, tp_ov, a2a in self.options:
                fields = {"recompute_modules": None, "recompute_num_layers": None, "offload_modules": None,
                          **rec.fields(), "distributed_optimizer": bool(dist), "tp_comm_overlap": bool(tp_ov),
                          "moe_a2a_overlap": bool(a2a)}
                out.append(tuple(tuple(v) if isinstance(v, list) else v for v in map(fields.get, OPTION_FIELDS)))
            self._expressible_cache["option_values"] = out
        return self._expressible_cache["option_values"]

    def _shared_verdicts(self) -> dict:
        """The verdicts of this space's context (``_SHARED_VERDICTS``), keyed by kind and probe key."""
        if "verdicts" not in self._expressible_cache:
            context = (self.spec.model_dump_json(), self.framework, self._domain(), self.precision,
                       repr(sorted(self.fixed.items())), repr(sorted(self.constants.items())), repr(self.options))
            if context not in _SHARED_VERDICTS and len(_SHARED_VERDICTS) >= SHARED_CONTEXTS_MAX:
                _SHARED_VERDICTS.pop(next(iter(_SHARED_VERDICTS)))
            self._expressible_cache["verdicts"] = _SHARED_VERDICTS.setdefault(context, {})
        return self._expressible_cache["verdicts"]

    def _probe_fields(self) -> dict:
        """The field values of the representative config the probes update (validated once): the search's
        batch, precision and constants, pp = 1 and the rest at their defaults."""
        if "probe" not in self._expressible_cache:
            base = {"global_batch_size": self.global_batch_size, "precision": self.precision,
                    "overlap_grad_reduce": self.fixed.get("overlap_grad_reduce", True),
                    "overlap_param_gather": self.fixed.get("overlap_param_gather", True), **self.constants}
            if "sequence_parallel" in self.fixed:
                base["sequence_parallel"] = self.fixed["sequence_parallel"]
            if self.constants.get("delay_wgrad_compute"):  # pinned with the overlap (_constants)
                base["moe_a2a_overlap"] = True
            self._expressible_cache["probe"] = dict(TrainingConfig.model_validate(base))
        return self._expressible_cache["probe"]

    def _expressible_verdicts(self, kind: str, names: tuple[str, ...], **fields) -> Verdicts:
        """The remembered ``Verdicts`` (named ``kind``) that a probe with ``fields`` set and ``names`` varied
        is expressible, without the split's rules. The probes hold the base's split (pp = 1): one
        ``pipeline_split`` serves them all."""
        key = ("verdicts", kind)
        if key not in self._expressible_cache:
            base = {**self._probe_fields(), **fields}
            spec, framework, domain = self.spec, self.framework, self._domain()
            split = shared(lambda cfg: frameworks.pipeline_split(cfg, spec, framework), base, names)
            rule = lambda cfg: not frameworks.refusals(cfg, spec, framework, domain, split_rules=False,  # noqa: E731
                                                       split=split)
            self._expressible_cache[key] = Verdicts(rule, base, names)
        return self._expressible_cache[key]

    def _domain(self) -> int:
        return int(self.profile.fact("scale_up_domain"))

    def _options_row(self, tp: int, ep: int, etp: int) -> np.ndarray:
        verdicts = self._expressible_verdicts("options", ("tp", "ep", "etp") + OPTION_FIELDS, moe_a2a_algorithm="flat")
        return np.array([verdicts((tp, ep, etp) + o) for o in self._option_values()], dtype=bool)

    def _layout_row(self, tp: int, cp: int, ep: int, etp: int, hierarchical: int, cp_comm: int) -> bool:
        verdicts = self._expressible_verdicts("layout", ("tp", "cp", "ep", "etp", "moe_a2a_algorithm", "cp_comm_type"))
        return verdicts((tp, cp, ep, etp, "hierarchical" if hierarchical else "flat", CP_COMM_NAMES[cp_comm]))

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
        base = {**self._probe_fields(), **split}
        spec, framework = self.spec, self.framework
        layout = shared(lambda cfg: frameworks.pipeline_split(cfg, spec, framework), base, OPTION_FIELDS)
        verdicts = Verdicts(lambda cfg: not frameworks.split_refusals(cfg, spec, framework, layout), base,
                            OPTION_FIELDS)
        return np.array([verdicts(o) for o in self._option_values()], dtype=bool)


def _gather_and(head: np.ndarray, i_head: np.ndarray, rest: list[tuple[np.ndarray, np.ndarray]], n: int) -> np.ndarray:
    """(n, options / 8) packed: row ``i_head`` of ``head`` and of each (table, index) of ``rest`` (a 1-D
    table: one value for the whole row), and-ed."""
    out = np.packbits(head, axis=1)[i_head] if len(head) else np.zeros((n, (head.shape[1] + 7) // 8), np.uint8)
    for table, inv in rest:
        if table.ndim == 1:
            out *= table[inv][:, None]
        else:
            out &= np.packbits(table, axis=1)[inv]
    return out


def unpack_options(bits: np.ndarray, options: int) -> np.ndarray:
    """The (configs, options) bool mask of packed rows ``bits``."""
    return np.unpackbits(bits, axis=1, count=options).view(bool)


def _keep_expressible(space: SearchSpace) -> None:
    """Drop the layouts the framework can run with no option; none left is an input error naming why."""
    bits = space.allowed_bits(space.parallel)
    keep = bits.any(axis=1)
    if not keep.any():
        row = {k: v[0].item() for k, v in space.parallel.items()}
        cfg = TrainingConfig.model_validate(space._row_config(row, 0))
        reasons = frameworks.refusals(cfg, space.spec, space.framework, int(space.profile.fact("scale_up_domain")))
        first = reasons[0] if reasons else None
        field = f"fix.{first.field}" if first is not None and first.field in space.fixed else "framework"
        raise SpaceError(field, f"{frameworks.LABELS[space.framework]} cannot express any config of this search"
                                + (f" ({first})" if first is not None else ""))
    space.parallel = {k: v[keep] for k, v in space.parallel.items()}
    space._mask_cache = (space.parallel, unpack_options(bits[keep], len(space.options)))
