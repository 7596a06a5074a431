"""A hot verb's call as one pre-packed write and one read, past redis-py's per-command work.

A module command's name and its 12 keys never change for a queue, so their RESP encoding
is made once (a script's EVALSHA, its SHA and its keys, too); a call packs only its ARGV
(hiredis) and writes the lot on a connection of the client: the single connection of a
single-thread client (a worker child), else one of the few the wire keeps (Wire._kept),
or one taken from the client's pool for the call and given back (so the connections of a
client of many threads stay bounded by its pool, however many threads call, and a thread
that finds them all busy waits as ``execute_command`` would). That skips, per call, the
argument filtering and the observability records of redis-py's ``execute_command``, and
for a worker child the pool checkout too (about a third of a child's CPU per job, see the
README's "where the time goes"). Replies and errors come from the connection's own parser,
so they are what ``execute_command`` would give. A connection error closes the connection and is
raised as ``WireBroken``: the caller sends the call again through ``execute_command``,
which has redis-py's retries (a verb is safe to send twice: enqueue is idempotent by job
id and every lease verb is fenced).

On a single connection a call may also be *posted* (``Wire.post``): written at once, its
reply read later, in order, before the reply of the connection's next call (a worker
child's acks, sent as each job finishes and read with the next claim's reply: one round
trip per batch, and no finished job waits for its ack). Until they are read, every other
use of the connection (redis-py's own commands too) reads them first; a connection closed
with replies owed marks each lost (``WireBroken``), for the caller to send again.
"""

from __future__ import annotations

import os
import weakref
from collections import deque
from collections.abc import Sequence
from typing import Any

import hiredis
import redis

from .cluster import is_cluster

#: Connections a pool's wires keep between calls (taken from it, given back to no one):
#: redis-py 8's checkout and release of a pool connection cost more than a loopback round
#: trip (its locks and observability records), paid per enqueue otherwise. Per pool, not
#: per queue, so an App of many queues keeps no more; none for a pool of fewer than
#: KEEP_FROM connections, where two idle ones would starve its other users.
KEEP = 2
KEEP_FROM = 16
_KEPT: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()


def kept_for(pool: Any) -> list[Any] | None:
    """The list of connections kept for ``pool`` (list.pop and append are atomic: threads
    share it without a lock), or None when it is too small to keep any."""
    if getattr(pool, "max_connections", 0) < KEEP_FROM:
        return None
    return _KEPT.setdefault(pool, [])


def _forget_kept() -> None:
    """A forked child: the kept sockets are its parent's (its pools start afresh too)."""
    for kept in list(_KEPT.values()):
        kept.clear()


os.register_at_fork(after_in_child=_forget_kept)


class WireBroken(Exception):
    """The connection failed mid-call (it is closed): send the call another way."""


#: What ``Owed.reply`` holds until the reply is read.
UNREAD: Any = object()
_BROKEN = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)


class Owed:
    """The reply of a posted call (``Wire.post``): UNREAD, then the reply, the error reply
    (a ResponseError), or a WireBroken when the connection closed before it was read."""

    __slots__ = ("command", "reply")

    def __init__(self, command: str) -> None:
        self.command = command   # the command sent (its name: FCALL, EVALSHA, EMQ.ACK...)
        self.reply: Any = UNREAD


def _body(packed: bytes) -> bytes:
    """A RESP array without its ``*N`` header."""
    return packed[packed.index(b"\r\n") + 2:]


class Packer:
    """RESP arrays of a command, its keys and its arguments: the head (command and keys,
    the same on every call of a queue) packed once."""

    def __init__(self) -> None:
        self._prefixes: dict[tuple[str, tuple[Any, ...]], bytes] = {}

    def pack(self, command: str, keys: Sequence[Any], args: Sequence[Any]) -> bytes:
        head = (command, tuple(keys))
        prefix = self._prefixes.get(head)
        if prefix is None:
            words: tuple[Any, ...] = (command, *keys)
            prefix = self._prefixes[head] = _body(hiredis.pack_command(words))
        tail = _body(hiredis.pack_command(tuple[Any, ...](args))) if args else b""
        return b"*%d\r\n" % (1 + len(keys) + len(args)) + prefix + tail


