"""Model-service load time: weights over NFS against the fast store, and time to ready for N
instances that load at once and share a link: each reads at ``min(bandwidth, shared / N)``."""

from __future__ import annotations


def load_seconds(
    weight_bytes: float, bandwidth: float, shared: float, instances: int, overhead: float
) -> float:
    """Seconds until ``instances`` instances have read ``weight_bytes`` each (all at once)."""
    return overhead + weight_bytes / min(bandwidth, shared / instances)
