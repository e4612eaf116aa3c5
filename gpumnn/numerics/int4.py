"""int4 values two to a byte, as ``QuantizedMatMul`` with ``block`` reads its weight: row 2i of K in
the low nibble, row 2i + 1 in the high one, each a two's complement 4-bit value."""
from __future__ import annotations

import numpy as np


def pack_int4(values: np.ndarray) -> np.ndarray:
    """int8 ``values`` [K, N] in [-8, 7] as bytes of two rows each, row 2i in the low nibble:
    uint8 [ceil(K / 2), N]."""
    k, n = values.shape
    even = np.zeros((-(-k // 2) * 2, n), np.int8)
    even[:k] = values
    nibbles = even.view(np.uint8) & np.uint8(0x0F)
    return np.ascontiguousarray(nibbles[0::2] | (nibbles[1::2] << np.uint8(4)))


def unpack_int4(packed: np.ndarray, k: int) -> np.ndarray:
    """``pack_int4``'s bytes [ceil(K / 2), N] back as int8 [K, N]."""
    low = (packed & np.uint8(0x0F)).astype(np.int8)
    high = (packed >> np.uint8(4)).astype(np.int8)
    values = np.empty((2 * packed.shape[0], packed.shape[1]), np.int8)
    values[0::2], values[1::2] = low, high
    return np.where(values > 7, values - 16, values).astype(np.int8)[:k]
