"""End-to-end test of socket activation: this process plays systemd. It binds
and listens on a Unix socket, then forks and execs residentd with the socket
at fd 3, LISTEN_FDS=1 and LISTEN_PID the child's pid (sd_listen_fds(3)), and
checks that:
  - a client that connected before residentd started, and new ones, are served;
  - residentd binds nothing of its own, and leaves the socket file when it
    stops; a second residentd on the same socket serves what queued meanwhile;
  - a wrong LISTEN_PID is ignored: residentd binds its own socket, and the
    passed one is not served;
  - a passed fd that is not one listening AF_UNIX stream socket is refused
    with a message that says what it is instead;
  - systemd's own systemd-socket-activate starts it at the first client (when
    it is there);
  - contrib/systemd's units pass `systemd-analyze verify` (when it is there).
Automake runs it with RESIDENT_BUILDDIR and RESIDENT_SRCDIR set."""
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rsd  # noqa: E402
from common import builddir, srcdir  # noqa: E402

TIMEOUT = 30


class Activated:
    """residentd exec'ed as systemd does it: fds at 3..., LISTEN_FDS, LISTEN_PID."""

    def __init__(self, tmp, fds, model, listen_pid="child", n_fds=None, name="d"):
        self.own_sock = os.path.join(tmp, name + ".own")
        self.log = os.path.join(tmp, name + ".log")
        argv = [rsd.daemon_path(), "-m", model, "-s", self.own_sock, "--db", os.path.join(tmp, "db")]
        env = {k: v for k, v in os.environ.items() if not k.startswith("LISTEN_")}
        env.setdefault("ASAN_OPTIONS", "detect_leaks=1")
        logfd = os.open(self.log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        self.pid = os.fork()
        if self.pid == 0:  # the child: only async-signal-safe work until exec
            try:
                os.dup2(logfd, 1)
                os.dup2(logfd, 2)
                # out of the way of 3.. first, so that no dup2 clobbers one still to go
                high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in fds]
                for i, fd in enumerate(high):
                    os.dup2(fd, 3 + i)
                    os.set_inheritable(3 + i, True)
                env["LISTEN_FDS"] = str(len(fds)) if n_fds is None else n_fds
                env["LISTEN_PID"] = str(os.getpid() if listen_pid == "child" else listen_pid)
                os.execve(argv[0], argv, env)
            finally:
                os._exit(127)
        os.close(logfd)
        self.status = None

    def exited(self, timeout=0.0):
        """The exit status once it exited, else None (after waiting up to timeout)."""
        deadline = time.monotonic() + timeout
        while self.status is None:
            pid, st = os.waitpid(self.pid, os.WNOHANG)
            if pid != 0:
                self.status = os.waitstatus_to_exitcode(st)
            elif time.monotonic() >= deadline:
                break
            else:
                time.sleep(0.02)
        return self.status

    def stop(self):
        """SIGTERM; its exit status."""
        if self.exited() is None:
            os.kill(self.pid, signal.SIGTERM)
        if self.exited(TIMEOUT) is None:
            os.kill(self.pid, signal.SIGKILL)
            return self.exited(TIMEOUT)
        return self.status

    def log_text(self):
        with open(self.log, errors="replace") as f:
            return f.read()


def listener(path, kind=socket.SOCK_STREAM, listen=True):
    s = socket.socket(socket.AF_UNIX, kind)
    s.bind(path)
    if listen:
        s.listen(16)
    return s


def served(path, ck, what):
    """A client on path says hello and gets a generated reply."""
    with rsd.Client(path, timeout=TIMEOUT) as c:
        h = c.call("hello", client="test_systemd", version=1)
        g = c.generate(prompt="Once upon a time", max_tokens=4, temperature=0)
        return ck(h["version"] == 1 and len(g.tokens) == 4, "%s: hello and 4 tokens" % what)


def wait_connectable(path, d):
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline and d.exited() is None:
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(path)
                return True
        except OSError:
            time.sleep(0.02)
    return False


