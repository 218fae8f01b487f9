"""twistd plugin: ``twistd -n postroom`` runs the broker (the work is in ``postroom.broker.server.tap``)."""

from twisted.application.service import ServiceMaker

Postroom = ServiceMaker(
    "Postroom AMQP 0-9-1 broker", "postroom.broker.server.tap", "Postroom: an AMQP 0-9-1 routing broker.", "postroom"
)
