"""The actors: thin shells that turn messages into calls on ``engine/`` and ``model/``."""
