"""The node's name, as RabbitMQ names a node (``name@host``): what the management API, the
metrics and the shovels' statuses call this node."""

#: The node's name; a broker is one node, always named so.
NODE_NAME = "postroom@localhost"
