"""The schema registry and its compatibility rules."""
