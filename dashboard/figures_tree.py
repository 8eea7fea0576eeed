"""The boxes of the module treemap: each module's size, what it holds itself, and storage shared between modules.

A treemap with ``branchvalues="total"`` needs every box to be at least the sum of the boxes inside it, and
draws whatever a parent holds beyond its children as blank space. Two things in the layers table break that
naive picture:

- Weight columns (``weight_bytes``, ``weight_grad_bytes``) count the *unique* storages of a module's subtree
  (``memprof.analysis.layers.subtree_bytes``), so a weight shared by two modules (GPT-2's ``lm_head`` ties
  ``transformer.wte``'s) is in both children and once in their parent: the children sum to more than the
  parent. Here it is counted once, at the module that comes first in forward order; a later one shows only
  what is not shared, and its hover says how much it shares.
- What a container holds beyond its children (its own parameters, its own allocations) gets a box of its own,
  labelled ``(own)``, instead of blank space.

Pure functions of the layers frame; :func:`dashboard.figures.layer_tree_figure` draws the boxes.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

#: Columns that count unique storages per subtree: a storage shared by two modules is in each one's figure.
SUBTREE_UNIQUE_COLUMNS = ("weight_bytes", "weight_grad_bytes")
#: Id prefixes: modules are ``m:<name>`` (the root's name is empty), own boxes ``o:<name>``.
MODULE_ID, OWN_ID = "m:", "o:"


@dataclass(frozen=True)
class TreeBox:
    """One box of the treemap.

    Attributes:
        id: ``m:<module>`` for a module, ``o:<module>`` for what a module holds beside its children.
        parent: the id of the enclosing box (``""`` for the root).
        module: the qualified module name.
        value_bytes: the box's size.
        shared_bytes: for a module, bytes left out because an earlier module already counts them (a tied weight).
        own: whether this is a module's ``(own)`` box.
    """

    id: str
    parent: str
    module: str
    value_bytes: int
    shared_bytes: int = 0
    own: bool = False


def _structure(layers: pd.DataFrame, column: str) -> tuple[dict[str, int], dict[str, list[str]]]:
    """Each module's own figure and its children in forward order (orphans hang under the root)."""
    known = set(layers["module"])
    order = layers["order"] if "order" in layers.columns else pd.Series(range(len(layers)), index=layers.index)
    rows = sorted(zip(order, layers["module"], layers["parent"], layers[column]), key=lambda r: (int(r[0]), r[1]))
    figure = {module: int(value) for _, module, _, value in rows}
    children: dict[str, list[str]] = {}
    for _, module, parent, _ in rows:
        if module != "":
            children.setdefault(parent if parent in known else "", []).append(module)
    return figure, children


def _totals(figure: dict[str, int], children: dict[str, list[str]], unique: bool) -> dict[str, int]:
    """Each module's box before sharing is resolved: its own figure, or at least its children's sum."""
    totals: dict[str, int] = {}

    def visit(module: str) -> int:
        below = sum(visit(child) for child in children.get(module, []))
        if unique and module in figure:  # the subtree's unique bytes: what its children share is in it once
            totals[module] = figure[module]
        else:  # an additive figure (or a missing root row) covers its children at least
            totals[module] = max(figure.get(module, 0), below)
        return totals[module]

    visit("")
    return totals


def tree_boxes(layers: pd.DataFrame, column: str) -> list[TreeBox]:
    """The treemap's boxes for one iteration's layers, sized by ``column``, root first.

    Every box is at least the sum of the boxes inside it; a module whose figure would push its siblings past
    their parent (a storage it shares with an earlier sibling's subtree) is cut to what is left, the cut said
    in ``shared_bytes``; what a module holds beyond its children is an ``(own)`` box.
    """
    if layers.empty:
        return []
    figure, children = _structure(layers, column)
    totals = _totals(figure, children, column in SUBTREE_UNIQUE_COLUMNS)
    boxes: list[TreeBox] = []

    def place(module: str, parent_id: str, room: int) -> int:
        shown = min(totals[module], room)
        box_id = MODULE_ID + module
        boxes.append(TreeBox(box_id, parent_id, module, shown, shared_bytes=totals[module] - shown))
        left = shown
        for child in children.get(module, []):
            left -= place(child, box_id, left)
        if left > 0 and children.get(module):
            boxes.append(TreeBox(OWN_ID + module, box_id, module, left, own=True))
        return shown

    place("", "", totals[""])
    return boxes
