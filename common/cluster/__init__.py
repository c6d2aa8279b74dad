"""What every service knows of the cluster's brokers: how to reach one, and where they register
(the proxy finds brokers there; the brokers' registry writes it)."""
