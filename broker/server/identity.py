"""The node's name, as RabbitMQ names a node (``name@host``): what the management API, the
metrics and the shovels' statuses call this node."""

#: A single node's name: a broker is one node, always named so.
NODE_NAME = "postroom@localhost"

_name = NODE_NAME


def node_name() -> str:
    """This node's name: :data:`NODE_NAME`, or ``postroom@<cluster.name>`` in a cluster."""
    return _name


def set_node_name(name: str) -> None:
    """Name this node (a cluster node, before its broker starts)."""
    global _name
    _name = name
