"""The distributed queue: NATS JetStream, both roles over one connection.

- One work-queue stream, ``<PREFIX>_WORK``, with one subject per model and class
  (``<prefix>.work.<model token>`` for batch work, ``...<model token>.i`` for
  interactive work). Its per-subject limit, with ``discard new``, is
  the bounded queue: a full model answers ``Overloaded`` at publish.
- One durable pull consumer per model and class, shared by every worker that serves it.
- The envelope travels in headers (``wire.headers``); bodies are never decoded here.
- Replies go over core NATS to ``<prefix>.reply.<node>``, one subject per gateway.
- ``dead_letter`` copies the message, with the reason, to ``<PREFIX>_DLQ``.

The connection and the work stream live in ``js_stream.py``, the gateway's side in
``js_publisher.py``, the worker's in ``js_consumer.py`` (pulling in ``js_pull.py``,
the dead-letter stream in ``dlq.py``).
"""

from __future__ import annotations

from .js_consumer import JsConsumer
from .js_options import StreamOptions
from .js_publisher import JsPublisher

__all__ = ["JetStreamQueue", "StreamOptions"]


class JetStreamQueue(JsPublisher, JsConsumer):
    """Publisher and Consumer over NATS JetStream, for gateways and workers in separate
    processes; a worker publishes too (the slices of a large request)."""
