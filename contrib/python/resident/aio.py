"""The asyncio client: one connection to residentd, its replies read by one
task and routed to the queue of their request id, so that any number of
requests may be in flight at once.

    c = await resident.aio.connect()
    async for tok in await c.generate(messages=[{"role": "user", "content": "Hi"}]):
        print(tok.text, end="")
    await c.close()
"""
import asyncio
import inspect

from . import _wire, errors


class AsyncGeneration(_wire.GenerationBase):
    """A generate request in flight: `async for` yields Token objects, then
    .done holds the Done. An error reply is raised from the iteration."""

    def __aiter__(self):
        return self

    async def __anext__(self):
        tok = None if self.done is not None else self._take(await self._client._reply(self.id))
        if tok is None:
            raise StopAsyncIteration
        return tok

    async def result(self):
        """Reads the rest; returns the Done (its .text is the whole text)."""
        async for _ in self:
            pass
        return self.done

    async def cancel(self):
        """Asks the daemon to stop; the generation ends with finish "cancel".
        Harmless if it has ended already."""
        try:
            await self._client.cancel(self.id)
        except errors.NotFound:
            pass


class AsyncClient(_wire.Ops):
    """A connection to residentd for asyncio; made by `await connect(...)`.
    Its calls are resident.Client's, each returning an awaitable."""

    def __init__(self, path, reader, writer):
        self.path = path
        self.server = None
        self._reader = reader
        self._writer = writer
        self._queues = {}
        self._next_id = 0
        self._dead = None
        self._write_lock = asyncio.Lock()
        self._task = asyncio.ensure_future(self._read_loop())

    async def _read_loop(self):
        """Reads replies until the connection ends; then every waiter gets the reason."""
        reason = None
        try:
            while True:
                n = _wire.body_length(await self._reader.readexactly(4))
                r = _wire.decode(await self._reader.readexactly(n))
                q = self._queues.get(r.get("id"))
                if q is not None:
                    q.put_nowait(r)
                elif r.get("id") is None and _wire.lost_reason(r) is not None:
                    reason = reason or _wire.lost_reason(r)
        except asyncio.IncompleteReadError:
            reason = reason or errors.ConnectionLost("residentd closed the connection")
        except errors.ResidentError as e:
            reason = e
        except OSError as e:
            reason = errors.ConnectionLost("reading from residentd: %s" % (e.strerror or e))
        except asyncio.CancelledError:
            reason = errors.ConnectionLost("the client was closed")
        self._dead = self._dead or reason
        for q in self._queues.values():
            q.put_nowait(None)

    async def close(self):
        """Closes the connection; requests in flight are dropped (the daemon cancels them)."""
        if self._dead is None:
            self._dead = errors.ConnectionLost("the client was closed")
        self._task.cancel()
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except OSError:
            pass
        try:
            await self._task
        except asyncio.CancelledError:
            pass

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    async def _send(self, op, fields):
        if self._dead is not None:
            raise self._dead
        self._next_id += 1
        rid = self._next_id
        self._queues[rid] = asyncio.Queue()
        msg = {"id": rid, "op": op}
        msg.update(fields)
        try:
            async with self._write_lock:
                self._writer.write(_wire.encode(msg))
                await self._writer.drain()
        except OSError as e:
            # the daemon may have said why before it closed (overloaded: too many clients): the read loop has it
            await asyncio.wait({self._task}, timeout=1.0)
            self._dead = self._dead or errors.ConnectionLost("writing to residentd: %s" % (e.strerror or e))
            raise self._dead from None
        return rid

    async def _reply(self, rid):
        q = self._queues.get(rid)
        if q is None or (q.empty() and self._dead is not None):
            raise self._dead or errors.ProtocolError("no such request")
        r = await q.get()
        if r is None:
            q.put_nowait(None)      # for a later call on the same request
            raise self._dead
        return r

    def _forget(self, rid):
        self._queues.pop(rid, None)

    async def call(self, op, progress=None, **fields):
        """Any op; returns its result without id and type. progress(done,
        total) gets model.load's progress (a coroutine function is awaited)."""
        rid = await self._send(op, _wire.fields(**fields))
        try:
            while True:
                r = await self._reply(rid)
                result = _wire.call_step(op, r)
                if result is not None:
                    return result
                if progress is not None:
                    p = progress(r.get("done", 0), r.get("total", 0))
                    if inspect.isawaitable(p):
                        await p
        finally:
            self._forget(rid)

    async def _op(self, op, key, progress=None, **fields):
        """An op for _wire.Ops: the result's field key (None: the whole result; False: nothing)."""
        result = await self.call(op, progress, **fields)
        return result if key is None else result.get(key) if key else None

    async def generate(self, prompt=None, messages=None, *, session=None, model=None, stream=True, **params):
        """Sends a generate; returns its AsyncGeneration (see Client.generate)."""
        rid = await self._send("generate", _wire.generate_fields(prompt, messages, session, model, stream, params))
        return AsyncGeneration(self, rid, stream)


async def connect(socket_path=None, client="python"):
    """An AsyncClient connected to residentd (socket: default_socket()); sends
    hello with the client name unless it is None. Raises ConnectError."""
    path = socket_path or _wire.default_socket()
    try:
        reader, writer = await asyncio.open_unix_connection(path, limit=_wire.MAX_REPLY)
    except OSError as e:
        raise _wire.connect_error(path, e) from None
    c = AsyncClient(path, reader, writer)
    if client is not None:
        try:
            c.server = await c.hello(client)
        except BaseException:
            await c.close()
            raise
    return c
