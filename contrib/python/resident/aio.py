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
from ._wire import Done, Token


class AsyncGeneration:
    """A generate request in flight: `async for` yields Token objects, then
    .done holds the Done. An error reply is raised from the iteration."""

    def __init__(self, client, rid, stream):
        self._client = client
        self.id = rid
        self.stream = stream
        self.done = None
        self._pieces = []

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self.done is not None:
            raise StopAsyncIteration
        r = await self._client._reply(self.id)
        if r["type"] == "token":
            tok = Token(r)
            self._pieces.append(tok.text)
            return tok
        self._client._forget(self.id)
        if r["type"] == "done":
            self.done = Done(r, "".join(self._pieces))
            raise StopAsyncIteration
        if r["type"] == "error":
            raise errors.from_reply(r)
        raise errors.ProtocolError("unexpected reply to generate: %r" % r["type"])

    async def result(self):
        """Reads the rest; returns the Done (its .text is the whole text)."""
        async for _ in self:
            pass
        return self.done

    @property
    def text(self):
        return self.done.text if self.done is not None else "".join(self._pieces)

    async def cancel(self):
        """Asks the daemon to stop; the generation ends with finish "cancel".
        Harmless if it has ended already."""
        try:
            await self._client.cancel(self.id)
        except errors.NotFound:
            pass


class AsyncClient:
    """A connection to residentd for asyncio; made by `await connect(...)`."""

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
                if r["type"] == "progress":
                    if progress is not None:
                        p = progress(r.get("done", 0), r.get("total", 0))
                        if inspect.isawaitable(p):
                            await p
                elif r["type"] == "error":
                    raise errors.from_reply(r)
                elif r["type"] == "result":
                    return _wire.result_fields(r)
                else:
                    raise errors.ProtocolError("unexpected reply to %s: %r" % (op, r["type"]))
        finally:
            self._forget(rid)

    # ---- operations: as resident.Client's, awaited

    async def hello(self, client="python"):
        return await self.call("hello", client=client, version=_wire.PROTOCOL_VERSION)

    async def generate(self, prompt=None, messages=None, *, session=None, model=None, stream=True, **params):
        """Sends a generate; returns its AsyncGeneration (see Client.generate)."""
        rid = await self._send("generate", _wire.generate_fields(prompt, messages, session, model, stream, params))
        return AsyncGeneration(self, rid, stream)

    async def cancel(self, generation):
        await self.call("cancel", target=getattr(generation, "id", generation))

    async def session_new(self, model=None, title=None, system=None, defaults=None):
        return (await self.call("session.new", model=model, title=title, system=system,
                                defaults=defaults))["session"]

    async def session_list(self, limit=None, offset=None):
        return (await self.call("session.list", limit=limit, offset=offset))["sessions"]

    async def session_get(self, session):
        return await self.call("session.get", session=session)

    async def session_fork(self, session, title=None):
        return (await self.call("session.fork", session=session, title=title))["session"]

    async def session_rename(self, session, title):
        return (await self.call("session.rename", session=session, title=title))["session"]

    async def session_delete(self, session):
        await self.call("session.delete", session=session)

    async def model_list(self):
        return (await self.call("model.list"))["models"]

    async def model_load(self, model, progress=None):
        return (await self.call("model.load", progress=progress, model=model))["model"]

    async def model_unload(self, model):
        await self.call("model.unload", model=model)

    async def tokenize(self, text, model=None, special=None, bos=None):
        return (await self.call("tokenize", text=text, model=model, special=special, bos=bos))["tokens"]

    async def detokenize(self, tokens, model=None, special=None):
        return (await self.call("detokenize", tokens=list(tokens), model=model, special=special))["text"]

    async def status(self):
        return await self.call("status")


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
