"""What the blocking and the asyncio clients share: the socket path, frames,
request fields and the shape of replies (PROTOCOL.md)."""
import errno
import json
import os
import struct

import msgpack

from . import errors

PROTOCOL_VERSION = 1
# replies larger than this are taken for garbage (libresident's bound too)
MAX_REPLY = 256 << 20


def default_socket():
    """The daemon's socket when none is given: $RESIDENT_SOCKET, else
    $XDG_RUNTIME_DIR/resident/socket, else /tmp/resident-UID/socket (as
    residentd and libresident compute it)."""
    env = os.environ.get("RESIDENT_SOCKET")
    if env:
        return env
    run = os.environ.get("XDG_RUNTIME_DIR")
    if run and run.startswith("/"):
        return run + "/resident/socket"
    return "/tmp/resident-%d/socket" % os.getuid()


def connect_error(path, exc):
    """The ConnectError for a failed connect to path."""
    if isinstance(exc, FileNotFoundError):
        why = "residentd is not running (no socket at %s)" % path
    elif isinstance(exc, ConnectionRefusedError):
        why = "residentd is not running (nobody listens at %s)" % path
    elif getattr(exc, "errno", None) == errno.ENAMETOOLONG or "too long" in str(exc):
        why = "the socket path %s is too long" % path
    else:
        why = "cannot connect to %s: %s" % (path, getattr(exc, "strerror", None) or exc)
    return errors.ConnectError(why)


def encode(msg):
    """One frame: a 4-byte big-endian length, then the msgpack map."""
    body = msgpack.packb(msg, use_bin_type=True)
    return struct.pack(">I", len(body)) + body


def body_length(header):
    """The length announced by a frame's 4-byte header; ProtocolError if impossible."""
    n = struct.unpack(">I", header)[0]
    if n == 0 or n > MAX_REPLY:
        raise errors.ProtocolError("residentd sent a frame of a bad length (%d bytes)" % n)
    return n


def decode(body):
    """A reply frame's body: a map with an id (None allowed) and a type."""
    try:
        r = msgpack.unpackb(body, raw=False, strict_map_key=False)
    except Exception as e:  # msgpack raises several types for malformed input
        raise errors.ProtocolError("residentd sent a frame that is not msgpack: %s" % e) from None
    if not isinstance(r, dict) or not isinstance(r.get("type"), str):
        raise errors.ProtocolError("residentd sent a reply that is not a map with a type")
    return r


class Decoder:
    """Splits a byte stream into replies."""

    def __init__(self):
        self.buf = bytearray()

    def feed(self, data):
        """Adds bytes; returns the complete replies they finish."""
        self.buf += data
        out = []
        while len(self.buf) >= 4:
            n = body_length(bytes(self.buf[:4]))
            if len(self.buf) < 4 + n:
                break
            out.append(decode(bytes(self.buf[4:4 + n])))
            del self.buf[:4 + n]
        return out


def lost_reason(reply):
    """For a reply without an id: the reason the connection ends, if it does
    (frame_too_large, overloaded: too many clients, frame_timeout; the daemon
    closes it), else None."""
    if reply.get("type") != "error" or reply.get("code") not in (
            "frame_too_large", "overloaded", "frame_timeout"):
        return None
    return errors.from_reply(reply)


def json_text(value, types, what):
    """A field the protocol takes as JSON text (json_schema, tools): a
    string is taken as that text, a value of types is dumped, keys in their
    order (a schema's properties' order is the output's). what begins the
    TypeError for any other value."""
    if isinstance(value, str):
        return value
    if not isinstance(value, types):
        raise TypeError("%s or its JSON text, not %s" % (what, type(value).__name__))
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def tool_choice_fields(choice):
    """tool_choice: "auto", "none", "required", or a tool's name as
    {"type": "function", "function": {"name": ...}} (OpenAI's) or
    {"name": ...}: the protocol's tool_name."""
    if choice is None or isinstance(choice, str):
        return {"tool_choice": choice}
    name = choice.get("function", choice).get("name") if isinstance(choice, dict) else None
    if not isinstance(name, str):
        raise TypeError("tool_choice must be \"auto\", \"none\", \"required\" or "
                        "{\"type\": \"function\", \"function\": {\"name\": ...}}")
    return {"tool_name": name}


def message_fields(m):
    """A message as the protocol has it: an assistant's tool_calls as
    {id, name, arguments} with arguments JSON text (OpenAI's
    {id, type, function: {name, arguments}} and arguments as a dict are
    taken too); content None is left out."""
    m = {k: v for k, v in m.items() if v is not None}
    calls = m.get("tool_calls")
    if calls:
        out = []
        for c in calls:
            fn = c.get("function", c)
            args = fn.get("arguments", {})
            out.append({k: v for k, v in (("id", c.get("id")), ("name", fn.get("name")),
                                          ("arguments", args if isinstance(args, str) else
                                           json.dumps(args, ensure_ascii=False))) if v is not None})
        m["tool_calls"] = out
    return m


