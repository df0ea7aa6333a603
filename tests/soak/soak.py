#!/usr/bin/env python3
"""soak.py: residentd under a long random load, with crashes.

64 clients, each with its own sessions, run a random mix of operations:
generate (on one of their sessions, or a raw prompt), cancel mid-stream,
hang up mid-stream (on a second connection), tokenize and detokenize, new,
fork, rename and delete sessions, list and status. In some rounds the daemon
is killed with SIGKILL at a random moment, then restarted on the same
database. After every round:

  - every turn whose `done` the daemon sent is in its session, in order;
    turns whose fate a client could not see (a hang-up, a crash) are there
    or not, and nothing else is (each message carries a unique tag);
  - each session's counters match its turns, the database passes SQLite's
    `PRAGMA integrity_check` and `foreign_key_check`;
  - nothing is left in the queue or running (status), only the checker is
    connected;
  - a daemon that lived through the round has the open file descriptors it
    had at its start, and its RSS, less what its host KV tier gained
    (status: kv.host_bytes, bounded by --kv-host), is within RSS_SLACK_MB
    of it (its start: after a warm-up that touched its whole KV pool; not
    measured under ASan).

    soak.py [--duration SECONDS] [--seed N]   (or RESIDENT_SOAK_SECONDS)

`make check` runs it for SOAK_CHECK_S seconds; by hand, e.g. an hour:
RESIDENT_SOAK_SECONDS=3600 RESIDENT_BUILDDIR=build/dev nice python3 tests/soak/soak.py
The last lines are the figures: rounds, kills, turns finished and found,
RSS and descriptors at the start and the end.
"""
import argparse
import os
import random
import sqlite3
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "e2e"))
import rsd  # noqa: E402
from rsd import Checks, Daemon, ProtoError  # noqa: E402

N_CLIENTS = 64
SOAK_CHECK_S = 60           # the default: make check's share
ROUND_S = (8.0, 16.0)       # a round lasts this long (uniform), unless the daemon is killed
KILL_P = 0.5                # the share of rounds in which the daemon is killed
MAX_SESSIONS = 4            # a client's own sessions at once
CTX, KV_TOKENS, MAX_SEQS = 512, 16384, 32
RSS_SLACK_MB = 16
# a reply later than this is a hang; generous, since a loaded machine (a run
# under nice beside other work) can make a request wait a minute in the queue
REPLY_TIMEOUT_S = 300
WORDS = ("the sea light keeper night storm ship rock lamp wave bird stone tide harbour rope oil "
         "glass wind salt north").split()
# errors that mean the daemon is gone (killed): the client stops for the round
GONE = (rsd.Closed, ConnectionError, BrokenPipeError, FileNotFoundError, OSError, TimeoutError)


class Session:
    """What a client knows of one of its sessions: the entries (a user
    message and the reply) in order, each certain (its done was seen) or
    not (the request's outcome is unknown), and the titles it may have."""

    def __init__(self, uuid, entries=None, titles=("",)):
        self.uuid = uuid
        # [user, reply (None: unknown), certain, counted (already counted in the figures)]
        self.entries = list(entries or [])
        self.titles = set(titles)
        self.maybe_deleted = False
        self.full = False                    # context_exceeded: no more turns


class Stats:
    def __init__(self):
        self.mu = threading.Lock()
        self.ops = {}
        self.codes = {}
        self.turns_finished = 0
        self.slowest = (0.0, "")     # the longest operation: seconds, name

    def op(self, name):
        with self.mu:
            self.ops[name] = self.ops.get(name, 0) + 1

    def code(self, code):
        with self.mu:
            self.codes[code] = self.codes.get(code, 0) + 1

    def took(self, seconds, name):
        with self.mu:
            self.slowest = max(self.slowest, (seconds, name))

    def finished(self):
        with self.mu:
            self.turns_finished += 1


