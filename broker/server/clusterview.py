"""What the management API and ``/metrics`` show of a cluster (``broker.cluster``), as the
cluster node gives it to the broker it starts when it leads."""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["ClusterView"]


class ClusterView(Protocol):
    def members(self) -> list[dict[str, Any]]:
        """Every node registered in etcd or in the in-sync set, each ``{"name": "postroom@<name>",
        "running": bool, "postroom_cluster": {"role", "in_sync", "lag_batches", "lag_bytes",
        "lag_seconds", "state"}}`` (the lag of a follower linked to this leader; ``None``
        otherwise)."""

    def figures(self) -> dict[str, Any]:
        """For ``/metrics``: ``copies`` (the leader and the followers in sync), ``elections``
        (times this node became the leader), ``followers`` (each linked follower's lag:
        ``{name: {"batches", "bytes", "seconds"}}``), ``held`` and ``held_seconds`` (confirms
        held for replication, and the seconds they waited in all)."""
