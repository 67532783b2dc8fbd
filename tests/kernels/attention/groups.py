"""The attention tests' one way to lay out a step's sequence groups, and their slots, from plain lists."""
import torch

from actorserve.kernels.attention import SequenceGroup


def sequence_group(lens, contexts, tables, start, index_dtype=torch.int64) -> SequenceGroup:
    """Sequences with ``lens`` new tokens after ``contexts`` cached ones, their block ``tables`` (padded with
    block 0), the group's first token at row ``start`` of the step."""
    q_starts = [0]
    for n in lens:
        q_starts.append(q_starts[-1] + n)
    seq_lens = [c + n for c, n in zip(contexts, lens)]
    width = max(len(t) for t in tables)
    return SequenceGroup(start, start + q_starts[-1],
                         torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=index_dtype),
                         torch.tensor(seq_lens, dtype=index_dtype), torch.tensor(q_starts, dtype=index_dtype),
                         max(lens), max(seq_lens), tuple(lens), tuple(contexts))


def slot_mapping(groups, block_size: int) -> list[int]:
    """The cache slot of every new token of the groups, in the step's order."""
    slots = []
    for grp in groups:
        for n, c, table in zip(grp.query_lens, grp.context_lens, grp.block_tables.tolist()):
            slots += [table[p // block_size] * block_size + p % block_size for p in range(c, c + n)]
    return slots
