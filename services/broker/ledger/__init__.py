"""The managed ledger: a topic's sequence of ledgers, its entry cache, and its cursors with their persistence."""
