"""The codec: how requests and replies become frames, and back.

Step requests and the common step replies are compact records of raw arrays; every other
message is a pickle whose large arrays travel out of band (see :func:`encode`).
"""

from __future__ import annotations

import copyreg
import io
import itertools
import logging
import pickle
import struct
import traceback
from collections import ChainMap
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar, cast

import cloudpickle
import numpy as np

from daskvec.protocol import EMPTY, ColumnInfos, RemoteError, StepReply
from daskvec.transport.window import WINDOW_MIN_BYTES, WindowReader, WindowWriter
from daskvec.transport.wire import COUNT, MAX_FRAMES, PickleLoadError, ProtocolError

logger = logging.getLogger(__name__)

__all__ = ["OUT_OF_BAND_MIN_BYTES", "decode", "encode", "pack", "pack_reply", "unpack", "unsendable"]

# --------------------------------------------------------------------------- encoding
#: Arrays at least this large travel as separate out-of-band frames (never copied
#: into the pickle); smaller ones ride inside it as raw bytes.
OUT_OF_BAND_MIN_BYTES = 1 << 14


def _array_from_bytes(data: bytes, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    return np.frombuffer(bytearray(data), dtype=dtype).reshape(shape)  # a writable copy


def _array_from_buffer(buffer: Any, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    return np.frombuffer(buffer, dtype=dtype).reshape(shape)  # the received frame, not a copy


def _reduce_array(arr: np.ndarray) -> Any:
    # NumPy's own pickling of small arrays goes through Python helpers and costs more
    # than a whole CartPole step; (bytes, dtype, shape) does not. Only arrays reach
    # this function (it is the pickler's dispatch entry for np.ndarray), so the other
    # objects of a message are pickled by C code alone.
    if arr.dtype.hasobject:
        return arr.__reduce_ex__(5)
    if arr.nbytes >= OUT_OF_BAND_MIN_BYTES:
        arr = np.ascontiguousarray(arr)
        return _array_from_buffer, (pickle.PickleBuffer(arr.data), arr.dtype.str, arr.shape)
    return _array_from_bytes, (arr.tobytes(), arr.dtype.str, arr.shape)


class _Pickler(pickle.Pickler):
    """The fast C pickler, for messages of plain data."""


class _CloudPickler(cloudpickle.Pickler):
    """The fallback for what plain pickle cannot handle (lambdas, classes from ``__main__``)."""


# Set after the class bodies: they are class-level tables, looked up by C code for types
# pickle does not handle natively. ChainMaps are live views: what is registered with
# copyreg (or cloudpickle) later still counts.
_ARRAYS: dict[type, Any] = {np.ndarray: _reduce_array}
_Pickler.dispatch_table = ChainMap(_ARRAYS, cast(Any, copyreg.dispatch_table))
_CloudPickler.dispatch_table = ChainMap(_ARRAYS, cloudpickle.Pickler.dispatch_table)


# ------------------------------------------------------------- compact step messages
# The two messages of every step have a fixed form: ("step", (actions,)) and, in the
# common case, a StepReply whose envs returned no infos or the same scalar info keys
# (see _info_columns), with empty reset infos and no restarts. They are written as raw arrays behind a
# one-byte tag instead of as a pickle: no pickler, no reduce callbacks, no objects to
# rebuild by the unpickler. Both sit on the critical path of every step (what this gains
# is measured in docs/benchmark.md). Every other message, and every step reply that does
# not fit (dict observations, infos of other shapes, reset infos that are not
# empty), stays a pickle. A pickle of protocol 2 or later starts with 0x80, so the tags
# below never collide with one.
_STEP_REQUEST = 0x01
_STEP_REPLY = 0x02
_PICKLE = 0x80
# issue 14 (sb3x): a compact step reply followed by the envs' action masks, stacked
_STEP_REPLY_MASKS = 0x03
# a compact step reply followed by the envs' infos as columns (with masks: 0x07)
_STEP_REPLY_INFOS = 0x06
_STEP_REPLY_MASKS_INFOS = 0x07
_REPLY_TAGS = (_STEP_REPLY, _STEP_REPLY_MASKS, _STEP_REPLY_INFOS, _STEP_REPLY_MASKS_INFOS)
# per-env bits of a compact step reply
_TERMINATED, _TRUNCATED, _FINAL_OBS, _RESET_INFO = 1, 2, 4, 8
_REPLY_HEAD = struct.Struct("<BdI")  # tag, env_seconds, number of envs n; then n flag bytes,
# n little-endian float64 rewards, the observations, if any episode ended the final
# observations stacked, then the masks (tags 0x03, 0x07) and the info columns (0x06, 0x07)
_ARRAY_HEAD = struct.Struct("<BBB")  # length of the dtype string, ndim, where (_INLINE, _OUT_OF_BAND, _WINDOW)
_INLINE, _OUT_OF_BAND, _WINDOW = 0, 1, 2  # in the payload, a frame of its own, the shared window
_F8 = np.dtype("<f8")
_META_OUT: dict[tuple[np.dtype[Any], tuple[int, ...], int], bytes] = {}
_META_IN: dict[bytes, tuple[np.dtype[Any], tuple[int, ...], int]] = {}
_META_CACHE_MAX = 256
#: ``n`` zero bytes by ``n``: the flags of a step reply of ``n`` envs none of which ended its episode.
_QUIET_FLAGS: dict[int, bytes] = {}
_V = TypeVar("_V")


# ----------------------------------------------------------------- infos as columns
# Most envs return the same few scalar info keys at every step (MuJoCo's x_position,
# reward_ctrl, ...; ALE's lives and frame numbers). Pickled, each NumPy scalar costs a
# reduce call: 32 HalfCheetah envs' infos took 0.65 ms per step to encode, a quarter of
# their stepping time. When every info dict of a reply has the same keys in the same
# order and each key's values are of one scalar type, they travel as one array per key,
# behind a schema naming the keys and how to give each value back: Python ``bool``,
# ``int`` and ``float`` as themselves (kinds b, i, f), a NumPy scalar as a scalar of its
# own dtype (kind n, the dtype is the column's), arrays of one dtype and shape (EnvPool's
# ``ram``) as rows of a stacked array, each env's its own copy (kind a). Anything else
# keeps the pickle.
_SCHEMA_HEAD = struct.Struct("<H")  # the schema's length in bytes; then the schema
_SCHEMA_OUT: dict[tuple[tuple[str, ...], bytes], bytes] = {}
_SCHEMA_IN: dict[bytes, tuple[tuple[str, ...], bytes]] = {}
_PY_KINDS: dict[type, tuple[int, np.dtype[Any]]] = {
    bool: (ord("b"), np.dtype(np.bool_)),
    int: (ord("i"), np.dtype("<i8")),
    float: (ord("f"), np.dtype("<f8")),
}
_PY_DTYPES = dict(_PY_KINDS.values())
_PY_KIND_OF_DTYPE = {dtype: kind for kind, dtype in _PY_KINDS.values()}
#: Cache of :func:`_given_columns`: the kinds of a layout of columns (dtype, whether 1-D).
_KINDS_OF_DTYPES: dict[tuple[tuple[np.dtype[Any], bool], ...], bytes] = {}
_NUMPY_KIND = ord("n")
_ARRAY_KIND = ord("a")


_ONLY_DICT, _ONLY_INT, _ONLY_STR = {dict}, {int}, {str}


def _types(values: Iterable[Any]) -> set[type]:
    """The exact types of ``values`` (a C loop)."""
    return set(map(type, values))


def _info_columns(infos: dict[int, dict[str, Any]], n: int) -> tuple[bytes, np.ndarray, Sequence[np.ndarray]] | None:
    """``infos`` as (schema, which positions have one, one array per key), or None if it does not fit."""
    if type(infos) is ColumnInfos:
        return _given_columns(infos, n)
    positions = list(infos)
    rows = list(infos.values())
    keys = tuple(rows[0]) if type(rows[0]) is dict else ()
    if not keys or len(keys) > 255:
        return None
    # checked with C loops over all rows at once (a Python loop per row and key cost 30 us a
    # step for 32 MuJoCo envs): plain dicts, ascending int positions below n (a dict's keys
    # are distinct), each row's keys row 0's in its order (a dict has no key twice, so rows
    # whose keys laid end to end are ``keys`` repeated are each ``keys``), every key a plain
    # str (np.str_ compares equal to a str but would come back a str)
    if _types(rows) != _ONLY_DICT or _types(positions) != _ONLY_INT or positions[0] < 0 or positions[-1] >= n:
        return None
    if len(positions) > 1 and positions != sorted(positions):
        return None
    flat_keys = tuple(itertools.chain.from_iterable(rows))
    if flat_keys != keys * len(rows) or _types(flat_keys) != _ONLY_STR:
        return None
    flat_values = list(itertools.chain.from_iterable(map(dict.values, rows)))
    types = tuple(map(type, flat_values[: len(keys)]))
    if tuple(map(type, flat_values)) != types * len(rows):  # each key's values of one type
        return None
    kinds = bytearray()
    columns = []
    for j, t in enumerate(types):
        values = flat_values[j :: len(keys)]
        if t is np.ndarray:  # rows of one dtype and shape (EnvPool's ram), stacked
            first = values[0]
            if first.ndim == 0 or first.dtype.kind not in "biuf" or not first.dtype.isnative:
                return None  # np.stack would give a non-native byte order back as native
            if any(v.dtype != first.dtype or v.shape != first.shape for v in values):
                return None
            columns.append(np.stack(values))
            kinds.append(_ARRAY_KIND)
            continue
        if t in _PY_KINDS:
            kind, dtype = _PY_KINDS[t]
        elif issubclass(t, np.generic) and np.dtype(t).kind in "biuf":
            kind, dtype = _NUMPY_KIND, np.dtype(t)
        else:
            return None
        try:
            columns.append(np.array(values, dtype=dtype))
        except OverflowError:  # a Python int beyond int64
            return None
        kinds.append(kind)
    schema = _schema(keys, bytes(kinds))
    if schema is None:
        return None
    if len(positions) == n:  # every env has an info (positions are distinct and below n)
        return schema, np.ones(n, dtype=np.uint8), columns
    present = np.zeros(n, dtype=np.uint8)
    present[positions] = 1
    return schema, present, columns


def _schema(keys: tuple[str, ...], kinds: bytes) -> bytes | None:
    """The encoded schema of info columns ``keys`` of ``kinds``, or None if it is too long to send."""
    cache_key = (keys, kinds)
    schema = _SCHEMA_OUT.get(cache_key)
    if schema is None:
        encoded = [k.encode("utf-8", "surrogatepass") for k in keys]
        if 1 + len(kinds) + sum(_SCHEMA_HEAD.size + len(b) for b in encoded) > 0xFFFF:
            return None  # the schema's length must fit its two-byte header
        schema = _remember(
            _SCHEMA_OUT,
            cache_key,
            b"".join([bytes([len(keys)]), kinds] + [_SCHEMA_HEAD.pack(len(b)) + b for b in encoded]),
        )
    return schema


def _given_columns(infos: ColumnInfos, n: int) -> tuple[bytes, np.ndarray, Sequence[np.ndarray]] | None:
    """:func:`_info_columns` of a vector group's :class:`~daskvec.protocol.ColumnInfos`: its own columns."""
    keys, columns = infos.names, infos.columns
    if len(keys) > 255 or len(infos) != n or any(c.ndim == 0 or len(c) != n for c in columns):
        return None
    if any(type(k) is not str for k in keys):  # a str subclass (np.str_) would come back a str
        return None
    layout = tuple((c.dtype, c.ndim == 1) for c in columns)
    kinds = _KINDS_OF_DTYPES.get(layout)
    if kinds is None:
        found = bytearray()
        for dtype, scalars in layout:
            if scalars and dtype in _PY_KIND_OF_DTYPE:
                found.append(_PY_KIND_OF_DTYPE[dtype])
            elif not scalars and dtype.kind in "biuf" and dtype.isnative:
                found.append(_ARRAY_KIND)  # each env's row (EnvPool's ram)
            else:
                return None
        kinds = _remember(_KINDS_OF_DTYPES, layout, bytes(found))
    schema = _schema(keys, kinds)
    return None if schema is None else (schema, np.ones(n, dtype=np.uint8), columns)


def _parse_schema(schema: bytes) -> tuple[tuple[str, ...], bytes]:
    count = schema[0]
    kinds = schema[1 : 1 + count]
    if len(kinds) != count or any(k not in b"bifna" for k in kinds):
        raise ValueError("unknown info kind")
    keys = []
    offset = 1 + count
    for _ in range(count):
        (size,) = _SCHEMA_HEAD.unpack_from(schema, offset)
        offset += _SCHEMA_HEAD.size
        key = schema[offset : offset + size]
        if len(key) != size:
            raise ValueError("truncated info key")
        keys.append(key.decode("utf-8", "surrogatepass"))
        offset += size
    if offset != len(schema):
        raise ValueError("trailing bytes after the info schema")
    return tuple(keys), kinds


def _read_infos(payload: Any, offset: int, extra: list[Any], n: int) -> tuple[dict[int, dict[str, Any]], int]:
    """Read the infos written by :func:`_info_columns`; returns them by position and the next offset."""
    (size,) = _SCHEMA_HEAD.unpack_from(payload, offset)
    offset += _SCHEMA_HEAD.size
    schema = bytes(payload[offset : offset + size])
    offset += size
    known = _SCHEMA_IN.get(schema)
    keys, kinds = known if known is not None else _remember(_SCHEMA_IN, schema, _parse_schema(schema))
    if not kinds:
        raise ValueError("info columns without keys")
    present, offset = _read_array(payload, offset, extra)
    if present.shape != (n,):
        raise ValueError("info positions of another length")
    positions = np.flatnonzero(present).tolist()
    columns = []
    for kind in kinds:
        column, offset = _read_array(payload, offset, extra)
        if kind == _ARRAY_KIND:
            if column.ndim < 2 or len(column) != len(positions):
                raise ValueError("an info column of another length")
            columns.append([row.copy() for row in column])  # each env's array its own, as a pickle gives
            continue
        if column.shape != (len(positions),) or (kind != _NUMPY_KIND and column.dtype != _PY_DTYPES[kind]):
            raise ValueError("an info column of another length or dtype")
        columns.append(list(column) if kind == _NUMPY_KIND else column.tolist())
    # every column has one value per position and one key each (checked above and by the schema),
    # so the zips need no strict checks: the dicts are built by C loops alone
    rows = map(dict, map(zip, itertools.repeat(keys), zip(*columns, strict=False)))
    infos = dict(zip(positions, rows, strict=False))
    return infos, offset


def _remember(cache: dict[Any, _V], key: Any, value: _V) -> _V:
    """Store ``value`` in one of the codec's caches (emptied when full: a few hundred shapes at most); return it.

    Lookups stay inline on the step path (``cache.get``); this is the miss path.
    """
    if len(cache) >= _META_CACHE_MAX:
        cache.clear()
    cache[key] = value
    return value


def _array_parts(
    arr: np.ndarray, parts: list[bytes], extra: list[memoryview], window: WindowWriter | None = None
) -> None:
    """Append ``arr``'s description and data to a compact message (only its description if it is in ``window``)."""
    where = _WINDOW if window is not None else _OUT_OF_BAND if arr.nbytes >= OUT_OF_BAND_MIN_BYTES else _INLINE
    key = (arr.dtype, arr.shape, where)
    meta = _META_OUT.get(key)
    if meta is None:
        dtype = arr.dtype.str.encode()
        meta = _ARRAY_HEAD.pack(len(dtype), arr.ndim, where) + dtype + struct.pack(f"<{arr.ndim}Q", *arr.shape)
        _remember(_META_OUT, key, meta)
    parts.append(meta)
    if window is not None:
        return  # the caller put the data there
    if where == _OUT_OF_BAND:
        extra.append(memoryview(cast(Any, np.ascontiguousarray(arr))).cast("B"))
    else:
        parts.append(arr.tobytes())


def _parse_meta(meta: bytes) -> tuple[np.dtype[Any], tuple[int, ...], int]:
    n_dtype, ndim, where = _ARRAY_HEAD.unpack_from(meta, 0)
    dtype = np.dtype(meta[_ARRAY_HEAD.size : _ARRAY_HEAD.size + n_dtype].decode())
    if dtype.hasobject:
        raise ValueError("object arrays are not sent raw")
    shape = struct.unpack_from(f"<{ndim}Q", meta, _ARRAY_HEAD.size + n_dtype)
    count = 1
    for dim in shape:
        count *= dim
    if where not in (_INLINE, _OUT_OF_BAND, _WINDOW):
        raise ValueError(f"unknown array location {where}")
    return dtype, shape, count if where == _INLINE else -where  # -1: out of band, -2: in the window


def _read_array(
    payload: Any, offset: int, extra: list[Any], window: WindowReader | None = None
) -> tuple[np.ndarray, int]:
    """Read one array written by :func:`_array_parts`; returns it and the next offset.

    An array in the shared ``window`` is a read-only view of it, valid until the next
    request on its channel (only a step reply's observations travel there).
    """
    size = _ARRAY_HEAD.size + payload[offset] + 8 * payload[offset + 1]
    meta = bytes(payload[offset : offset + size])
    known = _META_IN.get(meta)
    dtype, shape, count = known if known is not None else _remember(_META_IN, meta, _parse_meta(meta))
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


def _encode_step_request(obj: Any) -> tuple[bytes, list[memoryview]] | None:
    """The compact form of ``("step", (actions,))``, or None if ``obj`` is not one."""
    if type(obj) is not tuple or len(obj) != 2 or obj[0] != "step":
        return None
    body = obj[1]
    if type(body) is not tuple or len(body) != 1:
        return None
    actions = body[0]
    if type(actions) is not np.ndarray or actions.dtype.hasobject:
        return None
    parts: list[bytes] = [b"\x01"]  # _STEP_REQUEST
    extra: list[memoryview] = []
    _array_parts(actions, parts, extra)
    return b"".join(parts), extra


#: The header frame and the payload's tag and array description of a small step request, by the actions' layout.
_REQUEST_HEAD: dict[tuple[np.dtype[Any], tuple[int, ...]], tuple[bytes, bytes]] = {}


def _step_request_frames(obj: Any) -> list[bytes | memoryview] | None:
    """The frames of ``("step", (actions,))`` with small actions of a layout sent before, else ``None``.

    The frames :func:`_framed` makes of :func:`_encode_step_request`'s record, from the
    header and payload prefix cached per layout: the first request of a layout takes
    the long way and fills the cache.
    """
    if type(obj) is not tuple or len(obj) != 2 or obj[0] != "step":
        return None
    body = obj[1]
    if type(body) is not tuple or len(body) != 1 or type(actions := body[0]) is not np.ndarray:
        return None
    known = _REQUEST_HEAD.get((actions.dtype, actions.shape))
    if known is not None:
        return [known[0], known[1] + actions.tobytes()]
    if actions.dtype.hasobject or actions.nbytes >= OUT_OF_BAND_MIN_BYTES:
        return None
    payload, _ = cast(tuple[bytes, list[memoryview]], _encode_step_request(obj))
    frames = _framed(payload, [])
    _remember(
        _REQUEST_HEAD, (actions.dtype, actions.shape), (bytes(frames[0]), payload[: len(payload) - actions.nbytes])
    )
    return frames


def _encode_quiet(reply: StepReply, window: WindowWriter | None) -> list[bytes | memoryview] | None:
    """The frames of the most common step reply, or ``None`` if ``reply`` is not one.

    No infos, masks, final observations, reset infos or restarts, no episode ended,
    and small observations of one array (neither out of band nor for the shared
    window): what :func:`_encode_step_reply` would write, with fewer checks to make.
    """
    obs, rewards = reply.obs, reply.rewards
    if (
        reply.infos or reply.final_obs or reply.reset_infos or reply.restarted or reply.masks is not None
        or type(obs) is not np.ndarray or type(rewards) is not np.ndarray or rewards.ndim != 1
    ):  # fmt: skip
        return None
    n = len(rewards)
    zeros = _QUIET_FLAGS.get(n) or _remember(_QUIET_FLAGS, n, bytes(n))
    terminated, truncated = reply.terminated, reply.truncated
    if (
        len(obs) != n or obs.nbytes >= OUT_OF_BAND_MIN_BYTES or obs.dtype.hasobject
        or (window is not None and obs.nbytes >= WINDOW_MIN_BYTES)
        or type(terminated) is not np.ndarray or terminated.dtype != np.bool_ or terminated.tobytes() != zeros
        or type(truncated) is not np.ndarray or truncated.dtype != np.bool_ or truncated.tobytes() != zeros
    ):  # fmt: skip
        return None
    meta = _META_OUT.get((obs.dtype, obs.shape, _INLINE))
    if meta is None:
        return None  # a layout not seen yet: the long way writes its description
    payload = b"".join(
        (_REPLY_HEAD.pack(_STEP_REPLY, reply.env_seconds, n), zeros, rewards.astype(_F8, copy=False).tobytes(),
         meta, obs.tobytes())
    )  # fmt: skip
    return [_ONE_FRAME.pack(1, len(payload)), payload]


def _encode_step_reply(reply: StepReply, window: WindowWriter | None) -> tuple[bytes, list[memoryview]] | None:
    """The compact form of a step reply, or None if it carries more than the flags can say.

    Large observations go into ``window`` when there is one (see :mod:`daskvec.transport.window`).
    """
    obs, rewards, terminated, truncated = reply.obs, reply.rewards, reply.terminated, reply.truncated
    if reply.restarted or any(reply.reset_infos.values()):
        return None
    infos = _info_columns(reply.infos, len(rewards)) if reply.infos else None
    if reply.infos and infos is None:
        return None
    masks = reply.masks
    if masks is not None and not (type(masks) is np.ndarray and not masks.dtype.hasobject):
        return None
    n = len(rewards)
    if not (
        type(obs) is np.ndarray
        and not obs.dtype.hasobject
        and len(obs) == n
        and type(rewards) is np.ndarray
        and rewards.shape == (n,)
        and type(terminated) is np.ndarray
        and terminated.dtype == np.bool_
        and terminated.shape == (n,)
        and type(truncated) is np.ndarray
        and truncated.dtype == np.bool_
        and truncated.shape == (n,)
    ):
        return None
    flags = bytearray(terminated.tobytes())  # _TERMINATED is bit 0
    final: list[np.ndarray] = []
    if reply.final_obs:
        row_shape = obs.shape[1:]
        for pos in sorted(reply.final_obs):
            last = reply.final_obs[pos]
            if not 0 <= pos < n or type(last) is not np.ndarray or last.dtype != obs.dtype or last.shape != row_shape:
                return None
            final.append(last)
            flags[pos] |= _FINAL_OBS
    if truncated.any():
        for pos, trunc in enumerate(truncated.tolist()):
            if trunc:
                flags[pos] |= _TRUNCATED
    for pos in reply.reset_infos:
        if not 0 <= pos < n:
            return None
        flags[pos] |= _RESET_INFO
    if masks is not None and len(masks) != n:
        return None
    tag = (_STEP_REPLY if masks is None else _STEP_REPLY_MASKS) | (0 if infos is None else _STEP_REPLY_INFOS)
    parts: list[bytes] = [_REPLY_HEAD.pack(tag, reply.env_seconds, n), bytes(flags)]
    parts.append(rewards.astype("<f8", copy=False).tobytes())
    extra: list[memoryview] = []
    shared = window is not None and obs.nbytes >= WINDOW_MIN_BYTES and window.put(obs)
    _array_parts(obs, parts, extra, window if shared else None)
    if final:
        _array_parts(np.stack(final), parts, extra)
    if masks is not None:
        _array_parts(masks, parts, extra)
    if infos is not None:
        schema, present, columns = infos
        parts += [_SCHEMA_HEAD.pack(len(schema)), schema]
        _array_parts(present, parts, extra)
        for column in columns:
            _array_parts(column, parts, extra)
    return b"".join(parts), extra


def _decode_quiet(payload: Any, window: WindowReader | None) -> StepReply | None:
    """The most common step reply, read with as few operations as it allows: ``None`` if ``payload`` is not one.

    A compact reply with no masks and no infos, in which no episode ended, whose
    observations are an array of a layout seen before, in the payload or the shared
    window, and that ends with them. Anything else (and anything malformed) goes
    through the full :func:`_decode_step`, which checks it and says what is wrong.
    """
    if len(payload) < _REPLY_HEAD.size or payload[0] != _STEP_REPLY:
        return None
    _, env_seconds, n = _REPLY_HEAD.unpack_from(payload, 0)
    start = _REPLY_HEAD.size
    at = start + 9 * n  # after the flags and the float64 rewards
    if len(payload) < at + _ARRAY_HEAD.size:
        return None
    zeros = _QUIET_FLAGS.get(n) or _remember(_QUIET_FLAGS, n, bytes(n))
    if payload[start : start + n] != zeros:
        return None
    end = at + _ARRAY_HEAD.size + payload[at] + 8 * payload[at + 1]
    known = _META_IN.get(bytes(payload[at:end]))
    if known is None:
        return None
    dtype, shape, count = known
    if not shape or shape[0] != n:
        return None
    if count == -2 and window is not None and end == len(payload):
        obs = window.array(dtype, shape)
    elif count >= 0 and end + count * dtype.itemsize == len(payload):
        obs = np.frombuffer(payload, dtype=dtype, count=count, offset=end).reshape(shape)
    else:
        return None
    rewards = np.frombuffer(payload, dtype=_F8, count=n, offset=start + n)
    if not rewards.flags.writeable:  # immutable bytes (the actor channel)
        rewards, obs = rewards.copy(), (obs if count < 0 else obs.copy())
    no = np.zeros(n, dtype=bool)
    return StepReply(obs, rewards, no, no.copy(), EMPTY, EMPTY, EMPTY, EMPTY, env_seconds, None, True)


def _decode_step(frames: Sequence[Any], window: WindowReader | None) -> Any:
    """Rebuild the message that the compact encoders wrote, as the pickle path would."""
    payload = frames[0]
    extra = list(frames[1:])
    try:
        if len(frames) == 1 and (quiet := _decode_quiet(payload, window)) is not None:
            return quiet
        if payload[0] == _STEP_REQUEST:
            actions, _ = _read_array(payload, 1, extra)
            return ("step", (actions,))
        tag, env_seconds, n = _REPLY_HEAD.unpack_from(payload, 0)
        offset = _REPLY_HEAD.size
        flags = bytes(payload[offset : offset + n])
        offset += n
        rewards = np.frombuffer(payload, dtype=_F8, count=n, offset=offset)
        if not rewards.flags.writeable:
            rewards = rewards.copy()
        offset += 8 * n
        obs, offset = _read_array(payload, offset, extra, window)
        # most steps end no episode: then every flag is 0 and there is no final observation to read
        quiet = flags.count(0) == n
        final = None
        if not quiet and any(b & _FINAL_OBS for b in flags):
            final, offset = _read_array(payload, offset, extra)
        masks = None
        if tag & 0x01:  # _STEP_REPLY_MASKS and _STEP_REPLY_MASKS_INFOS
            masks, offset = _read_array(payload, offset, extra)
        infos = _read_infos(payload, offset, extra, n)[0] if tag & 0x04 else EMPTY
        if min(a.ndim for a in (obs, final, masks) if a is not None) == 0:
            raise ValueError("a 0-d array where one row per env is due")
    except Exception as e:  # struct, NumPy and index errors of every kind: all mean a bad message
        raise ProtocolError(f"malformed compact message: {type(e).__name__}: {e}") from e
    if len(flags) != n or len(obs) != n or (masks is not None and len(masks) != n):
        raise ProtocolError("malformed compact step reply (lengths differ)")
    if quiet:  # no episode ended: the sparse columns share one read-only empty mapping
        no = np.zeros(n, dtype=bool)
        return StepReply(
            obs, rewards, no, no.copy(), final_obs=EMPTY, infos=infos, reset_infos=EMPTY, restarted=EMPTY,
            env_seconds=env_seconds, masks=masks, quiet=masks is None and infos is EMPTY,
        )  # fmt: skip
    bits = np.frombuffer(flags, dtype=np.uint8)
    # a compact reply never carries restarts (see _encode_step_reply)
    reply = StepReply(
        obs, rewards, (bits & _TERMINATED).astype(bool), (bits & _TRUNCATED).astype(bool),
        final_obs={}, infos=infos, reset_infos={}, restarted=EMPTY, env_seconds=env_seconds, masks=masks,
    )  # fmt: skip
    k = 0
    for pos, b in enumerate(flags):
        if b & _FINAL_OBS:
            if final is None or k >= len(final):
                raise ProtocolError("malformed compact step reply (final observations)")
            reply.final_obs[pos] = final[k]
            k += 1
        if b & _RESET_INFO:
            reply.reset_infos[pos] = {}
    if final is not None and k != len(final):
        raise ProtocolError("malformed compact step reply (final observations)")
    return reply


#: The header of a message of one frame: the count, then the frame's length.
_ONE_FRAME = struct.Struct("!IQ")


def _framed(payload: bytes | memoryview, extra: Sequence[bytes | memoryview]) -> list[bytes | memoryview]:
    if not extra:
        return [_ONE_FRAME.pack(1, memoryview(payload).nbytes), payload]
    lengths = [memoryview(payload).nbytes, *(memoryview(x).nbytes for x in extra)]
    header = COUNT.pack(len(lengths)) + struct.pack(f"!{len(lengths)}Q", *lengths)
    return [header, payload, *extra]


def encode(obj: Any, window: WindowWriter | None = None) -> list[bytes | memoryview]:
    """Encode ``obj`` as frames: a header, one payload, then the raw buffers of large arrays.

    Parameters
    ----------
    obj : object
        Anything cloudpickle can pickle. NumPy arrays inside it are written as raw
        bytes with their dtype and shape; those of at least
        :data:`OUT_OF_BAND_MIN_BYTES` are not copied at all but sent as separate
        frames after the payload. A step request, and a step reply whose infos are
        absent or fit columns (see ``_info_columns``), get a compact payload of raw
        arrays; everything else is one pickle.
    window : WindowWriter, optional
        The connection's shared window (a client on this machine): a compact step
        reply's observations of at least :data:`~daskvec.transport.window.WINDOW_MIN_BYTES`
        are written there instead of into the frames.

    Returns
    -------
    list of bytes-like
        ``[header, payload, buffer, ...]`` ready for :func:`socket.socket.sendmsg`.
    """
    if type(obj) is StepReply:
        quiet = _encode_quiet(obj, window)
        if quiet is not None:
            return quiet
        compact = _encode_step_reply(obj, window)
    else:
        request = _step_request_frames(obj)
        if request is not None:
            return request
        compact = _encode_step_request(obj)
    if compact is not None:
        return _framed(*compact)
    buffers: list[pickle.PickleBuffer] = []
    f = io.BytesIO()
    try:
        _Pickler(f, protocol=5, buffer_callback=buffers.append).dump(obj)
    except Exception:
        # The C pickler is several times faster than cloudpickle; fall back to it only
        # for what plain pickle cannot handle (lambdas, classes from __main__, ...).
        buffers.clear()
        f = io.BytesIO()
        _CloudPickler(f, protocol=5, buffer_callback=buffers.append).dump(obj)
    return _framed(f.getbuffer(), [b.raw() for b in buffers])


def decode(frames: Sequence[bytes | bytearray | memoryview], window: WindowReader | None = None) -> Any:
    """Decode the frames made by :func:`encode` (without the header frame).

    ``window`` is the channel's shared window, where a step reply's observations may be
    (a read-only view of it is returned, valid until the next request on the channel).

    Raises
    ------
    ProtocolError
        If the frames are not a message :func:`encode` could have made: no payload, an
        unknown tag, a malformed compact record, or a pickle that does not load (the
        original exception is the ``__cause__``). Nothing else escapes, whatever the
        bytes.
    """
    if not frames or not len(frames[0]):
        raise ProtocolError("malformed message (empty payload)")
    tag = frames[0][0]
    if tag == _PICKLE:
        try:
            return pickle.loads(frames[0], buffers=frames[1:])
        except Exception as e:
            raise PickleLoadError(f"malformed message (its pickle does not load: {type(e).__name__}: {e})") from e
    if tag == _STEP_REQUEST or tag in _REPLY_TAGS:
        return _decode_step(frames, window)
    raise ProtocolError(f"malformed message (payload starts with byte {tag})")


def unsendable(reply: Any, exc: Exception, worker: str) -> RemoteError:
    """The error sent back instead of a ``reply`` that :func:`encode` refused with ``exc`` (say, it does not pickle).

    Call it in the ``except`` block, for the traceback.
    """
    return RemoteError(
        type=f"{type(exc).__module__}.{type(exc).__qualname__}",
        message=f"the reply ({type(reply).__name__}) cannot be sent to the client: {exc}",
        traceback=traceback.format_exc(),
        env_index=None,
        worker=worker,
    )


def pack_reply(reply: Any, worker: str) -> bytes:
    """:func:`pack` of a reply, or of the :func:`unsendable` error if it cannot be encoded.

    An actor call that raised would read as a lost worker on the client; a value that
    does not pickle is the caller's problem, reported as the direct channel reports it.
    """
    try:
        return pack(reply)
    except Exception as e:
        return pack(unsendable(reply, e, worker))


def pack(obj: Any) -> bytes:
    """Encode ``obj`` into one bytes object (used by :class:`ActorChannel`)."""
    return b"".join(encode(obj))


def unpack(data: bytes | bytearray | memoryview) -> Any:
    """Inverse of :func:`pack`.

    Raises
    ------
    ProtocolError
        If ``data`` is not something :func:`pack` made.
    """
    view = memoryview(data).cast("B")
    try:
        (count,) = COUNT.unpack_from(view, 0)
        if not 0 < count <= MAX_FRAMES:
            raise ProtocolError(f"malformed packed message ({count} frames)")
        offset = COUNT.size
        lengths = struct.unpack_from(f"!{count}Q", view, offset)
    except struct.error as e:
        raise ProtocolError(f"malformed packed message: {e}") from e
    offset += 8 * count
    frames = []
    for n in lengths:
        if offset + n > view.nbytes:
            raise ProtocolError("malformed packed message (frames longer than the data)")
        frames.append(view[offset : offset + n])
        offset += n
    return decode(frames)
