"""Arrays in compact messages: each one a short description (dtype, shape, where its bytes are) and its bytes.

A description is cached both ways per layout, so that a step's arrays cost a dictionary
lookup each; the bytes ride in the payload, in a frame of their own when large
(:data:`OUT_OF_BAND_MIN_BYTES`), or in the connection's shared window
(:mod:`daskvec.transport.window`).
"""

from __future__ import annotations

import struct
from typing import Any, TypeVar, cast

import numpy as np

from daskvec.transport.window import WindowReader, WindowWriter

__all__ = [
    "ARRAY_HEAD",
    "INLINE",
    "META_CACHE_MAX",
    "META_IN",
    "META_OUT",
    "OUT_OF_BAND",
    "OUT_OF_BAND_MIN_BYTES",
    "WINDOW",
    "array_parts",
    "parse_meta",
    "read_array",
    "remember",
]

#: Arrays at least this large travel as separate out-of-band frames (never copied
#: into the pickle); smaller ones ride inside it as raw bytes.
OUT_OF_BAND_MIN_BYTES = 1 << 14
ARRAY_HEAD = struct.Struct("<BBB")  # length of the dtype string, ndim, where (INLINE, OUT_OF_BAND, WINDOW)
INLINE, OUT_OF_BAND, WINDOW = 0, 1, 2  # in the payload, a frame of its own, the shared window
META_OUT: dict[tuple[np.dtype[Any], tuple[int, ...], int], bytes] = {}
META_IN: dict[bytes, tuple[np.dtype[Any], tuple[int, ...], int]] = {}
META_CACHE_MAX = 256
_V = TypeVar("_V")


def remember(cache: dict[Any, _V], key: Any, value: _V) -> _V:
    """Store ``value`` in one of the codec's caches (emptied when full: a few hundred shapes at most); return it.

    Lookups stay inline on the step path (``cache.get``); this is the miss path.
    """
    if len(cache) >= META_CACHE_MAX:
        cache.clear()
    cache[key] = value
    return value


def array_parts(
    arr: np.ndarray, parts: list[bytes], extra: list[memoryview], window: WindowWriter | None = None
) -> None:
    """Append ``arr``'s description and data to a compact message (only its description if it is in ``window``)."""
    where = WINDOW if window is not None else OUT_OF_BAND if arr.nbytes >= OUT_OF_BAND_MIN_BYTES else INLINE
    key = (arr.dtype, arr.shape, where)
    meta = META_OUT.get(key)
    if meta is None:
        dtype = arr.dtype.str.encode()
        meta = ARRAY_HEAD.pack(len(dtype), arr.ndim, where) + dtype + struct.pack(f"<{arr.ndim}Q", *arr.shape)
        remember(META_OUT, key, meta)
    parts.append(meta)
    if window is not None:
        return  # the caller put the data there
    if where == OUT_OF_BAND:
        extra.append(memoryview(cast(Any, np.ascontiguousarray(arr))).cast("B"))
    else:
        parts.append(arr.tobytes())


def parse_meta(meta: bytes) -> tuple[np.dtype[Any], tuple[int, ...], int]:
    n_dtype, ndim, where = ARRAY_HEAD.unpack_from(meta, 0)
    dtype = np.dtype(meta[ARRAY_HEAD.size : ARRAY_HEAD.size + n_dtype].decode())
    if dtype.hasobject:
        raise ValueError("object arrays are not sent raw")
    shape = struct.unpack_from(f"<{ndim}Q", meta, ARRAY_HEAD.size + n_dtype)
    count = 1
    for dim in shape:
        count *= dim
    if where not in (INLINE, OUT_OF_BAND, WINDOW):
        raise ValueError(f"unknown array location {where}")
    return dtype, shape, count if where == INLINE else -where  # -1: out of band, -2: in the window


def read_array(
    payload: Any, offset: int, extra: list[Any], window: WindowReader | None = None
) -> tuple[np.ndarray, int]:
    """Read one array written by :func:`array_parts`; returns it and the next offset.

    An array in the shared ``window`` is a read-only view of it, valid until the next
    request on its channel (only a step reply's observations travel there).
    """
    size = ARRAY_HEAD.size + payload[offset] + 8 * payload[offset + 1]
    meta = bytes(payload[offset : offset + size])
    known = META_IN.get(meta)
    dtype, shape, count = known if known is not None else remember(META_IN, meta, parse_meta(meta))
    offset += size
    if count == -2:
        if window is None:
            raise ValueError("an array in a shared window where none can be")
        return window.array(dtype, shape), offset
    if count < 0:
        arr = np.frombuffer(extra.pop(0), dtype=dtype)
    else:
        arr = np.frombuffer(payload, dtype=dtype, count=count, offset=offset)
        offset += arr.nbytes
    if not arr.flags.writeable:  # a frame of immutable bytes (the actor channel)
        arr = arr.copy()
    return arr.reshape(shape), offset
