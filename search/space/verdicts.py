"""A framework rule's verdict on many probe configs, worked out once per path the rule takes.

The space's framework mask asks ``search.frameworks`` about tens of thousands of representative configs
that differ in a few fields (the parallel sizes, the memory plan, the overlaps). The rules read a config
through its fields and properties only, and are deterministic: two configs that agree on every field one
run of a rule read take the same path through it and get the same verdict. ``Verdicts`` runs the rule on a
view of the probe's field values that notes the first read of each field that varies between probes, and
files the verdict in a tree keyed by those reads, in the order the rule made them. A later probe walks the
tree (one dict look-up per varying field the rule reads on its path) and the rule runs again only where a
probe takes a path no earlier one took: the verdicts are the rule's own, with no copy of what it reads.

The view holds the values a ``TrainingConfig`` would hold (a validated base updated without validation, as
``model_copy(update=...)`` does) and computes the model's properties from them; a rule that reads anything
else of the config (a method, an unknown name) raises ``AttributeError`` instead of being remembered wrongly.
"""

from __future__ import annotations

from typing import Callable

from costmodel import TrainingConfig

# The properties of TrainingConfig, evaluated on the view so that the fields they read are noted too.
_PROPERTIES = {name: p for name, p in vars(TrainingConfig).items() if isinstance(p, property)}


class _Reads:
    """Field values read as attributes, noting the first read of each varying field (by its index)."""

    __slots__ = ("_fields", "_varying", "order")

    def __init__(self, fields: dict, varying: dict[str, int]):
        self._fields, self._varying, self.order = fields, varying, []

    def __getattr__(self, name: str):
        if name in self._fields:
            i = self._varying.get(name)
            if i is not None and i not in self.order:
                self.order.append(i)
            return self._fields[name]
        prop = _PROPERTIES.get(name)
        if prop is None:
            raise AttributeError(f"a probe config answers TrainingConfig's fields and properties only, not {name!r}")
        return prop.fget(self)


def shared(fn: Callable[[object], object], base: dict, names: tuple[str, ...]):
    """``fn`` of the config ``base``, for every probe that varies only ``names`` (a value computed once, such
    as the pipeline split the rules take): ``RuntimeError`` if ``fn`` reads one of them."""
    view = _Reads(base, {n: i for i, n in enumerate(names)})
    value = fn(view)
    if view.order:
        raise RuntimeError(f"{getattr(fn, '__name__', fn)} reads {names[view.order[0]]}, which the probes vary")
    return value


class _Node:
    """A tree node: the index of the varying field the rule reads next and the node after each value of
    it, or at a leaf (``read`` -1) the verdict."""

    __slots__ = ("read", "next", "verdict")

    def __init__(self, read: int, verdict=None):
        self.read, self.next, self.verdict = read, {}, verdict


class Verdicts:
    """``rule(config)`` for probe configs ``base`` updated with values of the fields ``names``.

    Call it with one value per name (hashable: a list field's value as a tuple, None for none); the rule
    sees the list. Each verdict is the rule's on that probe (see the module docstring)."""

    def __init__(self, rule: Callable[[object], object], base: dict, names: tuple[str, ...]):
        self.rule, self.base, self.names = rule, base, names
        self._index = {n: i for i, n in enumerate(names)}
        self._top: dict = {}  # {None: root}
        self.runs = 0  # how many times the rule ran (the rest were looked up)

    def __call__(self, values: tuple):
        links, key = self._top, None
        while True:
            node = links.get(key)
            if node is None:
                return self._run(values)
            if node.read < 0:
                return node.verdict
            links, key = node.next, values[node.read]

    def _run(self, values: tuple):
        update = {n: list(v) if isinstance(v, tuple) else v for n, v in zip(self.names, values)}
        view = _Reads({**self.base, **update}, self._index)
        verdict = self.rule(view)
        self.runs += 1
        links, key = self._top, None
        for i in view.order:
            node = links.get(key)
            if node is None:
                node = links[key] = _Node(i)
            elif node.read != i:  # the same values read in another order: not a deterministic rule
                raise RuntimeError(f"the rule read {self.names[i]} where it read {self.names[node.read]} before "
                                   "on the same values")
            links, key = node.next, values[i]
        if key in links:  # a path that ended here before goes on now, or the reverse
            raise RuntimeError("the rule read other fields on the same values: not a deterministic rule")
        links[key] = _Node(-1, verdict)
        return verdict
