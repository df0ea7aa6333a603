#!/usr/bin/env python3
"""test_isolation.py: a session belongs to the uid that created it.

As root: the daemon is started with --group nogroup (socket 0660), and a
forked child that setuid()s to another uid (65534) checks that it can neither
list, get, resume (generate on), rename, fork nor delete root's session: each
must be `not_found` with the same message as a uuid that does not exist. Its
own sessions work. Nor can it cancel a request of root's in flight, which runs
to its end. Root then checks that its session is untouched and that it
cannot see the child's. Skipped (77) when not root.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rsd  # noqa: E402
from rsd import OTHER_UID, Checks, Daemon, ProtoError  # noqa: E402

MISSING = "0badc0de-0000-4000-8000-000000000000"


def user(t):
    return [{"role": "user", "content": t}]


def err_of(fn):
    try:
        fn()
    except ProtoError as e:
        return e.code, e.reply.get("message", "")
    return ("no error", "")


def child(sock, victim, victim_rid_hint):
    """Runs as OTHER_UID; returns (checks failed, own session uuid)."""
    ck = Checks()
    with rsd.Client(sock, timeout=30) as c:
        ck.eq(c.call("hello", client="intruder")["uid"], OTHER_UID, "the daemon sees the other uid")
        # first, while root's request is most likely still streaming (root checks that it runs to its end)
        ck.code(lambda: c.call("cancel", target=victim_rid_hint), "not_found",
                "cancel of another client's request id")
        ck.ok(victim not in [s["session"] for s in c.call("session.list", limit=1000)["sessions"]],
              "session.list does not show another uid's session")
        ops = [
            ("session.get", lambda u: c.call("session.get", session=u)),
            ("generate (resume)", lambda u: c.generate(session=u, messages=user("let me in"), max_tokens=2)),
            ("session.rename", lambda u: c.call("session.rename", session=u, title="pwned")),
            ("session.fork", lambda u: c.call("session.fork", session=u)),
            ("session.delete", lambda u: c.call("session.delete", session=u)),
        ]
        for name, fn in ops:
            got = err_of(lambda: fn(victim))
            ref = err_of(lambda: fn(MISSING))
            ck.eq(got[0], "not_found", "%s of another uid's session" % name)
            ck.eq(got[1].replace(victim, "<uuid>"), ref[1].replace(MISSING, "<uuid>"),
                  "%s: the same message as for a missing uuid" % name)
        # its own sessions work
        mine = c.call("session.new", title="mine")["session"]
        ck.eq(mine["title"], "mine", "own session.new")
        g = c.generate(session=mine["session"], messages=user("hello"), max_tokens=3, temperature=0)
        ck.eq(g.done.get("session"), mine["session"], "own generate")
        ck.eq(len(c.call("session.get", session=mine["session"])["turns"]), 2, "own session.get")
        ck.eq(c.call("session.rename", session=mine["session"], title="mine2")["session"]["title"], "mine2",
              "own rename")
        f = c.call("session.fork", session=mine["session"])["session"]
        ck.eq(sorted(s["session"] for s in c.call("session.list")["sessions"]),
              sorted([mine["session"], f["session"]]), "session.list shows exactly its own sessions")
        c.call("session.delete", session=f["session"])
        ck.eq([s["session"] for s in c.call("session.list")["sessions"]], [mine["session"]], "own delete")
    print("   as uid %d: %d checks, %d failed" % (OTHER_UID, ck.n, len(ck.failed)), flush=True)
    return ck.failed, mine["session"]


def drain(c, rid):
    """The last reply of request rid, its tokens read past."""
    while True:
        r = c.next(rid)
        if r["type"] in ("done", "error"):
            return r


def main():
    gname, gid = rsd.other_uid_group()
    ck = Checks()
    with Daemon(extra=["--group", gname]) as d:
        os.chmod(d.tmp, 0o711)  # let the other uid reach the socket inside
        st = os.stat(d.sock)
        ck.eq((oct(st.st_mode & 0o777), st.st_gid), (oct(0o660), gid), "--group: socket 0660 of the group")
        c = d.client()
        s = c.call("session.new", title="root's secret", system="classified")["session"]["session"]
        g = c.generate(session=s, messages=user("the launch codes are"), max_tokens=4, temperature=0)
        before = c.call("session.get", session=s)
        # a request in flight of root's, to try to cancel from the other uid: it must run to its end
        # (whether it is still running once the child is done depends on the machine's speed alone)
        rid = c.start_generate(prompt=rsd.long_prompt(c, n=1000), max_tokens=1000, temperature=0)
        ck.eq(c.next(rid)["type"], "token", "root's request streams")
        failed, theirs = rsd.as_uid(OTHER_UID, gid, lambda: child(d.sock, s, rid))
        r = drain(c, rid)
        ck.ok(r["type"] == "done" and r.get("finish") in ("length", "stop"),
              "root's request runs to its end past the other uid's cancel: %s %s" % (r["type"], r.get("finish")))
        rid = c.start_generate(prompt=rsd.long_prompt(c, n=1000), max_tokens=1000, temperature=0)
        ck.eq(c.next(rid)["type"], "token", "root's second request streams")
        c.call("cancel", target=rid)
        r = drain(c, rid)
        ck.eq((r["type"], r.get("finish")), ("done", "cancel"), "root cancels its own request")
        for f in failed:
            ck.ok(False, "as uid %d: %s" % (OTHER_UID, f))
        after = c.call("session.get", session=s)
        ck.eq(after, dict(before, id=after["id"]), "root's session is untouched")
        ck.eq(g.done.get("session"), s, "root's generate")
        if theirs:
            ck.code(lambda: c.call("session.get", session=theirs), "not_found",
                    "root cannot get the other uid's session either")
            ck.ok(theirs not in [x["session"] for x in c.call("session.list")["sessions"]],
                  "root's session.list does not show the other uid's session")
        c.close()
    return ck


if __name__ == "__main__":
    rsd.main(main)
