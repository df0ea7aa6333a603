"""End-to-end test of the Neovim plugin (contrib/nvim): a headless nvim runs
its commands (tests/e2e/nvim_driver.lua) against a real residentd with a
generated tiny model, and what its buffers show is checked against the
daemon's own greedy replies to the same requests, made here with rsd.py:
a streamed reply (of a chat message and of raw text), a selection as the prompt's context, a stopped reply,
chats opened and closed unused (which leave no session: one is made with the first message), a
chat session written and sent in its buffer, then resumed in another nvim
after a daemon restart (and after :bdelete of its buffer), the help file's
tags, the messages a user gets when the daemon is not running or answers an
error, and a fake daemon of another protocol version whose reply comes a
byte at a time.
Skips (exit 77) when nvim is not installed."""
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rsd  # noqa: E402
from common import srcdir  # noqa: E402

MAX_TOKENS = 24
LONG = 2000
PROMPT = "Write a haiku about the sea"
SEL_PROMPT = "Explain this code"
SOURCE = ["def add(a, b):", "    return a + b  # é!", "", "print(add(2, 3))"]
CHAT1 = "Hello, who are you?\nAnswer in one line."
CHAT2 = "Tell me more."
HELP_TAGS = ["resident.txt", ":Resident", ":ResidentChat", ":ResidentStop", "resident-setup",
             "resident-chat", "resident-selection"]


def message(prompt, context, filetype):
    """The user message of :Resident with a selection (:help resident-selection)."""
    return "%s\n\n```%s\n%s\n```" % (prompt, filetype, context)


def greedy(c, n, **fields):
    return c.generate(max_tokens=n, temperature=0, **fields)


def run_nvim(tmp, plugin, name, cfg):
    """Runs the driver's steps in a headless nvim; returns what it wrote."""
    cfg = dict(cfg, out=os.path.join(tmp, name + ".json"))
    path = os.path.join(tmp, name + ".cfg.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVIM")}
    env.update(RESIDENT_NVIM_TEST=path, XDG_CONFIG_HOME=os.path.join(tmp, "config"),
               XDG_DATA_HOME=os.path.join(tmp, "data"), XDG_STATE_HOME=os.path.join(tmp, "state"),
               XDG_CACHE_HOME=os.path.join(tmp, "cache"))
    driver = os.path.join(srcdir(), "tests", "e2e", "nvim_driver.lua")
    r = subprocess.run(["nvim", "--headless", "--clean", "-n", "--cmd", "set rtp^=" + plugin,
                        "-c", "luafile " + driver], env=env, cwd=tmp, stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=180, errors="replace")
    if not os.path.exists(cfg["out"]):
        raise AssertionError("nvim wrote no results (exit %d):\n%s%s" % (r.returncode, r.stdout, r.stderr))
    with open(cfg["out"]) as f:
        return json.load(f)


def fake_daemon(path):
    """A daemon that answers hello with protocol version 2, a byte per write.
    Returns the listening socket and the thread serving one client."""
    ls = socket.socket(socket.AF_UNIX)
    ls.bind(path)
    ls.listen(1)

    def serve():
        conn, _ = ls.accept()
        with conn:
            conn.settimeout(30)
            hdr = conn.recv(4, socket.MSG_WAITALL)
            req = rsd.msgpack.unpackb(conn.recv(struct.unpack(">I", hdr)[0], socket.MSG_WAITALL))
            for b in rsd.frame({"id": req["id"], "type": "result", "version": 2, "server": "residentd 9",
                                "max_frame": 1 << 24, "uid": os.getuid(), "capabilities": []}):
                conn.sendall(bytes([b]))
                time.sleep(0.002)
            conn.recv(1)  # until the plugin closes

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return ls, t


def check_streamed(ck, what, got, want):
    """The buffer shows the daemon's reply, and it came in several steps, each a prefix."""
    ck.eq(got["text"], want.text, what + ": the buffer holds the reply")
    ck.eq(got["finish"], want.finish, what + ": b:resident_finish")
    ck.eq(got["usage"].get("generated_tokens"), len(want.tokens), what + ": b:resident_usage")
    seen = got["seen"]
    ck(len(seen) >= 2 and all(got["text"].startswith(s) for s in seen),
       "%s: streamed: %d buffer updates, each a prefix of the reply" % (what, len(seen)))


