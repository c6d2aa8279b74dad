"""The server side of the Pulsar binary protocol: the connection and one module per command family."""