class Worker(threading.Thread):
    """One client: a random operation after another until the round ends or the daemon is gone."""

    def __init__(self, idx, sock, sessions, stats, stop, seed, failures):
        super().__init__(daemon=True)
        self.idx, self.sock, self.sessions, self.stats = idx, sock, sessions, stats
        self.stop, self.rng, self.failures = stop, random.Random(seed), failures
        self.n = 0
        self.c = None
        self.gone = None     # how the connection to the daemon was lost, if it was

    # ---- helpers
    def tag(self):
        self.n += 1
        return "c%d-%d-%d" % (self.idx, self.n, self.rng.randrange(1 << 30))

    def text(self):
        return "%s %s" % (self.tag(), " ".join(self.rng.choice(WORDS) for _ in range(self.rng.randint(1, 12))))

    def usable(self):
        return [s for s in self.sessions if not s.full and not s.maybe_deleted]

    def sampling(self):
        kw = dict(max_tokens=self.rng.randint(1, 24))
        if self.rng.random() < 0.5:
            kw["temperature"] = 0
        else:
            kw.update(temperature=0.9, seed=self.rng.randrange(1 << 32))
        if self.rng.random() < 0.2:
            kw["stop"] = [self.rng.choice(WORDS)]
        return kw

    def fail(self, what):
        self.failures.append("client %d: %s" % (self.idx, what))

    def new_turn(self):
        """One of the client's usable sessions and a new entry (uncertain) for a turn on it, or (None, None)."""
        live = self.usable()
        if not live:
            return None, None
        s = self.rng.choice(live)
        entry = [self.text(), None, False, False]
        s.entries.append(entry)
        return s, entry

    @staticmethod
    def turn_refused(s, entry, reply):
        """A session turn refused: it left nothing. A full context or a session still busy (after a
        hang-up on it) are what a client meets; anything else is raised."""
        s.entries.remove(entry)
        if reply.get("code") == "context_exceeded":
            s.full = True
        elif reply.get("code") != "session_busy":
            raise ProtoError(reply)

    # ---- operations
    def op_generate(self):
        live = self.usable()
        if not live or self.rng.random() < 0.2:
            g = self.c.generate(prompt=self.text(), stream=self.rng.random() < 0.7, **self.sampling())
            if g.finish not in ("stop", "length", "context"):
                self.fail("a raw generate ended with %r" % g.finish)
            return
        s, entry = self.new_turn()
        try:
            g = self.c.generate(session=s.uuid, messages=[{"role": "user", "content": entry[0]}],
                                stream=self.rng.random() < 0.7, **self.sampling())
        except ProtoError as e:
            self.turn_refused(s, entry, e.reply)
            return
        if g.finish in ("stop", "length", "context"):
            entry[1], entry[2] = g.text, True
            self.stats.finished()
        else:
            self.fail("a session turn ended with %r" % g.finish)

    def op_cancel(self):
        s, entry = self.new_turn()
        if s is None:
            return
        rid = self.c.start_generate(session=s.uuid, messages=[{"role": "user", "content": entry[0]}],
                                    max_tokens=200, temperature=0.9, seed=self.rng.randrange(1 << 32))
        first = self.c.next(rid)
        if first["type"] == "error":
            self.turn_refused(s, entry, first)
            return
        cid = self.c.request("cancel", target=rid)
        text = [first.get("text", "")] if first["type"] == "token" else []
        r = first
        while r["type"] != "done":
            r = self.c.next(rid)
            if r["type"] == "token":
                text.append(r["text"])
            elif r["type"] == "error":
                raise ProtoError(r)
        ack = self.c.next(cid)
        if r["finish"] == "cancel":
            s.entries.remove(entry)
            if ack["type"] != "result":
                self.fail("cancel of a running request answered %r" % ack)
        else:
            # it finished before the cancel arrived: a committed turn (the cancel is then not_found)
            entry[1], entry[2] = "".join(text), True
            self.stats.finished()

    def op_hangup(self):
        """A second connection starts a turn and closes mid-stream: the turn is uncertain."""
        s, entry = self.new_turn()
        if s is None:
            return
        c2 = rsd.Client(self.sock, timeout=REPLY_TIMEOUT_S)
        try:
            rid = c2.start_generate(session=s.uuid, messages=[{"role": "user", "content": entry[0]}],
                                    max_tokens=self.rng.randint(1, 60), temperature=0)
            for _ in range(self.rng.randint(0, 3)):
                if c2.next(rid)["type"] != "token":
                    break
        finally:
            c2.close()

    def op_new(self):
        if len(self.sessions) >= MAX_SESSIONS:
            return
        title = "soak %s" % self.tag()
        r = self.c.call("session.new", title=title,
                        system=self.rng.choice(["", "You are terse.", "Answer in %s words." % self.rng.randint(2, 9)]))
        self.sessions.append(Session(r["session"]["session"], titles=(title,)))

    def op_fork(self):
        if len(self.sessions) >= MAX_SESSIONS or not self.sessions:
            return
        p = self.rng.choice([s for s in self.sessions if not s.maybe_deleted] or [None])
        if p is None:
            return
        r = self.c.call("session.fork", session=p.uuid)
        # the child holds what the parent held (its turns are counted in the parent's figures)
        child = Session(r["session"]["session"], [e[:3] + [True] for e in p.entries],
                        titles={t + " (fork)" for t in p.titles})
        self.sessions.append(child)
        # and the parent's uncertain turns resolved: read it
        got = self.c.call("session.get", session=child.uuid)["turns"]
        child.entries = stored_entries(got)

    def op_rename(self):
        live = [s for s in self.sessions if not s.maybe_deleted]
        if not live:
            return
        s = self.rng.choice(live)
        title = "renamed %s" % self.tag()
        s.titles.add(title)
        self.c.call("session.rename", session=s.uuid, title=title)
        s.titles = {title}

    def op_delete(self):
        if not self.sessions:
            return
        s = self.rng.choice(self.sessions)
        s.maybe_deleted = True
        try:
            self.c.call("session.delete", session=s.uuid)
        except ProtoError as e:
            if e.code != "not_found":
                raise
        self.sessions.remove(s)

    def op_tokens(self):
        text = self.text()
        ids = self.c.call("tokenize", text=text, bos=False)["tokens"]
        back = self.c.call("detokenize", tokens=ids)["text"]
        if back.strip() != text.strip():
            self.fail("detokenize(tokenize(%r)) = %r" % (text, back))

    def op_list(self):
        self.c.call(self.rng.choice(["session.list", "status", "model.list"]))

    OPS = [(op_generate, 40), (op_cancel, 8), (op_hangup, 8), (op_new, 8), (op_fork, 6), (op_rename, 5),
           (op_delete, 6), (op_tokens, 12), (op_list, 7)]

    def run(self):
        fns, weights = zip(*self.OPS)
        try:
            self.c = rsd.Client(self.sock, timeout=REPLY_TIMEOUT_S)
            self.c.call("hello", client="soak-%d" % self.idx)
            while not self.stop.is_set():
                fn = self.rng.choices(fns, weights)[0]
                self.stats.op(fn.__name__[3:])
                t0 = time.monotonic()
                try:
                    fn(self)
                    self.stats.took(time.monotonic() - t0, fn.__name__[3:])
                except ProtoError as e:
                    self.stats.code(e.code)
                    if e.code not in ("overloaded",):
                        self.fail("%s: %s" % (fn.__name__, e))
        except GONE as e:
            self.gone = repr(e)  # the daemon was killed (or hangs: main() tells which)
        except Exception as e:  # noqa: BLE001 (anything else is a failure of the test)
            self.fail("%r" % e)
        finally:
            if self.c is not None:
                self.c.close()