def activation(ck, tmp, model):
    path = os.path.join(tmp, "systemd.sock")
    ls = listener(path)
    # a client that comes before the daemon waits in the socket's queue
    early = rsd.Client(path, timeout=TIMEOUT)
    hello = early.request("hello", client="early", version=1)
    d = Activated(tmp, [ls.fileno()], model, name="first")
    try:
        with ck.section("a client that came first is served"):
            ck.eq(early.next(hello)["type"], "result", "its hello's reply")
        with ck.section("clients of the passed socket are served"):
            served(path, ck, "a new client")
            a, b = rsd.Client(path, timeout=TIMEOUT), rsd.Client(path, timeout=TIMEOUT)
            ra = a.start_generate(prompt="one", max_tokens=8, temperature=0)
            rb = b.start_generate(prompt="two", max_tokens=8, temperature=0)
            ck(len(a.collect(ra).tokens) == 8 and len(b.collect(rb).tokens) == 8, "two clients at once")
            a.close(), b.close()
            ck(not os.path.exists(d.own_sock), "no socket of its own is bound (-s is not used)")
            ck("socket activation: serving the socket systemd passed (%s, fd 3)" % path in d.log_text(),
               "the log says which socket it serves")
        early.close()
        ck.eq(d.stop(), 0, "exit status on SIGTERM")
        ck(os.path.exists(path), "the socket file is systemd's: still there after residentd stopped")

        with ck.section("a restart on the same socket serves who waited meanwhile"):
            waiting = rsd.Client(path, timeout=TIMEOUT)
            rid = waiting.request("hello", client="waiting", version=1)
            d = Activated(tmp, [ls.fileno()], model, name="second")
            ck.eq(waiting.next(rid)["type"], "result", "the waiting client's hello")
            waiting.close()
            ck.eq(d.stop(), 0, "exit status on SIGTERM")
    finally:
        if d.exited() is None:
            d.stop()
    return ls, path


def wrong_pid(ck, tmp, model, ls, path):
    with ck.section("a wrong LISTEN_PID is ignored"):
        d = Activated(tmp, [ls.fileno()], model, listen_pid=os.getpid(), name="wrongpid")
        try:
            if ck(wait_connectable(d.own_sock, d), "it binds its own socket (-s)"):
                served(d.own_sock, ck, "its own socket")
            with rsd.Client(path, timeout=1) as c:
                rid = c.request("hello", client="ignored", version=1)
                try:
                    c.next(rid)
                    ck(False, "the passed socket is not served")
                except TimeoutError:
                    ck(True, "the passed socket is not served")
            ck.eq(d.stop(), 0, "exit status on SIGTERM")
            ck(os.path.exists(path), "the passed socket's file is left alone")
            ck(not os.path.exists(d.own_sock), "its own socket is removed at exit")
        finally:
            if d.exited() is None:
                d.stop()


def bad_fds(ck, tmp, model):
    """fd 3 that is not one listening AF_UNIX stream socket: exit 1 and why."""
    f = open(os.path.join(tmp, "a-file"), "w")
    dgram = listener(os.path.join(tmp, "dgram.sock"), socket.SOCK_DGRAM, listen=False)
    idle = listener(os.path.join(tmp, "idle.sock"), listen=False)
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(1)
    two = [listener(os.path.join(tmp, "two.%d.sock" % i)) for i in range(2)]
    cases = [
        ("a file", [f.fileno()], None, "fd 3 is not a socket"),
        ("a datagram socket", [dgram.fileno()], None, "fd 3 is not a stream socket"),
        ("a socket that does not listen", [idle.fileno()], None, "fd 3 is not listening"),
        ("a TCP socket", [tcp.fileno()], None, "fd 3 is not a Unix socket"),
        ("two sockets", [s.fileno() for s in two], None, "systemd passed 2 sockets; residentd serves one"),
        ("no fd 3", [], "1", "socket activation: LISTEN_FDS: Bad file descriptor"),
        ("LISTEN_FDS not a number", [two[0].fileno()], "x", "socket activation: LISTEN_FDS: Invalid argument"),
    ]
    with ck.section("a passed fd that is not a listening Unix stream socket"):
        for name, fds, n, want in cases:
            d = Activated(tmp, fds, model, n_fds=n, name="bad")
            st = d.exited(TIMEOUT)
            if st is None:
                d.stop()
            log = d.log_text()
            ck(st == 1 and want in log, "%s: exit %s, %r" % (name, st, log.strip()[-300:]))
    for s in [f, dgram, idle, tcp] + two:
        s.close()


