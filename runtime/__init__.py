"""The engine runtime: pure engine logic, model execution, actors and transport.

Users import ``actorserve``; this package is the implementation behind it.
"""
