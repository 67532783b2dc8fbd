"""The ``actorserve bench`` tools: ``serve`` (load against any OpenAI-compatible server), ``throughput``
(offline) and ``latency`` (one batch, per step)."""