def socket_activate(ck, tmp, model):
    """systemd's own tool: it listens, and execs residentd at the first connection."""
    tool = shutil.which("systemd-socket-activate")
    if tool is None:
        print("(systemd-socket-activate is not installed: not tried with it)")
        return
    with ck.section("systemd-socket-activate"):
        path = os.path.join(tmp, "ssa.sock")
        log = open(os.path.join(tmp, "ssa.log"), "w+")
        p = subprocess.Popen([tool, "-l", path, rsd.daemon_path(), "-m", model, "--db", os.path.join(tmp, "db")],
                             stdout=log, stderr=subprocess.STDOUT)
        try:
            # the tool binds the path before it listens: a connection refused in between starts nothing
            deadline = time.monotonic() + TIMEOUT
            while True:
                try:
                    served(path, ck, "started at the first client")
                    break
                except (FileNotFoundError, ConnectionRefusedError):
                    if time.monotonic() > deadline or p.poll() is not None:
                        raise
                    time.sleep(0.02)
            p.send_signal(signal.SIGTERM)
            ck.eq(p.wait(TIMEOUT), 0, "exit status on SIGTERM")
            log.seek(0)
            text = log.read()
            ck("serving the socket systemd passed (%s, fd 3)" % path in text, "its log: %r" % text[-600:])
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
            log.close()


def units(ck, tmp):
    """systemd-analyze verify on the units, the service's ExecStart the built residentd."""
    src = os.path.join(srcdir(), "contrib", "systemd", "residentd.socket")
    with open(src) as f:
        ck("ListenStream=%t/resident/socket\n" in f.read(),
           "residentd.socket listens where clients look with XDG_RUNTIME_DIR set")
    if shutil.which("systemd-analyze") is None:
        print("(systemd-analyze is not installed: the units are not verified)")
        return
    with ck.section("systemd-analyze verify"):
        udir = os.path.join(tmp, "units")
        os.mkdir(udir)
        shutil.copy(src, udir)
        with open(os.path.join(builddir(), "contrib", "systemd", "residentd.service")) as f:
            service = f.read()
        ck("ExecStart=/" in service, "the built service names residentd by an absolute path")
        with open(os.path.join(udir, "residentd.service"), "w") as f:
            f.write("\n".join("ExecStart=" + rsd.daemon_path() if line.startswith("ExecStart=") else line
                              for line in service.split("\n")))
        # Documentation=man:residentd(8) is looked up: in the repository's man page
        man8 = os.path.join(tmp, "man", "man8")
        os.makedirs(man8)
        shutil.copy(os.path.join(srcdir(), "contrib", "man", "residentd.8"), man8)
        run = os.path.join(tmp, "run")
        os.mkdir(run, 0o700)
        env = dict(os.environ, XDG_RUNTIME_DIR=run, MANPATH=os.path.join(tmp, "man"))
        r = subprocess.run(["systemd-analyze", "verify", "--user", "residentd.socket", "residentd.service"],
                           cwd=udir, env=env, capture_output=True, text=True, timeout=60)
        # it exits 0 on keys it ignores: any word from it is a finding
        ck(r.returncode == 0 and r.stdout.strip() == "" and r.stderr.strip() == "",
           "systemd-analyze verify --user: exit %d %s%s" % (r.returncode, r.stdout, r.stderr))


def test():
    ck = rsd.Checks()
    tmp = tempfile.mkdtemp(prefix="rsd-systemd-")
    try:
        model = rsd.gen_model(os.path.join(tmp, "tiny.gguf"))
        ls, path = activation(ck, tmp, model)
        wrong_pid(ck, tmp, model, ls, path)
        ls.close()
        bad_fds(ck, tmp, model)
        socket_activate(ck, tmp, model)
        units(ck, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return ck


if __name__ == "__main__":
    rsd.main(test)
