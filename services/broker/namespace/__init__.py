"""Tenants, namespaces, partitioned-topic records and their policies in the metadata store (no HTTP here)."""
