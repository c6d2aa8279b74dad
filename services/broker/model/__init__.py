"""Leaf values of the broker: positions, topic names, message ids, stored entries, metadata keys.

Anything in the broker may import these; they import nothing of the broker."""
