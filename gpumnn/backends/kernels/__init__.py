"""Kernel sources and their planners, shared by the APIs: ``cl/`` (OpenCL C, for OpenCL and CUDA) and ``glsl/`` (GLSL, for Vulkan and GL)."""
from __future__ import annotations

import numpy as np


def word_padded(data: np.ndarray) -> np.ndarray:
    """The bytes of contiguous ``data`` padded with zeros to a whole number of 32-bit words (at
    least one): a constant's buffer contents, so that a tensor owns its last word (kernels that
    hold narrow tensors packed in words read whole words) and no buffer is empty."""
    raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    padded = np.zeros(max(4, -(-raw.size // 4) * 4), np.uint8)
    padded[:raw.size] = raw
    return padded