def generate_fields(prompt, messages, session, model, stream, params):
    """The fields of a generate request. stop may be one string; json_schema
    a dict; tools a list; tool_choice OpenAI's. Fields given as None are left
    out (the daemon's defaults apply)."""
    f = {"prompt": prompt, "session": session, "model": model, "stream": bool(stream),
         "messages": None if messages is None else [message_fields(m) for m in messages]}
    params = dict(params)
    f.update(tool_choice_fields(params.pop("tool_choice", None)))
    f.update(params)
    if isinstance(f.get("stop"), str):
        f["stop"] = [f["stop"]]
    if f.get("json_schema") is not None:   # a dict, or a boolean schema
        f["json_schema"] = json_text(f["json_schema"], (dict, bool),
                                     "json_schema must be a dict (a JSON Schema)")
    if f.get("tools") is not None:         # OpenAI's {"type": "function", "function": {...}} or flat
        f["tools"] = json_text(f["tools"], (list, tuple), "tools must be a list of tools")
    return {k: v for k, v in f.items() if v is not None}


def fields(**kw):
    """Request fields without those given as None."""
    return {k: v for k, v in kw.items() if v is not None}


def result_fields(reply):
    """A result or done reply without the protocol's id and type."""
    return {k: v for k, v in reply.items() if k not in ("id", "type")}


class Token:
    """A generated piece: text (of the answer: whole UTF-8 characters, maybe
    ""), reasoning (what the model thought before answering, apart from it:
    Qwen3's <think> block, gpt-oss's analysis channel; maybe ""), tool (a tool
    call's text: gpt-oss's commentary channel, Qwen's <tool_call> blocks; maybe ""), id (the token id),
    logprob (a float with logprobs=True, else None), choice (which of the
    n choices it is of; 0 with one)."""

    __slots__ = ("text", "reasoning", "tool", "id", "logprob", "choice")

    def __init__(self, reply):
        self.text = reply.get("text", "")
        self.reasoning = reply.get("reasoning", "")
        self.tool = reply.get("tool", "")
        self.id = reply.get("token")
        self.logprob = reply.get("logprob")
        self.choice = reply.get("choice", 0)

    def __repr__(self):
        return "Token(%r, id=%r)" % (self.text, self.id)


class Choice:
    """One output of a generation: finish ("stop", "length", "context" or
    "cancel"), text (all the answer), reasoning and tool (all of them, ""
    for none), generated_tokens; with tools: tool_calls (a list of {id, name,
    arguments}, arguments JSON text; [] for none), tool_error (a call that did
    not parse, or None) and calls_in_text (the calls were the answer's text)."""

    __slots__ = ("finish", "text", "reasoning", "tool", "generated_tokens", "tool_calls", "tool_error",
                 "calls_in_text")

    def __init__(self, fields, streamed, generated):
        self.finish = fields.get("finish")
        self.text = fields.get("text", streamed["text"])
        self.reasoning = fields.get("reasoning", streamed["reasoning"])
        self.tool = fields.get("tool", streamed["tool"])
        self.generated_tokens = fields.get("generated_tokens", generated)
        self.tool_calls = fields.get("tool_calls", [])
        self.tool_error = fields.get("tool_error")
        self.calls_in_text = bool(fields.get("calls_in_text"))

    def __repr__(self):
        return "Choice(finish=%r, text=%r)" % (self.finish, self.text)


class Done(Choice):
    """The end of a generation: usage (a dict: prompt_tokens, cached_tokens,
    generated_tokens, drafted_tokens, accepted_tokens, ttft_ms, tokens_per_s;
    the prompt counted once for all choices), session (its uuid, or None),
    choices (a Choice for each of the n asked for, in order) and, as its own
    fields, the first choice's (finish, text, ...: the whole output when n
    is 1)."""

    __slots__ = ("usage", "session", "choices")

    def __init__(self, reply, streamed):
        self.usage = reply.get("usage") or {}
        self.session = reply.get("session")
        if "choices" in reply:
            self.choices = [Choice(ch, streamed(i), None) for i, ch in enumerate(reply["choices"])]
        else:
            self.choices = [Choice(reply, streamed(0), self.usage.get("generated_tokens"))]
        for k in Choice.__slots__:
            setattr(self, k, getattr(self.choices[0], k))

    def __repr__(self):
        return "Done(finish=%r, usage=%r, session=%r)" % (self.finish, self.usage, self.session)


def call_step(op, reply):
    """One reply of a call that is not a generate: its result (without id and
    type) at the end, None for a progress reply; an error reply is raised."""
    if reply["type"] == "progress":
        return None
    if reply["type"] == "error":
        raise errors.from_reply(reply)
    if reply["type"] == "result":
        return result_fields(reply)
    raise errors.ProtocolError("unexpected reply to %s: %r" % (op, reply["type"]))


