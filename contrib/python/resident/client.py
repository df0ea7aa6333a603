"""The blocking client: one connection to residentd.

Many requests may be in flight on one Client, from one thread (several
generations iterated in turn) or from several threads: whichever caller
waits reads the socket for everyone and routes each reply to the queue of
its request id, and the others wait on a condition until theirs is there.
"""
import collections
import socket
import threading

from . import _wire, errors


class Generation(_wire.GenerationBase):
    """A generate request in flight. Iterating it yields Token objects as they
    come (none with stream=False); then .done holds the Done. An error reply
    is raised from the iteration."""

    def __iter__(self):
        return self

    def __next__(self):
        tok = None if self.done is not None else self._take(self._client._reply(self.id))
        if tok is None:
            raise StopIteration
        return tok

    def result(self):
        """Reads the rest; returns the Done (its .text is the whole text)."""
        for _ in self:
            pass
        return self.done

    def cancel(self):
        """Asks the daemon to stop; the generation then ends with finish
        "cancel". Harmless if it has ended already."""
        try:
            self._client.cancel(self.id)
        except errors.NotFound:
            pass


class Client(_wire.Ops):
    """A connection to residentd.

        with resident.Client() as c:
            for tok in c.generate(messages=[{"role": "user", "content": "Hi"}]):
                print(tok.text, end="")

    socket_path: the daemon's socket (default resident.default_socket()).
    client: the name this client gives in `hello` (shown by `resident
    status`); None sends no hello. timeout: seconds to wait for a reply
    (None: no limit), then TimeoutError. Raises ConnectError when nobody
    listens.
    """

    def __init__(self, socket_path=None, client="python", timeout=None):
        self.path = socket_path or _wire.default_socket()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.connect(self.path)
        except OSError as e:
            self._sock.close()
            raise _wire.connect_error(self.path, e) from None
        self._sock.settimeout(timeout)
        self._decoder = _wire.Decoder()
        self._cond = threading.Condition()
        self._send_lock = threading.Lock()
        self._queues = {}
        self._next_id = 0
        self._reading = False
        self._dead = None
        self.server = self.hello(client) if client is not None else None

    # ---- the connection

    def close(self):
        """Closes the connection; requests in flight are dropped (the daemon cancels them)."""
        with self._cond:
            if self._dead is None:
                self._dead = errors.ConnectionLost("the client was closed")
            self._cond.notify_all()
        self._sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _send(self, op, fields):
        """Sends a request; returns its id."""
        with self._cond:
            if self._dead is not None:
                raise self._dead
            self._next_id += 1
            rid = self._next_id
            self._queues[rid] = collections.deque()
        msg = {"id": rid, "op": op}
        msg.update(fields)
        try:
            with self._send_lock:
                self._sock.sendall(_wire.encode(msg))
        except OSError as e:
            self._fail(self._said_why() or errors.ConnectionLost("writing to residentd: %s" % (e.strerror or e)))
            raise self._dead from None
        return rid

    def _said_why(self):
        """After a failed write: the reason the daemon gave before it closed
        the connection (overloaded when it has too many clients, sent at
        once), if no other thread is reading and the reply is there."""
        with self._cond:
            if self._reading:
                return None
            self._sock.settimeout(0)
            try:
                data = self._sock.recv(1 << 16)
            except OSError:
                data = b""
            try:
                replies = self._decoder.feed(data) if data else []
            except errors.ResidentError:
                replies = []
            self._route(replies)
            return self._dead

    def _fail(self, exc):
        """The connection is over: every waiter gets exc."""
        with self._cond:
            if self._dead is None:
                self._dead = exc
            self._cond.notify_all()

    def _read(self):
        """One read of the socket (outside the lock); returns the replies it completes."""
        try:
            data = self._sock.recv(1 << 16)
        except socket.timeout:
            raise TimeoutError("no reply from residentd within %ss" % self._sock.gettimeout()) from None
        except OSError as e:
            raise errors.ConnectionLost("reading from residentd: %s" % (e.strerror or e)) from None
        if not data:
            raise errors.ConnectionLost("residentd closed the connection")
        return self._decoder.feed(data)

    def _route(self, replies):
        """Puts replies in their requests' queues (with the lock held)."""
        for r in replies:
            q = self._queues.get(r.get("id"))
            if q is not None:
                q.append(r)
            elif r.get("id") is None and _wire.lost_reason(r) is not None and self._dead is None:
                self._dead = _wire.lost_reason(r)

    def _reply(self, rid):
        """The next reply of request rid, reading for everyone while it waits."""
        with self._cond:
            while True:
                q = self._queues.get(rid)
                if q:
                    return q.popleft()
                if self._dead is not None:
                    raise self._dead
                if self._reading:
                    self._cond.wait()
                    continue
                self._reading = True
                self._cond.release()
                replies, lost = [], None
                try:
                    replies = self._read()      # a TimeoutError goes to this caller only
                except errors.ResidentError as e:
                    lost = e
                finally:
                    self._cond.acquire()
                    self._reading = False
                    self._route(replies)
                    if lost is not None and self._dead is None:
                        self._dead = lost
                    self._cond.notify_all()

    def _forget(self, rid):
        """The request's last reply came: later replies with its id are dropped."""
        with self._cond:
            self._queues.pop(rid, None)

    def call(self, op, progress=None, **fields):
        """Any op with the given fields; returns its result without id and
        type. progress(done, total) gets the progress replies (model.load)."""
        rid = self._send(op, _wire.fields(**fields))
        try:
            while True:
                r = self._reply(rid)
                result = _wire.call_step(op, r)
                if result is not None:
                    return result
                if progress is not None:
                    progress(r.get("done", 0), r.get("total", 0))
        finally:
            self._forget(rid)

    def _op(self, op, key, progress=None, **fields):
        """An op for _wire.Ops: the result's field key (None: the whole result; False: nothing)."""
        result = self.call(op, progress, **fields)
        return result if key is None else result.get(key) if key else None

    def generate(self, prompt=None, messages=None, *, session=None, model=None, stream=True, **params):
        """Starts a generation and returns its Generation at once. Exactly one
        of prompt (raw text) and messages ([{role, content}], with the chat
        template); session continues one with messages. params: max_tokens,
        temperature, top_k, top_p, min_p, repeat_penalty, presence_penalty,
        frequency_penalty, seed, stop (a string or a list), priority,
        logprobs, keep_alive, n (several choices of the prompt: each
        Token's choice says whose, done.choices has each one's; PROTOCOL.md,
        generate); and to constrain the
        output, at most one of grammar (grammar text), json_schema (a dict,
        or a JSON Schema's JSON text) and json=True (any JSON object); for
        tool calls, tools (a list of OpenAI's tools, or its JSON text) and
        tool_choice ("auto", "none", "required" or {"type": "function",
        "function": {"name": ...}}): the done's tool_calls. Messages may be
        tool results ({"role": "tool", "content", "tool_call_id", "name"})
        and assistant messages with tool_calls."""
        rid = self._send("generate", _wire.generate_fields(prompt, messages, session, model, stream, params))
        return Generation(self, rid, stream)


def connect(socket_path=None, client="python", timeout=None):
    """A blocking Client (see Client)."""
    return Client(socket_path, client, timeout)
