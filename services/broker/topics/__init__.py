"""Persistent and non-persistent topics, their subscriptions, consumers, producers and dispatchers."""
