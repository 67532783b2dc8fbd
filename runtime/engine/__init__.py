"""Pure engine logic: no I/O, no device. Runs inside the scheduler process (or in-process for tests)."""
