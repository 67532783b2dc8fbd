"""Memory: what sleep mode releases and restores, and the ledger that accounts for every buffer."""