class Wire:
    """Pre-packed calls on one client; ``usable`` is False where it cannot help (a cluster
    client, which must route each call, or a client of another shape)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        # redis-py keeps a single-connection client's one connection in ``connection``
        self.single = getattr(client, "connection", None) is not None
        self.pool: Any = getattr(client, "connection_pool", None)
        self.usable = not is_cluster(client) and (
            self.single or isinstance(self.pool, redis.ConnectionPool))
        self.packer = Packer()
        #: The pool's connections kept between calls (kept_for), or None.
        self._kept = kept_for(self.pool) if self.usable and not self.single else None
        #: Posted calls whose replies are not read yet, in the order they were sent.
        self._owed: deque[Owed] = deque()
        self._raw_send: Any = None   # the single connection's own send, once guarded

    def call(self, command: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        packed = self.packer.pack(command, keys, args)
        if self.single:
            if not self._owed:
                return _exchange(self.client.connection, packed)
            return self._exchange_behind([packed])[0]
        conn = self._take()
        clean = False
        try:
            reply = _exchange(conn, packed)
            clean = True
            return reply
        except redis.exceptions.ResponseError:
            clean = True    # an error reply, read whole: the connection is in step
            raise
        finally:
            if clean and self._kept is not None and len(self._kept) < KEEP:
                self._kept.append(conn)
            else:
                if not clean:   # interrupted between the write and the read: a reply
                    conn.disconnect()   # may be left unread, which no later call may get
                self.pool.release(conn)

    def call_many(self, calls: Sequence[tuple[str, Sequence[Any], Sequence[Any]]]
                  ) -> list[Any]:
        """Several calls in one write and one round trip (a worker child's batch: its
        finished jobs' acks and the claim of the next ones); per call its reply, or the
        error reply as a ResponseError (the others are applied all the same). Only on a
        single-connection client; a broken connection is WireBroken (closed), as ``call``."""
        assert self.single
        return self._exchange_behind([self.packer.pack(c, k, a) for c, k, a in calls],
                                     errors=True)

    # -- posted calls (a single connection) ----------------------------------------------
    def post(self, command: str, keys: Sequence[Any], args: Sequence[Any]) -> Owed:
        """Write a call on the single connection now and read its reply later (``collect``,
        or before the next call's): its Owed. Never raises for the connection: a write that
        fails closes it, and the Owed (with every other one unread) holds a WireBroken."""
        assert self.single
        conn = self.client.connection
        self._guard(conn)
        owed = Owed(command)
        try:
            self._raw_send([self.packer.pack(command, keys, args)], check_health=False)
        except _BROKEN as exc:
            conn.disconnect()   # (the guard marks the ones owed before it)
            owed.reply = WireBroken(str(exc))
            return owed
        self._owed.append(owed)
        return owed

    @property
    def owed(self) -> int:
        """How many posted calls' replies are not read yet."""
        return len(self._owed)

    def collect(self) -> None:
        """Read the reply of every posted call (each into its Owed), in order."""
        if self._owed:
            self._read_owed(self.client.connection)

    def poll(self) -> None:
        """Read the owed replies that have arrived, waiting for none: a connection the
        server closed meanwhile is found now (its replies lost: sent again alone), not
        after the job that runs next, whose slot no longer keeps the acked job's lease."""
        if self._owed:
            self._read_owed(self.client.connection, wait=False)

    def _guard(self, conn: Any) -> None:
        """Make every other use of the connection read the owed replies first, and its
        close mark them lost: redis-py's own commands on it (a PING, a script's EVAL, a
        FUNCTION LOAD) send through ``send_packed_command`` and close through
        ``disconnect``, which are wrapped on this connection object (redis-py calls both
        through ``self``, reconnects and handshakes included)."""
        if self._raw_send is not None:
            return
        raw_send, raw_disconnect = conn.send_packed_command, conn.disconnect

        def send_packed_command(command: Any, check_health: bool = True) -> None:
            if self._owed:
                self._read_owed(conn)
            raw_send(command, check_health)

        def disconnect(*args: Any, **kwargs: Any) -> None:
            lost, self._owed = self._owed, deque()
            for owed in lost:
                owed.reply = WireBroken("the connection closed before the reply was read")
            raw_disconnect(*args, **kwargs)

        self._raw_send = raw_send
        conn.send_packed_command = send_packed_command
        conn.disconnect = disconnect

    def _read_owed(self, conn: Any, wait: bool = True) -> bool:
        """Read the owed replies in order (``wait`` False: those already in); False when
        the connection broke (closed: the ones not read are marked lost)."""
        try:
            while self._owed and (wait or conn.can_read(timeout=0)):
                owed = self._owed[0]
                try:
                    owed.reply = conn.read_response()
                except redis.exceptions.ResponseError as exc:
                    owed.reply = exc
                self._owed.popleft()
        except _BROKEN:
            conn.disconnect()
            return False
        except BaseException:
            # Interrupted mid-way (a signal handler's exception, raised into a task that
            # uses this connection: its Aborted, its time limit): which reply is next is no
            # longer known. Closed, every reply owed is lost (sent again alone: fenced)
            # rather than handed to the wrong call.
            conn.disconnect()
            raise
        return True

    def _exchange_behind(self, packed: list[bytes], errors: bool = False) -> list[Any]:
        """Calls written in one write on the single connection behind the posted ones
        (whose replies are read first): their replies, an error reply raised (``errors``:
        kept in its place). A broken connection is WireBroken (closed), as ``call``."""
        conn = self.client.connection
        send = self._raw_send or conn.send_packed_command
        out: list[Any] = []
        try:
            send([b"".join(packed)], check_health=False)
        except _BROKEN as exc:
            conn.disconnect()
            raise WireBroken(str(exc)) from exc
        try:
            if not self._read_owed(conn):
                raise WireBroken("the connection broke while replies were read")
            for _ in packed:
                try:
                    out.append(conn.read_response())
                except redis.exceptions.ResponseError as exc:
                    if not errors:
                        raise   # (the one call's reply, read whole: in step)
                    out.append(exc)
        except _BROKEN as exc:
            conn.disconnect()
            raise WireBroken(str(exc)) from exc
        except (WireBroken, redis.exceptions.ResponseError):
            raise
        except BaseException:   # interrupted with replies unread (as in _read_owed)
            conn.disconnect()
            raise
        return out

    def _take(self) -> Any:
        try:
            return self._kept.pop()   # type: ignore[union-attr]
        except (IndexError, AttributeError):
            return self.pool.get_connection()   # waits while the pool is busy (PoolBusy)


def _exchange(conn: Any, packed: bytes) -> Any:
    """One packed command written and its reply read on a connection."""
    try:
        conn.send_packed_command([packed], check_health=False)
        return conn.read_response()
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
            OSError) as exc:
        conn.disconnect()
        raise WireBroken(str(exc)) from exc
    except redis.exceptions.ResponseError:
        raise
    except BaseException:   # interrupted between the write and the read: a reply left
        conn.disconnect()   # unread, which the connection's next call must not get
        raise


class AsyncWire:
    """Wire for a ``redis.asyncio`` client (aqueue.py): a call packed here, written and read
    on a connection of the client's pool. The pure-Python packing of redis-py's asyncio
    client is most of a producer call's time on the event loop (a hot verb has 12 keys),
    which every other task of the loop waits through. A connection error is WireBroken
    (the connection closed by redis-py): send the call again through ``execute_command``."""

    def __init__(self, client: Any) -> None:
        import redis.asyncio as aioredis

        self.pool: Any = getattr(client, "connection_pool", None)
        self.usable = (not is_cluster(client) and getattr(client, "connection", None) is None
                       and isinstance(self.pool, aioredis.ConnectionPool))
        self.packer = Packer()

    async def call(self, command: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        packed = self.packer.pack(command, keys, args)
        conn = await self.pool.get_connection()   # waits while the pool is busy (PoolBusy)
        try:
            # Each disconnects on a fault, a timeout or a cancel (a reply left unread must
            # never reach the connection's next user); an error reply is raised as is.
            await conn.send_packed_command([packed], check_health=False)
            return await conn.read_response()
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
                OSError) as exc:
            raise WireBroken(str(exc)) from exc
        finally:
            await self.pool.release(conn)
