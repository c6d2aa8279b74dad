"""Authentication shared by the broker and the proxy: providers that turn a client's credentials
into a role, with Pulsar's semantics. Pure: no sockets, no settings files."""
