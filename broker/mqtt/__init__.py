"""MQTT 3.1.1 (and 3.1) and MQTT 5.0 clients on the node's exchanges, sans-IO: the connection
(``connection.py``), the session that outlives it (``session.py``), what the connections of a
node share (``registry.py``) and the AMQP form of an MQTT message (``content.py``; MQTT 5.0's properties in
``properties.py``)."""
