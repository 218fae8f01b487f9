"""twistd plugin: ``twistd -n postroom`` runs the broker (the work is in ``postroom.broker.tools.tap``)."""

from twisted.application.service import ServiceMaker

Postroom = ServiceMaker(
    "Postroom AMQP 0-9-1 broker", "postroom.broker.tools.tap", "Postroom: an AMQP 0-9-1 routing broker.", "postroom"
)
