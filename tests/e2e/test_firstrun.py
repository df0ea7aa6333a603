"""End-to-end test of a new user's first run: residentd and the CLI with no
socket named meet at the one default path; `residentd -m FILE` takes a file of
the current directory; a missing model names what was looked for and where; a
default socket directory that others could write to is refused.

It runs in a runtime directory of its own (XDG_RUNTIME_DIR a temporary
directory, the default path $XDG_RUNTIME_DIR/resident/socket), so that a
residentd on the user's own default socket (the one quickstart.sh leaves
running) is no obstacle. The last default, /tmp/resident-UID/socket, for a
shell without XDG_RUNTIME_DIR (root, ssh, a container, CI), is met too where
no residentd holds it already.
Automake runs it with RESIDENT_BUILDDIR set (exit 0 pass, 1 fail)."""
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "py"))
from common import Checks, binary  # noqa: E402

TIMEOUT = 30
TMP_SOCK = "/tmp/resident-%d/socket" % os.getuid()   # the default without XDG_RUNTIME_DIR


def env_of(**extra):
    """The environment without a socket named and without XDG_RUNTIME_DIR, plus extra."""
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_RUNTIME_DIR", "RESIDENT_SOCKET")}
    env.update(extra)
    return env


def listening(path):
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(path)
            return True
    except OSError:
        return False


def start_daemon(args, cwd, env, log):
    return subprocess.Popen([binary("residentd"), *args], cwd=cwd, env=env,
                            stdout=log, stderr=subprocess.STDOUT)


def wait_listening(proc, path):
    deadline = time.time() + 20
    while time.time() < deadline and proc.poll() is None:
        if listening(path):
            return True
        time.sleep(0.05)
    return False


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def cli(args, cwd, env):
    return subprocess.run([binary("resident"), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=TIMEOUT, errors="replace")


def first_run(c, tmp, env, sock, log, procs):
    """A daemon started with -m FILE of its directory, no socket named, found by the CLI at sock."""
    other = os.path.join(tmp, "elsewhere")
    d = start_daemon(["-m", "tiny.gguf"], tmp, env, log)
    procs.append(d)
    if not c(wait_listening(d, sock), f"residentd listens on {sock}"):
        log.seek(0)
        print(log.read()[-2000:])
        c.finish()
    mode = os.stat(os.path.dirname(sock)).st_mode & 0o777
    c.eq(mode, 0o700, "the default socket directory's mode")
    r = cli(["status"], other, env)
    c(r.returncode == 0 and "tiny" in r.stdout, f"`resident status` finds it: {r.stderr.strip()}")
    r = cli(["run", "--raw", "Once upon a time", "--max-tokens", "4", "--seed", "1"], other, env)
    c(r.returncode == 0 and r.stdout.strip() != "", f"`resident run` streams a reply: {r.stderr.strip()}")
    return d


def main():
    c = Checks()
    tmp = tempfile.mkdtemp(prefix="resident-firstrun.")
    other = os.path.join(tmp, "elsewhere")
    os.mkdir(other)
    run = os.path.join(tmp, "run")
    os.mkdir(run, 0o700)
    sock = os.path.join(run, "resident", "socket")
    log = open(os.path.join(tmp, "residentd.log"), "w+")
    env = env_of(XDG_DATA_HOME=os.path.join(tmp, "data"), XDG_CONFIG_HOME=os.path.join(tmp, "config"),
                 XDG_RUNTIME_DIR=run)
    procs = []
    try:
        for name in ("tiny.gguf", "tiny2.gguf"):
            subprocess.run([binary("resident-model"), "gen", "tiny", os.path.join(tmp, name),
                            "--type", "q8_0", "--quiet"], check=True, timeout=120)

        # a model file of the current directory, no slash, no socket named
        d = first_run(c, tmp, env, sock, log, procs)
        # a relative path given to the CLI is the CLI's, not the daemon's
        r = cli(["models", "load", "../tiny2.gguf"], other, env)
        c(r.returncode == 0 and "tiny2" in r.stdout, f"`models load ../tiny2.gguf` from another "
          f"directory: {r.stdout.strip()} {r.stderr.strip()}")
        r = cli(["run", "--model", "nosuch.gguf", "hi"], other, env)
        c(r.returncode != 0 and "no model named 'nosuch.gguf'" in r.stderr,
          f"an unknown model is named in the error: {r.stderr.strip()}")
        stop(d)
        c.eq(d.returncode, 0, "residentd's exit status on SIGTERM")
        c(not os.path.exists(sock), "the socket is removed at exit")

        # without XDG_RUNTIME_DIR: /tmp/resident-UID/socket, unless a residentd holds it
        if listening(TMP_SOCK):
            print(f"not met at {TMP_SOCK}: a residentd already listens there")
        else:
            d = first_run(c, tmp, env_of(XDG_DATA_HOME=env["XDG_DATA_HOME"], XDG_CONFIG_HOME=env["XDG_CONFIG_HOME"]),
                          TMP_SOCK, log, procs)
            stop(d)
            c(d.returncode == 0 and not os.path.exists(TMP_SOCK), f"{TMP_SOCK}: the daemon stops and removes it")

        # a missing model names what was looked for, and where
        r = subprocess.run([binary("residentd"), "-m", "missing.gguf", "-s", os.path.join(tmp, "s2")],
                           cwd=tmp, env=env, capture_output=True, text=True, timeout=TIMEOUT)
        c(r.returncode != 0 and os.path.join(tmp, "missing.gguf") in r.stderr,
          f"a missing model file: exit {r.returncode}, {r.stderr.strip()}")

        # a default socket directory that another user could write to is refused
        unsafe = os.path.join(tmp, "unsafe")
        os.mkdir(unsafe)
        os.chmod(unsafe, 0o777)
        r = subprocess.run([binary("residentd"), "-m", "tiny.gguf"], cwd=tmp,
                           env=dict(env, RESIDENT_SOCKET=os.path.join(unsafe, "socket")),
                           capture_output=True, text=True, timeout=TIMEOUT)
        c(r.returncode != 0 and "unsafe socket directory" in r.stderr,
          f"an unsafe socket directory: exit {r.returncode}, {r.stderr.strip()}")
        # and so is the default path given with -s, as libresident's --start gives it
        r = subprocess.run([binary("residentd"), "-m", "tiny.gguf", "-s", os.path.join(unsafe, "socket")], cwd=tmp,
                           env=dict(env, RESIDENT_SOCKET=os.path.join(unsafe, "socket")),
                           capture_output=True, text=True, timeout=TIMEOUT)
        c(r.returncode != 0 and "unsafe socket directory" in r.stderr,
          f"the default path given with -s, in an unsafe directory: exit {r.returncode}, {r.stderr.strip()}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)
    c.finish()


if __name__ == "__main__":
    main()
