"""Every byte of a loaded tensor in memory: one byte read in each page.

A loader may hand back tensors whose pages are not read yet (a mapping of the file); ``touch``
faults every page in, as a copy to a GPU would, so a load is timed to the last byte. The same cheap
reduction is run on every method's tensors (``fxkit bench load``) and by ``fxkit serve-probe``.
"""

from __future__ import annotations

import mmap
from typing import Any

PAGE_SIZE = mmap.PAGESIZE


def touch(tensor: Any) -> int:
    """Read one byte in every page of the tensor's bytes, and its last byte; return their sum."""
    import torch

    if tensor.numel() == 0:
        return 0
    flat = tensor.reshape(-1).view(torch.uint8)
    return int(flat[::PAGE_SIZE].sum(dtype=torch.int64)) + int(flat[-1])
