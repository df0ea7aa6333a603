#!/usr/bin/env python3
"""test_full_disk.py: the database runs out of room in the middle of a turn.

Two ways to run out, the same checks for each:

1. A file size limit (RLIMIT_FSIZE, set on the running daemon with prlimit):
   writes past it fail with EFBIG. It needs no privilege, so it runs
   everywhere, CI included; it is how a full disk is tested there.
2. A real full filesystem: the database on a 1 MiB tmpfs that a filler file
   fills up; writes fail with ENOSPC. Mounting needs root: skipped otherwise.

Each time, with stored sessions and room left for less than a turn: a turn
streams its tokens, then its request ends with storage_full (a message
saying there is no space), its session is as it was, the other session too,
and the daemon serves what needs no writing. Once there is room again the
same turn is stored, and after a restart every turn is there and the
database passes PRAGMA integrity_check. The sessions' KV files, stored
beside the database, never take its last room (on the tmpfs: none at all).
"""
import os
import resource
import shutil
import sqlite3
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rsd  # noqa: E402
from rsd import Checks, Daemon, ProtoError  # noqa: E402

PAGE = 4096
TURN = dict(max_tokens=24, temperature=0)


def user(text):
    return [{"role": "user", "content": text}]


def turns_of(c, sid):
    return [(t["role"], t["content"], t["tokens"]) for t in c.call("session.get", session=sid)["turns"]]


def integrity(db):
    con = sqlite3.connect("file:%s?mode=ro" % db, uri=True)
    try:
        return con.execute("PRAGMA integrity_check").fetchall()
    finally:
        con.close()


def run(ck, d, name, fill, free):
    """The checks, with fill() taking the room away and free() giving it back."""
    c = d.client(timeout=300)
    s = c.call("session.new", title="kept")["session"]["session"]
    t = c.call("session.new", title="other")["session"]["session"]
    for i in range(2):
        c.generate(session=s, messages=user("turn %d of the kept session" % i), **TURN)
    c.generate(session=t, messages=user("the other session"), **TURN)
    before_s, before_t = turns_of(c, s), turns_of(c, t)

    fill()
    # a turn of several pages: a long message (its tokens are stored too)
    big = user("A long message to fill the disk. " * 60)
    rid = c.start_generate(session=s, messages=big, **TURN)
    tokens = 0
    while True:
        r = c.next(rid)
        if r["type"] != "token":
            break
        tokens += 1
    print("   %s: %d tokens, then %s: %s" % (name, tokens, r.get("code"), r.get("message")))
    ck.ok(tokens > 0, "%s: the turn streamed %d tokens before it was to be stored" % (name, tokens))
    ck.eq((r["type"], r.get("code")), ("error", "storage_full"), "%s: the turn ends with storage_full" % name)
    ck.ok("no space left" in r.get("message", ""), "%s: the message says why: %r" % (name, r.get("message")))
    ck.eq(turns_of(c, s), before_s, "%s: the session is as it was" % name)
    ck.eq(turns_of(c, t), before_t, "%s: the other session is intact" % name)
    try:
        c.call("session.new", title="no room", system="s" * (60 << 10))
        ck.ok(False, "%s: a session with a 60 KiB system prompt was created on a full disk" % name)
    except ProtoError as e:
        ck.eq(e.code, "storage_full", "%s: session.new on a full disk" % name)
    ck.ok(len(c.call("tokenize", text="still serving")["tokens"]) > 0, "%s: tokenize still works" % name)
    g = c.generate(prompt="no session, nothing to store", **TURN)
    ck.ok(g.finish in ("stop", "length"), "%s: a generate without a session still works" % name)
    ck.eq(len(c.call("session.list")["sessions"]), 2, "%s: session.list still works" % name)

    free()
    g = c.generate(session=s, messages=big, **TURN)
    ck.ok(g.finish in ("stop", "length"), "%s: with room again the same turn works" % name)
    after = turns_of(c, s)
    ck.eq(after[:len(before_s)], before_s, "%s: the earlier turns are still first" % name)
    ck.eq([(r, x) for r, x, _ in after[len(before_s):]], [("user", big[0]["content"]), ("assistant", g.text)],
          "%s: and the new turn is stored" % name)
    c.close()
    d.stop()
    ck.eq(integrity(d.db), [("ok",)], "%s: PRAGMA integrity_check after the stop" % name)
    d.start()
    with d.client() as c2:
        ck.eq(turns_of(c2, s), after, "%s: after a restart the session holds every turn" % name)
        ck.eq(turns_of(c2, t), before_t, "%s: and the other session too" % name)


def check_fsize(ck):
    """RLIMIT_FSIZE: room for one page more than the database and its WAL hold."""
    with ck.section("a file size limit (RLIMIT_FSIZE)"), Daemon() as d:
        pid = d.proc.pid
        soft, hard = resource.prlimit(pid, resource.RLIMIT_FSIZE)

        def fill():
            size = max(os.path.getsize(d.db), os.path.getsize(d.db + "-wal"))
            resource.prlimit(d.proc.pid, resource.RLIMIT_FSIZE, (size + PAGE, hard))

        def free():
            resource.prlimit(d.proc.pid, resource.RLIMIT_FSIZE, (soft, hard))

        run(ck, d, "RLIMIT_FSIZE", fill, free)


def check_tmpfs(ck):
    """A 1 MiB tmpfs under the database, filled by a file but for one page."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        print("-- a full tmpfs: SKIPPED (mounting one needs root; the file size limit above ran)")
        return
    mnt = tempfile.mkdtemp(prefix="rsd-tmpfs-")
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", mnt]).returncode != 0:
        os.rmdir(mnt)
        print("-- a full tmpfs: SKIPPED (mount failed)")
        return
    filler = os.path.join(mnt, "filler")
    try:
        with ck.section("a full filesystem (tmpfs)"), Daemon(db=os.path.join(mnt, "resident.db")) as d:
            def fill():
                with open(filler, "wb", buffering=0) as f:
                    try:
                        while f.write(b"\0" * PAGE):
                            pass
                    except OSError:
                        pass
                os.truncate(filler, max(0, os.path.getsize(filler) - PAGE))

            def free():
                os.unlink(filler)

            run(ck, d, "tmpfs", fill, free)
            # the KV files are a cache: the database keeps the last 64 MiB of its filesystem (kv/lock
            # holds only the daemon's pid)
            kv = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(os.path.join(mnt, "kv")) for f in fs
                     if f.endswith(".kv"))
            ck.eq(kv, 0, "tmpfs: the KV disk tier wrote nothing into a filesystem of 1 MiB")
            ck.ok("not written into the last 64 MiB" in d.log_text(0), "tmpfs: the daemon's log says why")
    finally:
        subprocess.run(["umount", mnt])
        os.rmdir(mnt)


def main():
    ck = Checks()
    check_fsize(ck)
    check_tmpfs(ck)
    return ck


if __name__ == "__main__":
    rsd.main(main)
