"""Running the distributed mode's processes: nats-server, gateway, workers."""

from .natsd import NatsServer, server_binary

__all__ = ["NatsServer", "server_binary"]