# --------------------------------------------------------------------------
# checks after a round

def stored_entries(turns):
    """The entries of a session's stored turns: certain, and counted already."""
    return [[turns[i]["content"], turns[i + 1]["content"], True, True] for i in range(0, len(turns) - 1, 2)]


def match(entries, turns):
    """Whether the stored turns are the entries, uncertain ones optional.
    Returns (ok, why, found: certain entries not yet counted that were found)."""
    pos, found = 0, 0
    for user, reply, certain, counted in entries:
        here = pos + 1 < len(turns) and turns[pos]["role"] == "user" and turns[pos]["content"] == user
        if here and (reply is None or turns[pos + 1]["content"] == reply):
            if turns[pos + 1]["role"] != "assistant":
                return False, "turn %d is not the assistant's" % (pos + 1), found
            pos += 2
            found += certain and not counted
        elif certain:
            return False, "the finished turn %r -> %r is missing (stored at %d: %r)" % (
                user, reply, pos, [t["content"] for t in turns[pos:pos + 2]]), found
    if pos != len(turns):
        return False, "turn %d (%r) is not one the clients sent" % (pos, turns[pos]["content"]), found
    return True, "", found


def check_sessions(ck, c, sessions_by_client, totals):
    """Every session against what its client knows; then what is stored becomes what is known."""
    for sessions in sessions_by_client:
        for s in list(sessions):
            try:
                r = c.call("session.get", session=s.uuid)
            except ProtoError as e:
                if e.code == "not_found" and s.maybe_deleted:
                    sessions.remove(s)
                    continue
                ck.ok(False, "session %s: %s" % (s.uuid, e))
                sessions.remove(s)
                continue
            turns, meta = r["turns"], r["session"]
            ok, why, found = match(s.entries, turns)
            totals["found"] += found
            totals["certain"] += sum(1 for e in s.entries if e[2] and not e[3])
            ck.ok(ok, "session %s: %s" % (s.uuid, why))
            ck.ok(meta["turns"] == len(turns) and meta["tokens"] == sum(t["tokens"] for t in turns),
                  "session %s: counters %d turns / %d tokens match its %d turns / %d tokens" %
                  (s.uuid, meta["turns"], meta["tokens"], len(turns), sum(t["tokens"] for t in turns)))
            ck.ok(meta["title"] in s.titles, "session %s: title %r is one it was given" % (s.uuid, meta["title"]))
            s.entries = stored_entries(turns)
            s.titles = {meta["title"]}
            s.maybe_deleted = False


