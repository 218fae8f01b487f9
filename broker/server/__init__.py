"""The Twisted shell: listeners and the AMQP protocol adapter, the service that assembles a
broker from its configuration, the HTTP management API and metrics, resource alarms and
plugin loading. The top of the broker; only ``broker.tools`` imports it.
"""

__all__: list[str] = []