class GenerationBase:
    """What a Generation and an AsyncGeneration share: the replies of one
    generate turned into Token objects and, at the end, .done (a Done)."""

    def __init__(self, client, rid, stream):
        self._client = client
        self.id = rid
        self.stream = stream
        self.done = None
        self._pieces = {}       # choice -> {part: [pieces]}

    def _take(self, reply):
        """A token reply's Token; None after the done reply; raises an error reply."""
        if reply["type"] == "token":
            tok = Token(reply)
            for k, pieces in self._pieces.setdefault(tok.choice, {"text": [], "reasoning": [], "tool": []}).items():
                pieces.append(getattr(tok, k))
            return tok
        self._client._forget(self.id)
        if reply["type"] == "done":
            self.done = Done(reply, self._streamed)
            return None
        if reply["type"] == "error":
            raise errors.from_reply(reply)
        raise errors.ProtocolError("unexpected reply to generate: %r" % reply["type"])

    def _streamed(self, choice):
        """Each part of a choice's pieces received so far, joined."""
        pieces = self._pieces.get(choice, {})
        return {k: "".join(pieces.get(k, ())) for k in ("text", "reasoning", "tool")}

    @property
    def text(self):
        """The answer received so far (all of it once done); the first choice's."""
        return self.done.text if self.done is not None else self._streamed(0)["text"]

    @property
    def reasoning(self):
        """The reasoning received so far (all of it once done); the first choice's."""
        return self.done.reasoning if self.done is not None else self._streamed(0)["reasoning"]


class Ops:
    """The protocol's ops other than generate, written once for both clients:
    each is one self._op(op, key, progress, **fields), which the blocking
    Client runs to its result and the AsyncClient turns into a coroutine.
    A field given as None is left out (the daemon's default)."""

    def hello(self, client="python"):
        """Returns version, server, max_frame, uid, capabilities."""
        return self._op("hello", None, client=client, version=PROTOCOL_VERSION)

    def cancel(self, generation):
        """Cancels a generation in flight on this client (a Generation or its
        id); it then ends with finish "cancel". NotFound if it is not in flight."""
        return self._op("cancel", False, target=getattr(generation, "id", generation))

    def session_new(self, model=None, title=None, system=None, defaults=None):
        """A new session; returns it (a dict: session, title, model, system, ...)."""
        return self._op("session.new", "session", model=model, title=title, system=system, defaults=defaults)

    def session_list(self, limit=None, offset=None):
        """Sessions, most recently updated first."""
        return self._op("session.list", "sessions", limit=limit, offset=offset)

    def session_get(self, session):
        """{"session": the session, "turns": [{role, content, tokens}]}."""
        return self._op("session.get", None, session=session)

    def session_fork(self, session, title=None):
        """A new session with the parent's history; returns it."""
        return self._op("session.fork", "session", session=session, title=title)

    def session_rename(self, session, title):
        """Returns the renamed session."""
        return self._op("session.rename", "session", session=session, title=title)

    def session_delete(self, session):
        return self._op("session.delete", False, session=session)

    def model_list(self):
        """Models: dicts of name, path, arch, format, size, loaded, default."""
        return self._op("model.list", "models")

    def model_load(self, model, progress=None):
        """Loads a model by name or path (as the daemon sees it);
        progress(done, total) in bytes. Returns the model."""
        return self._op("model.load", "model", progress, model=model)

    def model_unload(self, model):
        """Unloads a model; requests running on it end with finish "cancel".
        Returns model (its map), unloaded (it was loaded) and cancelled."""
        return self._op("model.unload", None, model=model)

    def model_show(self, model=None):
        """A model, loaded or not (None: the default one): its map with
        parameters, quantization, tensor_types, context, template and sizes."""
        return self._op("model.show", "model", model=model)

    def tokenize(self, text, model=None, special=None, bos=None):
        """Token ids of text. special: parse special-token texts; bos: add BOS
        (None: the model's choice)."""
        return self._op("tokenize", "tokens", text=text, model=model, special=special, bos=bos)

    def detokenize(self, tokens, model=None, special=None):
        """The text of token ids; special renders special tokens."""
        return self._op("detokenize", "text", tokens=list(tokens), model=model, special=special)

    def embed(self, input, model=None, dimensions=None, truncate=None, keep_alive=None):
        """Vectors of inputs (a str, or a list of str or of token id lists) by
        an embedding model (None: the default one), cut to dimensions floats
        (None: the model's); truncate cuts inputs longer than its context.
        Returns {"embeddings": one list of floats an input, "dimensions",
        "model", "tokens": each input's, "usage": {"prompt_tokens",
        "truncated", "load_ms", "total_ms"}}."""
        inputs = input if isinstance(input, str) else [x if isinstance(x, str) else list(x) for x in input]
        return self._op("embed", None, input=inputs, model=model, dimensions=dimensions, truncate=truncate,
                        keep_alive=keep_alive)

    def status(self):
        """version, uptime_s, models, clients, steps, active, queued,
        requests, kv, memory."""
        return self._op("status", None)
