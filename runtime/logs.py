"""The project's log output: one handler on the ``actorserve`` logger, set up by whoever starts an engine.

Runs in every process. Nothing happens at import; ``setup_logging`` is idempotent and leaves alone a
logger the application has configured itself. The level comes from the config tree (RuntimeConfig).
"""
from __future__ import annotations

import logging
from typing import Optional


def setup_logging(level: str, process_name: Optional[str] = None) -> None:
    logger = logging.getLogger("actorserve")
    if logger.handlers:
        return
    handler = logging.StreamHandler()
    prefix = f"{process_name} " if process_name else ""
    handler.setFormatter(logging.Formatter(f"%(asctime)s {prefix}%(levelname)s %(name)s: %(message)s",
                                           "%H:%M:%S"))
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False
