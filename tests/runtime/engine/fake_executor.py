"""A device-free executor that behaves like a model over a paged cache.

It stores every token it "computes" at its slot and, before each chunk, reads the request's context back
from the slots its block table names: a wrong block table, a prefix-cache block overwritten, or a
recompute at the wrong position changes the sampled tokens or fails an assertion.
"""
from actorserve.runtime.engine.batch import ModelRunnerOutput


class FakeExecutor:
    def __init__(self, block_size: int, vocab_size: int):
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.slots: dict[tuple[int, int], int] = {}
        self.steps = 0
        self.max_batch_tokens = 0

    def execute(self, batch):
        self.steps += 1
        self.max_batch_tokens = max(self.max_batch_tokens, batch.num_tokens)
        bs = self.block_size
        sampled = {}
        for c in batch.chunks:
            end = c.start + len(c.token_ids)
            assert len(c.block_ids) * bs >= end, "block table too short"
            context = [self.slots[(c.block_ids[p // bs], p % bs)] for p in range(c.start)]
            for p, token in zip(range(c.start, end), c.token_ids):
                self.slots[(c.block_ids[p // bs], p % bs)] = token
            if c.sample:
                full = context + list(c.token_ids)
                sampled[c.request_id] = next_token(full, self.vocab_size)
        return ModelRunnerOutput(batch.step, sampled, {})


def next_token(tokens: list[int], vocab_size: int) -> int:
    h = 0
    for t in tokens[-8:]:
        h = (h * 1_000_003 + t + 1) % 2_147_483_647
    return (h + len(tokens)) % vocab_size