def check_db(ck, path):
    db = sqlite3.connect("file:%s?mode=ro" % path, uri=True, timeout=10)
    try:
        ck.eq(db.execute("PRAGMA integrity_check").fetchall(), [("ok",)], "PRAGMA integrity_check")
        ck.eq(db.execute("PRAGMA foreign_key_check").fetchall(), [], "PRAGMA foreign_key_check")
    finally:
        db.close()


def fd_links(pid):
    """The daemon's open descriptors and what each is, sorted."""
    links = []
    for f in os.listdir("/proc/%d/fd" % pid):
        try:
            links.append(os.readlink("/proc/%d/fd/%s" % (pid, f)))
        except OSError:
            pass
    return sorted(links)


def proc_figures(pid):
    """(RSS in MB, open descriptors, what they are) once the daemon has freed its closed connections
    and finished writing KV files, and its descriptors held still for three reads 50 ms apart (an
    ASan run once read 12 after the warm-up where every later read found 11)."""
    seen = []

    def settled():
        """Only the listening socket, no KV file of the disk tier open (a write runs after each turn),
        the same descriptors as the last two reads."""
        links = fd_links(pid)
        seen.append(links)
        quiet = sum(x.startswith("socket:") for x in links) == 1 and not any("/kv/" in x for x in links)
        return quiet and len(seen) >= 3 and seen[-3] == seen[-2] == links
    rsd.wait_for(settled, 10)
    rss = 0.0
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024.0
    return rss, len(seen[-1]), seen[-1]


def host_kv_mb(d):
    """MB of KV blocks the daemon keeps in host memory (its host tier, bounded by --kv-host)."""
    with d.client(timeout=60) as c:
        return c.call("status")["kv"]["host_bytes"] / 1048576.0


def settled(c):
    st = c.call("status")
    return st["active"] == 0 and st["queued"] == 0 and len(st["clients"]) == 1


