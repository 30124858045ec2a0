"""Cost of capacity: the external tier per TB against GPU memory (HBM) per TB, and the cost of
the capacity a workload needs beyond GPU memory. Prices are per decimal TB (10^12 bytes)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Cost:
    """What a capacity costs on the external tier and in GPU memory."""

    capacity: float  # bytes
    external_price: float  # money per byte
    gpu_price: float

    @property
    def external(self) -> float:
        return self.capacity * self.external_price

    @property
    def in_gpu_memory(self) -> float:
        return self.capacity * self.gpu_price

    @property
    def ratio(self) -> float:
        """How many times the external tier's price GPU memory costs."""
        return self.gpu_price / self.external_price
