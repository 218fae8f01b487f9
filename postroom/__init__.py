"""Postroom: an AMQP 0-9-1 routing broker on Twisted, with work queues, visibility timeouts,
dead-letter queues, streams and a Spark job that tells why messages died.

Everything Postroom installs is under this one name: ``postroom.broker`` (the broker, its
clients in ``postroom.broker.clients`` and its tools), ``postroom.config``,
``postroom.exchanges``, ``postroom.plugins`` and ``postroom.spark``. In the repository those
are the folders beside this one.
"""
