"""A device-free executor that behaves like a model over a paged cache.

It stores every token it "computes" at its slot and, before each chunk, reads the request's context back
from the slots its block table names: a wrong block table, a prefix-cache block overwritten, or a
recompute at the wrong position changes the sampled tokens or fails an assertion. Draft tokens are
verified as a greedy model verifies them.
"""
from actorserve.runtime.transport.messages import ModelRunnerOutput


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
            if c.sample:  # drafts are kept while they are the model's own next tokens (greedy verification)
                real = len(c.token_ids) - c.num_draft
                full, out = context + list(c.token_ids[:real]), []
                for draft in c.token_ids[real:]:
                    out.append(next_token(full, self.vocab_size))
                    if out[-1] != draft:
                        break
                    full.append(draft)
                else:
                    out.append(next_token(full, self.vocab_size))
                sampled[c.request_id] = out
        return ModelRunnerOutput(batch.step, sampled, {})


def next_token(tokens: list[int], vocab_size: int) -> int:
    h = 0
    for t in tokens[-8:]:
        h = (h * 1_000_003 + t + 1) % 2_147_483_647
    return (h + len(tokens)) % vocab_size


class OracleProposer:
    """Drafts for the fake model that are right (its own next tokens) or wrong, at random, in random
    numbers: every acceptance length happens, and so every rollback."""

    def __init__(self, k: int, rng, vocab_size: int, wrong: float = 0.3):
        self.k, self.rng, self.vocab_size, self.wrong = k, rng, vocab_size, wrong

    def propose(self, tokens, limit=None):
        k = self.k if limit is None else min(self.k, limit)
        out, ctx = [], list(tokens)
        for _ in range(self.rng.randint(0, k)):
            t = next_token(ctx, self.vocab_size)
            if self.rng.random() < self.wrong:
                t = (t + 1) % self.vocab_size
            out.append(t)
            ctx.append(t)
        return out