def fill_text(c, i):
    """A message of nearly a whole context (CTX - 32 tokens at most), different for each i."""
    words = [WORDS[(i + j * 7) % len(WORDS)] for j in range(CTX)]
    while len(c.call("tokenize", text=" ".join(words))["tokens"]) > CTX - 32:
        words = words[:len(words) * 9 // 10]
    return " ".join(words)


def warm_up(d):
    """Touches the whole KV pool (the CPU backend's pool is paged in as it is first used) and
    fills the host KV tier: passes of sessions of nearly a context each, as many as the pool
    holds, each pass's text new, so that the blocks the one before left in the prefix cache go
    to host memory; deleting the sessions gives their blocks back to the pool."""
    with d.client(timeout=120) as c:
        for p in range(16):
            uu = [c.call("session.new", title="warm-up")["session"]["session"] for _ in range(KV_TOKENS // CTX)]
            ids = [c.start_generate(session=u, messages=[{"role": "user", "content": "%d %s" % (p, fill_text(c, i))}],
                                    max_tokens=1, temperature=0) for i, u in enumerate(uu)]
            for rid in ids:
                c.collect(rid)
            for u in uu:
                c.call("session.delete", session=u)
            kv = c.call("status")["kv"]
            if kv["host_bytes"] + kv["host_bytes"] // 16 >= kv["host_budget_bytes"]:
                break


# --------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=float(os.environ.get("RESIDENT_SOAK_SECONDS", SOAK_CHECK_S)))
    ap.add_argument("--seed", type=int, default=int(os.environ.get("RESIDENT_SOAK_SEED", time.time())))
    args = ap.parse_args()
    asan = bool(os.environ.get("RESIDENT_ASAN"))
    rng = random.Random(args.seed)
    print("soak: %d clients, %.0f s, seed %d" % (N_CLIENTS, args.duration, args.seed), flush=True)
    ck = Checks()
    stats = Stats()
    sessions_by_client = [[] for _ in range(N_CLIENTS)]
    totals = {"found": 0, "certain": 0}
    rounds = kills = 0
    # a host tier of 64 MB: filled and churned in every round, small enough that what its churn
    # costs the allocator beyond its own bytes stays inside the slack
    extra = ["--ctx", str(CTX), "--kv-tokens", str(KV_TOKENS), "--max-seqs", str(MAX_SEQS), "-t", "2",
             "--kv-host", "64M"]
    with Daemon(extra=extra) as d:
        warm_up(d)
        base = first = proc_figures(d.proc.pid)
        base_host = host_kv_mb(d)
        print("daemon pid %d: RSS %.1f MB, %d fds after warm-up" % (d.proc.pid, base[0], base[1]), flush=True)
        t_end = time.monotonic() + args.duration
        last = base
        lived, longest = 0, (0, base, base)   # rounds the current daemon lived through; the longest life
        while time.monotonic() < t_end:
            rounds += 1
            stop, failures = threading.Event(), []
            workers = [Worker(i, d.sock, sessions_by_client[i], stats, stop, rng.randrange(1 << 62), failures)
                       for i in range(N_CLIENTS)]
            for w in workers:
                w.start()
            length = min(rng.uniform(*ROUND_S), max(1.0, t_end - time.monotonic()))
            killed = rng.random() < KILL_P
            time.sleep(rng.uniform(0.1, 0.9) * length if killed else length)
            if killed:
                d.kill9()
                kills += 1
            stop.set()
            for w in workers:
                w.join(2 * REPLY_TIMEOUT_S)
            ck.ok(not any(w.is_alive() for w in workers), "round %d: every client finished" % rounds)
            for f in failures:
                ck.ok(False, "round %d: %s" % (rounds, f))
            for w in workers:
                ck.ok(killed or w.gone is None, "round %d: client %d lost the daemon, which was not killed: %s" %
                      (rounds, w.idx, w.gone))
            if killed:
                d.start()
            with d.client(timeout=60) as c:
                check_sessions(ck, c, sessions_by_client, totals)
                ck.ok(rsd.wait_for(lambda: settled(c), 30), "round %d: nothing queued or running, only the "
                      "checker connected: %r" % (rounds, {k: v for k, v in c.call("status").items()
                                                          if k in ("active", "queued", "clients")}))
            check_db(ck, d.db)
            if killed:
                longest = max(longest, (lived, base, last))
                lived = 0
                warm_up(d)
                base = last = proc_figures(d.proc.pid)
                base_host = host_kv_mb(d)
                print("round %d: killed; restarted as pid %d: RSS %.1f MB, %d fds" %
                      (rounds, d.proc.pid, base[0], base[1]), flush=True)
                continue
            last = proc_figures(d.proc.pid)
            lived += 1
            print("round %d: RSS %.1f MB (start of this process %.1f), KV in the host tier %.1f MB (%.1f), %d fds "
                  "(%d), %d turns finished so far" % (rounds, last[0], base[0], host_kv_mb(d), base_host, last[1],
                                                       base[1], stats.turns_finished), flush=True)
            ck.eq(last[1], base[1], "round %d: open descriptors back to the process's start (%s, then %s)" %
                  (rounds, base[2], last[2]))
            if not asan:
                host = host_kv_mb(d) - base_host
                ck.ok(last[0] - host <= base[0] + RSS_SLACK_MB, "round %d: RSS %.1f MB, less %.1f MB more of KV "
                      "in the host tier, within %d MB of the start %.1f MB" %
                      (rounds, last[0], host, RSS_SLACK_MB, base[0]))
        d.stop()
    longest = max(longest, (lived, base, last))
    print("figures: %d rounds, %d kills; %d session turns finished (done seen), %d of them in sessions not "
          "deleted since, %d of those found" % (rounds, kills, stats.turns_finished, totals["certain"], totals["found"]))
    print("figures: RSS %.1f MB at the start, %.1f MB at the end%s; open fds %d at the start, %d at the end" %
          (first[0], last[0], " (ASan: not checked)" if asan else "", first[1], last[1]))
    print("figures: the longest-lived daemon went through %d rounds: RSS %.1f -> %.1f MB, fds %d -> %d" %
          (longest[0], longest[1][0], longest[2][0], longest[1][1], longest[2][1]))
    print("ops: %s" % ", ".join("%s %d" % kv for kv in sorted(stats.ops.items())))
    print("slowest operation: %s, %.1f s" % (stats.slowest[1], stats.slowest[0]))
    print("error codes seen: %s" % (", ".join("%s %d" % kv for kv in sorted(stats.codes.items())) or "none"))
    ck.ok(totals["found"] == totals["certain"], "every finished turn was found")
    ck.ok(stats.turns_finished > 0, "turns were finished")
    return ck


if __name__ == "__main__":
    rsd.main(main)