def chat_lines(uuid, title, turns):
    """What a chat buffer shows (:help resident-chat)."""
    lines = ["# session " + uuid, "model tiny" + (", " + title if title else ""), ""]
    for role, content in turns:
        lines += ["## " + role] + content.split("\n") + [""]
    return lines + ["## user", ""]


def test():
    if shutil.which("nvim") is None:
        raise rsd.Skip("nvim is not installed (contrib/install-deps.sh installs Debian's neovim)")
    ck = rsd.Checks()
    with rsd.Daemon() as d:
        tmp = d.tmp
        plugin = os.path.join(tmp, "nvim-plugin")
        shutil.copytree(os.path.join(srcdir(), "contrib", "nvim"), plugin)
        c = d.client(hello="test_nvim")
        long_prompt = rsd.long_prompt(c, n=LONG, messages=True, tag="nvim")
        cfg = dict(socket=d.sock, max_tokens=MAX_TOKENS, prompt=PROMPT, sel_prompt=SEL_PROMPT,
                   source=SOURCE, select_to="é", long_prompt=long_prompt, long_tokens=LONG,
                   chat1=CHAT1, chat2=CHAT2, help_tags=HELP_TAGS,
                   missing_socket=os.path.join(tmp, "nosuch", "socket"),
                   steps=["help", "reply", "selection", "stop", "unused_chats", "chat", "errors"])
        out = run_nvim(tmp, plugin, "first", cfg)
        ck.eq(out["errors"], [], "the driver's steps ran")

        with ck.section("help file"):
            for tag in HELP_TAGS:
                ck(out["help"].get(tag), ":help %s finds the tag" % tag)

        with ck.section(":Resident"):
            want = greedy(c, MAX_TOKENS, messages=[{"role": "user", "content": PROMPT}])
            check_streamed(ck, ":Resident", out["reply"], want)
            ck(out["reply"]["name"].startswith("resident://reply/"), "the reply buffer's name")
            check_streamed(ck, ":Resident with raw = true", out["raw"], greedy(c, MAX_TOKENS, prompt=PROMPT))
            ck(out["raw"]["text"] != out["reply"]["text"], "raw text and a chat message differ")
            print("---- :Resident %s shows:\n%s\n----" % (PROMPT, out["reply"]["text"]))

        with ck.section("a selection is the prompt's context"):
            sel = message(SEL_PROMPT, "add(a, b):\n    return a + b  # é", "python")
            want = greedy(c, MAX_TOKENS, messages=[{"role": "user", "content": sel}])
            check_streamed(ck, "characterwise selection", out["selection"], want)
            whole = message(SEL_PROMPT, "\n".join(SOURCE), "python")
            want_whole = greedy(c, MAX_TOKENS, messages=[{"role": "user", "content": whole}])
            check_streamed(ck, ":%Resident", out["whole"], want_whole)
            ck(want.text != want_whole.text, "the two contexts give different replies (the check can tell)")

        with ck.section(":ResidentStop"):
            full = greedy(c, LONG, messages=[{"role": "user", "content": long_prompt}])
            st = out["stop"]
            ck.eq(st["finish"], "cancel", "the stopped reply's finish")
            n = st["usage"].get("generated_tokens", LONG)
            ck(0 < n < LONG, "stopped after %d of %d tokens" % (n, LONG))
            ck(st["text"] != "" and full.text.startswith(st["text"]), "the buffer keeps the text before the stop")
            ck(any("nothing is being generated" in m for m in st["idle"]),
               ":ResidentStop with nothing running says so: %r" % st["idle"])

        with ck.section(":ResidentChat opened and left unused"):
            u = out["unused_chats"]
            ck.eq(u["after"], u["before"], "three chats opened and closed without a message leave no session")
            ck.ok(u["first"]["name"].startswith("resident://chat/new-"), "a new chat's buffer: %r" % u["first"]["name"])
            ck.eq(u["first"]["lines"], ["# new session (made when the first message is sent)", "model tiny", "",
                                        "## user", ""], "a new chat's buffer, before its first message")

        with ck.section(":ResidentChat"):
            ch = out["chat"]
            uuid = ch["session"]
            ck.eq(ch["name"], "resident://chat/" + uuid, "the chat buffer's name")
            ck.eq([n for n in ch["buffers"] if "/chat/new-" in n], [], "no buffer of the name before the session")
            s = c.call("session.get", session=uuid)
            turns = [(t["role"], t["content"]) for t in s["turns"]]
            ck.eq([t[0] for t in turns], ["user", "assistant"], "the session's turns")
            ck.eq(turns[0][1], CHAT1, "the turn written in the buffer is what was sent")
            ck.eq(ch["lines"], chat_lines(uuid, "", turns), "the chat buffer")
            ck.eq(s["session"]["title"], CHAT1.split("\n")[0], "the session is named after its first line")
            ck(uuid in out["complete"], ":ResidentChat completes the session ids")

        with ck.section("errors"):
            e = out["errors_seen"]
            missing = cfg["missing_socket"]
            for name in ("no_daemon", "no_daemon_chat"):
                ck.eq(e[name]["notes"], ["resident: residentd is not running (no socket at %s)" % missing],
                      name + ": the message")
            ck(any("nosuch" in m and "(not_found)" in m for m in e["unknown_model"]["notes"]),
               "an unknown model: %r" % e["unknown_model"]["notes"])
            ck(any("(not_found)" in m for m in e["unknown_session"]["notes"]),
               "an unknown session: %r" % e["unknown_session"]["notes"])
            ck(any("usage: :Resident" in m for m in e["no_prompt"]["notes"]), "no prompt: %r" % e["no_prompt"]["notes"])
            for name, v in e.items():
                ck.eq(v["windows_left"], 0, name + ": windows left behind")
        c.close()

        # the session goes on in another nvim, after a restart of the daemon
        d.stop()
        d.start()
        c = d.client(hello="test_nvim")
        fork = c.call("session.fork", session=uuid)["session"]["session"]
        want2 = greedy(c, MAX_TOKENS, session=fork, messages=[{"role": "user", "content": CHAT2}])
        alone = greedy(c, MAX_TOKENS, messages=[{"role": "user", "content": CHAT2}])
        out2 = run_nvim(tmp, plugin, "second", dict(cfg, session=uuid, steps=["resume"]))
        ck.eq(out2["errors"], [], "the driver's resume step ran")
        with ck.section("a chat resumed"):
            r = out2["resumed"]
            title = CHAT1.split("\n")[0]
            ck.eq(r["before"], chat_lines(uuid, title, turns), "the resumed buffer shows the history")
            s = c.call("session.get", session=uuid)
            turns2 = [(t["role"], t["content"]) for t in s["turns"]]
            ck.eq(turns2[:2], turns, "the earlier turns are kept")
            ck.eq(turns2[2:], [("user", CHAT2), ("assistant", want2.text)],
                  "the new turn continues the session (its reply is that of a fork of it)")
            ck(want2.text != alone.text, "the history changes the reply (the check can tell)")
            ck.eq(r["after"], chat_lines(uuid, title, turns2), "the chat buffer after the second turn")
            ck(r["reopened"], ":ResidentChat of an open session goes back to its buffer")
            ck.eq(r["after_bdelete"], r["after"], ":ResidentChat after :bdelete of its buffer")
            print("---- the chat buffer after :ResidentChat %s and a second turn:\n%s\n----" %
                  (uuid, "\n".join(r["after"])))
        c.close()

        with ck.section("a daemon of another protocol version"):
            fake = os.path.join(tmp, "fake.sock")
            ls, t = fake_daemon(fake)
            out3 = run_nvim(tmp, plugin, "third", dict(cfg, fake_socket=fake, steps=["version"]))
            ck.eq(out3["version"], ["resident: residentd speaks protocol version 2; this plugin speaks 1"],
                  "the message")
            t.join(30)
            ls.close()
    return ck


if __name__ == "__main__":
    rsd.main(test)
