"""Laying host blocks out by a policy's groups, so a group (a cluster) moves down and up as one copy.

``group_of(layer, slots)`` names each slot's group (-1: none yet), ``(len(slots),)``, or with a
per-head layout each key head's ``(kv_heads, len(slots))`` (clusters that differ per head, as
ReSV's): then a host block holds one group of one head. Blocks arriving in host memory are
regrouped: each group's slots join that group's host block, as are grouped blocks whose slots the
layout has since given to other groups (a split cluster).
"""

from __future__ import annotations

import torch

from vidsight.kv.store import GroupOf
from vidsight.kv.tiers.blocks import HOST, Block, BlockTable


def regroup(table: BlockTable, layer: int, group_of: GroupOf, per_head: bool) -> None:
    """Fold the layer's settled host blocks into one host block per group (per head with ``per_head``)."""
    host = [b for b in table.layers[layer] if b.tier == HOST and b.transfer is None]
    if not host:
        return
    groups = group_of(layer, torch.cat([b.slots for b in host])).split([b.length for b in host], dim=-1)
    loose, grouped = [], {}
    for block, its_groups in zip(host, groups):
        settled = its_groups if not per_head else its_groups[block.head] if block.head is not None else None
        if block.grouped and settled is not None and bool((settled == block.group).all()):
            grouped[(block.head, block.group)] = block
        else:
            loose.append((block, its_groups))
    if not loose:
        return
    filed: list[Block] = []
    for head in range(table.kv_heads) if per_head else (None,):
        mine = [(b, g) for b, g in loose if head is None or b.head in (None, head)]
        if not mine:
            continue
        slots = torch.cat([b.slots for b, _ in mine])
        data = torch.cat([b.data if head is None or b.head is not None else b.data[:, head : head + 1]
                          for b, _ in mine], dim=2)
        used = torch.cat([torch.full((b.length,), b.last_used) for b, _ in mine])
        its_groups = torch.cat([g if head is None else g[head] for _, g in mine])
        filed += _file(layer, slots, data, used, its_groups, grouped, head)
    table.replace(layer, [b for b, _ in loose], filed)


def _file(layer: int, slots: torch.Tensor, data: torch.Tensor, used: torch.Tensor, groups: torch.Tensor,
          grouped: dict[tuple[int | None, int], Block], head: int | None) -> list[Block]:
    """Each group's slots (their data, last uses) join the host block of ``(head, group)``; the blocks
    made new are returned."""
    made = []
    for group in torch.unique(groups).tolist():
        member = groups == group
        block = grouped.get((head, group))
        if block is None:
            block = grouped[(head, group)] = Block(layer, slots[:0], HOST, data[:, :, :0], group=group, head=head)
            made.append(block)
        merged = torch.cat([block.slots, slots[member]])
        order = torch.argsort(merged)
        block.slots, block.data = merged[order], torch.cat([block.data, data[:, :, member]], dim=2)[:, :, order]
        block.last_used = max(block.last_used, int(used[member].max()))
    return made
