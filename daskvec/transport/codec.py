"""The codec: how requests and replies become frames, and back.

Step requests and the common step replies are compact records of raw arrays; every other
message is a pickle whose large arrays travel out of band (see :func:`encode`).
"""

from __future__ import annotations

import copyreg
import io
import logging
import pickle
import struct
import traceback
from collections import ChainMap
from collections.abc import Sequence
from typing import Any, cast

import cloudpickle
import numpy as np

from daskvec.protocol.messages import EMPTY, RemoteError, StepReply, StepRequest
from daskvec.transport.arrays import (
    ARRAY_HEAD,
    INLINE,
    META_IN,
    META_OUT,
    OUT_OF_BAND_MIN_BYTES,
    array_parts,
    read_array,
    remember,
)
from daskvec.transport.columns import SCHEMA_HEAD, info_columns, read_infos
from daskvec.transport.window import WINDOW_MIN_BYTES, WindowReader, WindowWriter
from daskvec.transport.wire import COUNT, MAX_FRAMES, PickleLoadError, ProtocolError

logger = logging.getLogger(__name__)

__all__ = ["OUT_OF_BAND_MIN_BYTES", "decode", "encode", "pack", "pack_reply", "unpack", "unsendable"]

# --------------------------------------------------------------------------- encoding


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
# The two messages of every step have a fixed form: a StepRequest and, in the common
# case, a StepReply whose envs returned no infos or the same scalar info keys (see
# info_columns), with empty reset infos and no restarts. They are written as raw arrays
# behind a one-byte tag instead of as a pickle: no pickler, no reduce callbacks, no
# objects to rebuild by the unpickler. Both sit on the critical path of every step (what
# this gains is measured in docs/benchmark.md). Every other message, and every step
# reply that does not fit (dict observations, infos of other shapes, reset infos that
# are not empty), stays a pickle. A pickle of protocol 2 or later starts with 0x80, so
# the tags below never collide with one.
_STEP_REQUEST = 0x01
_STEP_REPLY = 0x02
_PICKLE = 0x80
# a compact step reply followed by the envs' action masks, stacked
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
_F8 = np.dtype("<f8")
#: ``n`` zero bytes by ``n``: the flags of a step reply of ``n`` envs none of which ended its episode.
_ZERO_FLAGS: dict[int, bytes] = {}
#: Groups of more envs than this take the general way (their zero flags are not cached).
_ZERO_FLAGS_MAX_ENVS = 4096


def _zero_flags(n: int) -> bytes | None:
    """``n`` zero bytes, cached (``None`` for more than :data:`_ZERO_FLAGS_MAX_ENVS` envs: the general way)."""
    zeros = _ZERO_FLAGS.get(n)
    if zeros is None and 0 < n <= _ZERO_FLAGS_MAX_ENVS:
        zeros = remember(_ZERO_FLAGS, n, bytes(n))
    return zeros


def _raw_actions(request: StepRequest) -> np.ndarray | None:
    """The actions of ``request`` when they can travel as raw bytes, else ``None`` (the request is pickled)."""
    actions = request.actions
    if type(actions) is not np.ndarray or actions.dtype.hasobject:
        return None
    return actions


def _encode_step_request(actions: np.ndarray) -> tuple[bytes, list[memoryview]]:
    """The compact record of a step request's raw ``actions``: the tag, then the array."""
    parts: list[bytes] = [b"\x01"]  # _STEP_REQUEST
    extra: list[memoryview] = []
    array_parts(actions, parts, extra)
    return b"".join(parts), extra


#: The header frame and the payload's tag and array description of a small step request, by the actions' layout.
_REQUEST_HEAD: dict[tuple[np.dtype[Any], tuple[int, ...]], tuple[bytes, bytes]] = {}


