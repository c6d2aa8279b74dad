"""Bundles, ownership, the broker registry, the load manager, lookup and membership."""