def _step_request_frames(request: StepRequest) -> list[bytes | memoryview] | None:
    """The frames of ``request``, or ``None`` if its actions do not travel raw (then it is pickled).

    Those :func:`_framed` makes of :func:`_encode_step_request`'s record; for small
    actions of a layout sent before, from the header and payload prefix cached per
    layout (the first request of a layout takes the long way and fills the cache).
    """
    actions = _raw_actions(request)
    if actions is None:
        return None
    known = _REQUEST_HEAD.get((actions.dtype, actions.shape))
    if known is not None:
        return [known[0], known[1] + actions.tobytes()]
    payload, extra = _encode_step_request(actions)
    frames = _framed(payload, extra)
    if not extra:  # small actions, in the payload: their layout's header and prefix are cached
        prefix = payload[: len(payload) - actions.nbytes]
        remember(_REQUEST_HEAD, (actions.dtype, actions.shape), (bytes(frames[0]), prefix))
    return frames


def _encode_common_reply(reply: StepReply, window: WindowWriter | None) -> list[bytes | memoryview] | None:
    """The frames of the most common step reply, or ``None`` if ``reply`` is not one.

    No infos, masks, final observations, reset infos or restarts, no episode ended,
    and small observations of one array (neither out of band nor for the shared
    window): what :func:`_encode_step_reply` would write, with fewer checks to make.
    """
    obs, rewards = reply.obs, reply.rewards
    if (
        reply.infos
        or reply.final_obs
        or reply.reset_infos
        or reply.restarted
        or reply.masks is not None
        or type(obs) is not np.ndarray
        or type(rewards) is not np.ndarray
        or rewards.ndim != 1
    ):
        return None
    n = len(rewards)
    zeros = _zero_flags(n)
    terminated, truncated = reply.terminated, reply.truncated
    if (
        zeros is None
        or len(obs) != n
        or obs.nbytes >= OUT_OF_BAND_MIN_BYTES
        or obs.dtype.hasobject
        or (window is not None and obs.nbytes >= WINDOW_MIN_BYTES)
        or type(terminated) is not np.ndarray
        or terminated.dtype != np.bool_
        or terminated.shape != (n,)
        or type(truncated) is not np.ndarray
        or truncated.dtype != np.bool_
        or truncated.shape != (n,)
        or terminated.tobytes() != zeros
        or truncated.tobytes() != zeros
    ):
        return None
    meta = META_OUT.get((obs.dtype, obs.shape, INLINE))
    if meta is None:
        return None  # a layout not seen yet: the long way writes its description
    payload = b"".join(
        (
            _REPLY_HEAD.pack(_STEP_REPLY, reply.env_seconds, n),
            zeros,
            rewards.astype(_F8, copy=False).tobytes(),
            meta,
            obs.tobytes(),
        )
    )
    return [_ONE_FRAME.pack(1, len(payload)), payload]


def _encode_step_reply(reply: StepReply, window: WindowWriter | None) -> tuple[bytes, list[memoryview]] | None:
    """The compact form of a step reply, or None if it carries more than the flags can say.

    Large observations go into ``window`` when there is one (see :mod:`daskvec.transport.window`).
    """
    obs, rewards, terminated, truncated = reply.obs, reply.rewards, reply.terminated, reply.truncated
    if reply.restarted or any(reply.reset_infos.values()):
        return None
    infos = info_columns(reply.infos, len(rewards)) if reply.infos else None
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
    array_parts(obs, parts, extra, window if shared else None)
    if final:
        array_parts(np.stack(final), parts, extra)
    if masks is not None:
        array_parts(masks, parts, extra)
    if infos is not None:
        schema, present, columns = infos
        parts += [SCHEMA_HEAD.pack(len(schema)), schema]
        array_parts(present, parts, extra)
        for column in columns:
            array_parts(column, parts, extra)
    return b"".join(parts), extra


def _decode_common_reply(payload: Any, window: WindowReader | None) -> StepReply | None:
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
    if len(payload) < at + ARRAY_HEAD.size:
        return None
    zeros = _zero_flags(n)
    if zeros is None or payload[start : start + n] != zeros:
        return None
    end = at + ARRAY_HEAD.size + payload[at] + 8 * payload[at + 1]
    known = META_IN.get(bytes(payload[at:end]))
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
    return StepReply(obs, rewards, no, no.copy(), EMPTY, EMPTY, EMPTY, EMPTY, env_seconds, None)


def _decode_step(frames: Sequence[Any], window: WindowReader | None) -> Any:
    """Rebuild the message that the compact encoders wrote, as the pickle path would."""
    payload = frames[0]
    try:
        if len(frames) == 1 and (common := _decode_common_reply(payload, window)) is not None:
            return common
        extra = list(frames[1:])
        if payload[0] == _STEP_REQUEST:
            actions, _ = read_array(payload, 1, extra)
            return StepRequest(actions)
        tag, env_seconds, n = _REPLY_HEAD.unpack_from(payload, 0)
        offset = _REPLY_HEAD.size
        flags = bytes(payload[offset : offset + n])
        offset += n
        rewards = np.frombuffer(payload, dtype=_F8, count=n, offset=offset)
        if not rewards.flags.writeable:
            rewards = rewards.copy()
        offset += 8 * n
        obs, offset = read_array(payload, offset, extra, window)
        # most steps end no episode: then every flag is 0 and there is no final observation to read
        no_ends = flags.count(0) == n
        final = None
        if not no_ends and any(b & _FINAL_OBS for b in flags):
            final, offset = read_array(payload, offset, extra)
        masks = None
        if tag & 0x01:  # _STEP_REPLY_MASKS and _STEP_REPLY_MASKS_INFOS
            masks, offset = read_array(payload, offset, extra)
        infos = read_infos(payload, offset, extra, n)[0] if tag & 0x04 else EMPTY
        if min(a.ndim for a in (obs, final, masks) if a is not None) == 0:
            raise ValueError("a 0-d array where one row per env is due")
    except Exception as e:  # struct, NumPy and index errors of every kind: all mean a bad message
        raise ProtocolError(f"malformed compact message: {type(e).__name__}: {e}") from e
    if len(flags) != n or len(obs) != n or (masks is not None and len(masks) != n):
        raise ProtocolError("malformed compact step reply (lengths differ)")
    if no_ends:  # no episode ended: the sparse columns share one read-only empty mapping
        no = np.zeros(n, dtype=bool)
        return StepReply(
            obs,
            rewards,
            no,
            no.copy(),
            final_obs=EMPTY,
            infos=infos,
            reset_infos=EMPTY,
            restarted=EMPTY,
            env_seconds=env_seconds,
            masks=masks,
        )
    bits = np.frombuffer(flags, dtype=np.uint8)
    # a compact reply never carries restarts (see _encode_step_reply)
    reply = StepReply(
        obs,
        rewards,
        (bits & _TERMINATED).astype(bool),
        (bits & _TRUNCATED).astype(bool),
        final_obs={},
        infos=infos,
        reset_infos={},
        restarted=EMPTY,
        env_seconds=env_seconds,
        masks=masks,
    )
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
        frames after the payload. A :class:`~daskvec.protocol.messages.StepRequest`
        whose actions are an array, and a step reply whose infos are absent or fit
        columns (see ``info_columns``), get a compact payload of raw arrays; everything
        else is one pickle.
    window : WindowWriter, optional
        The connection's shared window (a client on this machine): a compact step
        reply's observations of at least :data:`~daskvec.transport.window.WINDOW_MIN_BYTES`
        are written there instead of into the frames.

    Returns
    -------
    list of bytes-like
        ``[header, payload, buffer, ...]`` ready for :func:`socket.socket.sendmsg`.
    """
    kind = type(obj)
    if kind is StepRequest:
        frames = _step_request_frames(obj)
        if frames is not None:
            return frames
    elif kind is StepReply:
        frames = _encode_common_reply(obj, window)
        if frames is None and (compact := _encode_step_reply(obj, window)) is not None:
            frames = _framed(*compact)
        if frames is not None:
            return frames
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
