#!/usr/bin/env python3
"""test_grammar_edges.py: constrained decoding's edge cases through the real
daemon (issue 35), on a generated tiny model (a byte-level vocabulary of
2,048 tokens) and, where it is installed, Gemma 3 270M (SentencePiece with
byte fallback):

- tokens that complete one rule and start the next: a grammar of one rule
  per character of a text, and words joined by an outer rule, sampled: the
  output is the grammar's text exactly, and tokens such as " wit" or "dy"
  crossed rule boundaries on the way;
- UTF-8 split across tokens: classes of CJK, emoji and plane-2 characters:
  the output matches the class, token replies that complete no character
  come with empty text, the texts concatenated are the answer, and the
  ids detokenize to it;
- an empty allowed set: `root ::= "a" [^\\x00-\\U0010FFFF]` compiles, and the
  request ends with invalid_param after its "a", at once; a session turn that
  ends so is not stored;
- depth: nesting forced past GRAM_MAX_DEPTH (1024) ends with invalid_param,
  a tail recursion does not deepen, a schema nested past JSCHEMA_MAX_DEPTH
  (64) is refused naming its place, and one at 63 is compiled;
- hostile grammars and schemas (1 MiB, many alternatives, ambiguity, nested
  counts, cycles of $ref, large enums and objects, deep nesting): each is
  refused or prepared within BOUND_S seconds and with the daemon under
  RSS_CAP of memory (a watchdog kills it past either), while a second client
  keeps getting plain replies (each within PLAIN_S). The worst times are
  printed; libclient/PROTOCOL.md states the bound.

Cases that fail now because of a known bug are listed in KNOWN_BUGS: they
run (with a shorter watchdog), print XFAIL and the bug, and fail the test if
they pass (the entry is then to be removed). RESIDENT_EDGES_STRICT=1 makes
them ordinary failures.
"""
import json
import os
import re
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rsd  # noqa: E402
from rsd import Checks, Daemon, ProtoError, Skip  # noqa: E402

HOT = dict(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0)  # every allowed token can be drawn
BOUND_S = 60.0          # refused or prepared within this (PROTOCOL.md); worst measured: 17 s
RSS_CAP = 2 << 30       # the daemon's memory while it prepares one
PLAIN_S = 5.0           # a plain request of another client meanwhile
BUG_S = 5.0             # the watchdog of a known bug's case
BUG_RSS = 1536 << 20
STRICT = bool(os.environ.get("RESIDENT_EDGES_STRICT"))

# case name -> the bug that makes it fail now (see the report in the commit)
KNOWN_BUGS = {}


def scaled(s):
    """A time bound, larger for an instrumented (ASan) daemon."""
    return s * 6 if INSTRUMENTED else s


INSTRUMENTED = False


def rss_of(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


# ==========================================================================
# tokens across rules, UTF-8 across tokens

def char_rules(text):
    """One rule per character of text, root their sequence."""
    lines = ["root ::= " + " ".join("c%d" % i for i in range(len(text)))]
    for i, ch in enumerate(text):
        lines.append('c%d ::= "%s"' % (i, ch.replace("\\", "\\\\").replace('"', '\\"')))
    return "\n".join(lines) + "\n"


def across_rules(ck, c):
    text = "the body with html pieces of text"
    gr = char_rules(text)
    crossing, n = 0, 24
    bad = []
    for seed in range(n):
        g = c.generate(prompt="x", grammar=gr, seed=seed, max_tokens=64, **HOT)
        if (g.text, g.finish) != (text, "stop"):
            bad.append((seed, g.finish, g.text))
        crossing += sum(1 for t in g.tokens if len(t["text"]) > 1)
    ck.eq(bad, [], "one rule per character: every sampled output is the text, finish stop")
    ck.ok(crossing > 0, "tokens of several characters crossed rule boundaries (%d in %d outputs)" % (crossing, n))

    # words joined by an outer rule: " with" ends one rule's space and starts a word
    gr = 'root ::= word (" " word){3,6} "."\nword ::= "the" | "body" | "with" | "html" | "pieces" | "text"\n'
    rx = re.compile(r"(the|body|with|html|pieces|text)( (the|body|with|html|pieces|text)){3,6}\.")
    crossing, bad = 0, []
    for seed in range(24):
        g = c.generate(prompt="x", grammar=gr, seed=seed, max_tokens=64, **HOT)
        if not rx.fullmatch(g.text) or g.finish != "stop":
            bad.append((seed, g.finish, g.text))
        crossing += sum(1 for t in g.tokens if t["text"].startswith(" ") and len(t["text"]) > 1)
    ck.eq(bad, [], "words: every output matches, finish stop")
    ck.ok(crossing > 0, "tokens such as ' with' crossed from the outer rule into a word (%d)" % crossing)


UTF8_CASES = [
    ("CJK", 'root ::= [\\u4e00-\\u9fff]{3,6} "\\u3002"', re.compile("[\u4e00-\u9fff]{3,6}\u3002")),
    ("emoji", "root ::= [\\U0001F600-\\U0001F64F]{2,4}", re.compile("[\U0001F600-\U0001F64F]{2,4}")),
    ("plane 2", "root ::= [\\U00020000-\\U0002A6DF]{2,3}", re.compile("[\U00020000-\U0002A6DF]{2,3}")),
    ("Greek and ASCII", "root ::= ([\\u0370-\\u03FF] [a-z]?){3,5}", re.compile("([\u0370-\u03ff][a-z]?){3,5}")),
]


def utf8_split(ck, c, model_name):
    for name, gr, rx in UTF8_CASES:
        split, bad = 0, []
        for seed in range(12):
            g = c.generate(prompt="x", grammar=gr, seed=seed, max_tokens=40, **HOT)
            joined = "".join(t["text"] for t in g.tokens)
            back = c.call("detokenize", tokens=g.ids)["text"]
            if g.finish != "stop" or not rx.fullmatch(g.text) or joined != g.text or back != g.text:
                bad.append((seed, g.finish, g.text, joined, back))
            split += sum(1 for t in g.tokens if t["text"] == "")
        ck.eq(bad, [], "%s, %s: outputs match, whole characters, the ids detokenize to them" % (model_name, name))
        if name in ("emoji", "plane 2"):
            ck.ok(split > 0, "%s, %s: characters split across tokens (%d tokens completed none)" %
                  (model_name, name, split))


# ==========================================================================
# no token allowed, depth

def empty_set(ck, c):
    for gr, n in (('root ::= "a" [^\\x00-\\U0010FFFF]', 1), ("root ::= [^\\x00-\\U0010FFFF]", 0)):
        t0 = time.monotonic()
        rid = c.start_generate(prompt="x", grammar=gr, max_tokens=50, **HOT)
        toks, err = [], None
        while True:
            r = c.next(rid, timeout=scaled(10))
            if r["type"] == "token":
                toks.append(r["text"])
            elif r["type"] in ("done", "error"):
                err = r
                break
        dt = time.monotonic() - t0
        ck.eq((err.get("code"), "".join(toks)), ("invalid_param", "a" * n), "%s: ends with invalid_param" % gr)
        ck.ok("allows no token" in err.get("message", "") and "after %d generated" % n in err.get("message", ""),
              "%s: the message says so: %r" % (gr, err.get("message")))
        ck.ok(dt < scaled(2), "%s: at once (%.3f s)" % (gr, dt))
    # a session's turn that fails so is not stored
    s = c.call("session.new", title="edges")["session"]["session"]
    ck.code(lambda: c.generate(session=s, messages=[{"role": "user", "content": "hi"}],
                               grammar='root ::= "a" [^\\x00-\\U0010FFFF]', max_tokens=20, **HOT),
            "invalid_param", "a session turn with no token allowed")
    ck.eq(c.call("session.get", session=s)["turns"], [], "the failed turn is not stored")


def nest_obj(k):
    s = {"type": "integer"}
    for _ in range(k):
        s = {"type": "object", "properties": {"a": s}, "required": ["a"], "additionalProperties": False}
    return s


def depth(ck, c):
    # nesting forced past GRAM_MAX_DEPTH: no token once 1024 rules are open
    for name, fields in (("grammar n ::= \"[\" n \"]\"", dict(grammar='root ::= n\nn ::= "[" n "]"\n')),
                         ("schema: arrays of at least one array, forever",
                          dict(json_schema='{"type":"array","items":{"$ref":"#"},"minItems":1}'))):
        t0 = time.monotonic()
        rid = c.start_generate(prompt="x", max_tokens=3000, **HOT, **fields)
        text, end = [], None
        while end is None:
            r = c.next(rid, timeout=scaled(30))
            if r["type"] == "token":
                text.append(r["text"])
            elif r["type"] in ("done", "error"):
                end = r
        text = "".join(text)
        ck.ok(end["type"] == "error" and end.get("code") == "invalid_param" and "allows no token" in end["message"],
              "%s: ends with invalid_param at the depth limit: %r" % (name, end))
        ck.ok(text.count("[") >= 1000 and set(text) <= set("[ \t\n"),
              "%s: %d brackets opened first" % (name, text.count("[")))
        print("%s: %d tokens, %.2f s" % (name, len(text), time.monotonic() - t0), flush=True)
    ck.ok(c.generate(prompt="x", max_tokens=4, temperature=0).finish == "length", "the daemon still serves")
    # a tail recursion pushes no frame: it goes on to max_tokens
    g = c.generate(prompt="x", grammar='root ::= n\nn ::= "[" n\n', max_tokens=1500, **HOT)
    ck.ok(g.finish == "length" and set(g.text) == {"["} and len(g.text) >= 1500,
          "tail recursion: %d brackets, finish %s" % (len(g.text), g.finish))
    # sampled, unforced nesting: balanced
    for seed in range(8):
        g = c.generate(prompt="x", grammar='root ::= n\nn ::= "[" n? "]"\n', seed=seed, max_tokens=200, **HOT)
        t = g.text
        ck.ok(g.finish == "length" or (len(t) % 2 == 0 and t == "[" * (len(t) // 2) + "]" * (len(t) // 2)),
              "unforced nesting is balanced: %r" % t[:80])
    # JSCHEMA_MAX_DEPTH: 63 levels compile, 65 are refused naming the place
    g = c.generate(prompt="x", json_schema=json.dumps(nest_obj(62)), max_tokens=400, **HOT)
    ck.ok(g.finish in ("stop", "length"), "a schema 63 deep compiles")
    e = ck.raises(lambda: c.generate(prompt="x", json_schema=json.dumps(nest_obj(64)), max_tokens=4),
                  ProtoError, "a schema 65 deep", code="invalid_param")
    if e is not None:
        ck.ok(re.search(r"json_schema at \.\.\.[/a-z]*/properties/a: schemas nested deeper than the limit of 64",
                        str(e)) is not None, "its message names the place: %s" % e)


# ==========================================================================
# hostile inputs

def hostile_cases():
    """(name, fields, expect, heavy): expect "ok" (the output of a grammar
    compiled), or the start of a refusal's message; heavy cases are left
    out of an instrumented build, whose times mean nothing."""
    out = []
    # 1 MiB of grammar: a chain of rules, each one literal or the next
    parts, i, size = [], 0, len("root ::= r0\n")
    while True:
        line = 'r%d ::= "w%d " r%d | "end"\n' % (i, i, i + 1)
        if size + len(line) > (1 << 20) - 64:
            break
        parts.append(line)
        size += len(line)
        i += 1
    chain = "root ::= r0\n" + "".join(parts) + 'r%d ::= "end"\n' % i
    out.append(("grammar: 1 MiB, a chain of %d rules" % i, dict(grammar=chain), "ok", True))
    out.append(("grammar: 1 MiB and 1 byte", dict(grammar=chain + "#" * ((1 << 20) + 1 - len(chain))),
                "grammar is 1048577 bytes", False))
    alts = lambda n: "root ::= " + " | ".join('"k%05d"' % j for j in range(n))  # noqa: E731
    out.append(("grammar: 4096 alternatives", dict(grammar=alts(4096)), "ok", False))
    out.append(("grammar: 4097 alternatives", dict(grammar=alts(4097)), "grammar: grammar: more than 4096 positions",
                False))
    out.append(("grammar: 4097 stars in a row (ambiguous)", dict(grammar="root ::= " + ' "a"*' * 4097 + ' "b"'),
                "grammar: grammar: more than 4096 positions", False))
    out.append(("grammar: (\"a\" | \"a\"){40}", dict(grammar='root ::= ("a" | "a"){40}'), "ok", False))
    out.append(("grammar: groups nested 64", dict(grammar="root ::= " + "(" * 64 + '"a"' + ")" * 64), "ok", False))
    out.append(("grammar: groups nested 65", dict(grammar="root ::= " + "(" * 65 + '"a"' + ")" * 65),
                "grammar: grammar, line 1 column 74: groups nested deeper than the limit of 64", False))
    out.append(("grammar: \"x\"{1001}", dict(grammar='root ::= "x"{1001}'), "grammar: grammar, line 1 column 18: "
                "a count above the limit of 1,000", False))
    out.append(("grammar: (\"x\"{1000}){1000}", dict(grammar='root ::= ("x"{1000}){1000}'), "ok", True))
    out.append(("grammar: ((\"x\"{1000}){1000}){1000}", dict(grammar='root ::= (("x"{1000}){1000}){1000}'),
                "grammar: grammar: more than 1048576 positions to prepare", False))
    # schemas
    out.append(("schema: the text true", dict(json_schema="true"), "ok", False))
    out.append(("schema: $ref to itself", dict(json_schema='{"$ref":"#"}'),
                "json_schema: json_schema at /$ref: a cycle of references", False))
    out.append(("schema: $ref cycle through anyOf",
                dict(json_schema='{"$defs":{"a":{"$ref":"#/$defs/b"},"b":{"anyOf":[{"$ref":"#/$defs/a"}]}},'
                                 '"$ref":"#/$defs/a"}'),
                "json_schema: json_schema at /$defs/b/anyOf/0/$ref: a cycle", False))
    ring = {"$defs": {"a%d" % k: {"$ref": "#/$defs/a%d" % ((k + 1) % 5001)} for k in range(5001)}, "$ref": "#/$defs/a0"}
    out.append(("schema: a ring of 5001 $refs", dict(json_schema=json.dumps(ring)),
                "json_schema: json_schema at /$defs/a63: schemas nested deeper than the limit of 64", False))
    diamond = {"$defs": {"a%d" % k: {"anyOf": [{"$ref": "#/$defs/a%d" % (k + 1)}, {"$ref": "#/$defs/a%d" % (k + 1)}]}
                         for k in range(30)}, "$ref": "#/$defs/a0"}
    diamond["$defs"]["a30"] = {"type": "string", "maxLength": 5}
    out.append(("schema: anyOf of two $refs to the next, 30 deep", dict(json_schema=json.dumps(diamond)), "ok", True))

    def tree(k):
        s = {"type": "integer"}
        for _ in range(k):
            s = {"anyOf": [s, {"type": "array", "items": s}]}
        return s
    out.append(("schema: anyOf trees 14 deep (16,383 copies)", dict(json_schema=json.dumps(tree(14))),
                "json_schema: json_schema at ", False))

    def arrays(k):
        s = {"type": "integer"}
        for _ in range(k):
            s = {"type": "array", "items": s}
        return s
    out.append(("schema: arrays nested 8 deep", dict(json_schema=json.dumps(arrays(8))), "ok", False))
    out.append(("schema: arrays nested 62 deep", dict(json_schema=json.dumps(arrays(62))), "json_schema: grammar: more than 1048576 positions to prepare", False))
    out.append(("schema: an array of arrays, maxItems 1000 each", dict(json_schema=json.dumps(
        {"type": "array", "maxItems": 1000, "items": {"type": "array", "maxItems": 1000, "items": {"type": "null"}}})),
        "json_schema: grammar: more than 1048576 positions to prepare", False))
    out.append(("schema: an enum of 4096 strings",
                dict(json_schema=json.dumps({"enum": ["value number %d, with some text" % k for k in range(4096)]})),
                "ok", False))
    out.append(("schema: an enum of 4097", dict(json_schema=json.dumps({"enum": list(range(4097))})),
                "json_schema: json_schema at /enum: 4097 values, above the limit of 4096", False))
    props = lambda n: {"type": "object", "properties": {"p%04d" % k: {"type": "integer"} for k in range(n)}}  # noqa
    out.append(("schema: 1024 optional properties", dict(json_schema=json.dumps(props(1024))), "ok", True))
    out.append(("schema: 128 optional properties", dict(json_schema=json.dumps(props(128))), "ok", False))
    out.append(("schema: 1025 properties", dict(json_schema=json.dumps(props(1025))),
                "json_schema: json_schema at /properties: more than 1024 named properties", False))
    out.append(("schema: 257 anyOf branches",
                dict(json_schema=json.dumps({"anyOf": [{"const": k} for k in range(257)]})),
                "json_schema: json_schema at /anyOf: more than 256 branches", False))
    out.append(("schema: pattern (a{1000}){1000}", dict(json_schema='{"type":"string","pattern":"^(a{1000}){1000}$"}'),
                "ok", True))
    out.append(("schema: pattern ((a{1000}){1000}){1000}",
                dict(json_schema='{"type":"string","pattern":"^((a{1000}){1000}){1000}$"}'), "json_schema: grammar: more than 1048576 positions to prepare", False))
    out.append(("schema: 1 MiB of text", dict(json_schema=json.dumps({"enum": ["x" * 1000] * 1100})[: (1 << 20) + 1]),
                "json_schema is 1048577 bytes", False))
    return out


class Plain(threading.Thread):
    """Another client's plain requests, one after another: their latencies."""

    def __init__(self, d):
        super().__init__(daemon=True)
        self.d, self.stop, self.lat, self.errors = d, threading.Event(), [], []

    def run(self):
        try:
            with self.d.client(timeout=120) as c:
                while not self.stop.is_set():
                    t0 = time.monotonic()
                    g = c.generate(prompt="plain", max_tokens=8, temperature=0)
                    self.lat.append(time.monotonic() - t0)
                    if g.finish != "length":
                        self.errors.append(g.done)
        except Exception as e:  # noqa: BLE001 (a daemon the watchdog killed ends it too)
            self.errors.append(repr(e))


def bounded(d, fields, bound, cap):
    """Sends one request and waits for its end, killing the daemon past
    bound seconds or cap bytes: (outcome, seconds, peak RSS); outcome is
    ("ok", done) or ("refused", message) or ("killed", why)."""
    t0, peak = time.monotonic(), 0
    c = d.client(timeout=bound + 30)
    try:
        rid = c.start_generate(prompt="x", max_tokens=30, seed=1, stream=False, **HOT, **fields)
        while True:
            try:
                r = c.next(rid, timeout=0.05)
            except TimeoutError:
                r = None
            peak = max(peak, rss_of(d.proc.pid))
            dt = time.monotonic() - t0
            if r is not None and r["type"] == "done":
                return ("ok", r), dt, peak
            if r is not None and r["type"] == "error":
                return ("refused", "%s: %s" % (r.get("code"), r.get("message"))), dt, peak
            if dt > bound or peak > cap:
                why = "past %.0f s" % bound if dt > bound else "past %d MiB" % (cap >> 20)
                d.kill9()
                return ("killed", why), dt, peak
    finally:
        c.close()


def hostile(ck, d):
    worst = []
    for name, fields, expect, heavy in hostile_cases():
        if heavy and INSTRUMENTED:
            print("(left out of an instrumented build: %s)" % name, flush=True)
            continue
        bug = KNOWN_BUGS.get(name) if not STRICT else None
        if not d.alive():
            d.start()
        plain = Plain(d)
        plain.start()
        (what, detail), dt, peak = bounded(d, fields, BUG_S if bug else scaled(BOUND_S), BUG_RSS if bug else
                                          (RSS_CAP * 2 if INSTRUMENTED else RSS_CAP))
        plain.stop.set()
        plain.join(scaled(PLAIN_S) + 30)
        if what == "ok":
            good = expect == "ok" and detail.get("finish") in ("stop", "length")
        elif what == "refused":
            good = expect != "ok" and detail.startswith("invalid_param: " + expect)
        else:
            good = False
        plain_ok = d.alive() is False or (not plain.errors and max(plain.lat or [0]) < scaled(PLAIN_S))
        line = "%s: %s %s in %.2f s, peak %d MiB; plain requests meanwhile: %d, slowest %.3f s" % (
            name, what, detail if what != "ok" else detail.get("finish"), dt, peak >> 20, len(plain.lat),
            max(plain.lat or [0]))
        print(line, flush=True)
        if bug:
            if good:
                ck.ok(False, "%s passes now: remove it from KNOWN_BUGS (%s)" % (name, bug))
            else:
                print("  XFAIL (known bug: %s)" % bug, flush=True)
            continue
        worst.append((dt, name))
        ck.ok(good, "%s: want %s, got %s %r" % (name, expect, what, detail if what != "ok" else detail.get("finish")))
        ck.ok(plain_ok, "%s: another client's plain requests went on (%d, slowest %.3f s, errors %r)" %
              (name, len(plain.lat), max(plain.lat or [0]), plain.errors[:2]))
    worst.sort(reverse=True)
    print("slowest within bounds: %s" % ", ".join("%s %.1f s" % (n, t) for t, n in worst[:4]), flush=True)
    if not d.alive():
        d.start()
    with d.client(timeout=60) as c:
        ck.ok(c.generate(prompt="x", max_tokens=4, temperature=0).finish == "length", "the daemon serves after them")


# ==========================================================================

def main():
    global INSTRUMENTED
    INSTRUMENTED = rsd.instrumented()
    ck = Checks()
    with Daemon(extra=["--ctx", "4096"]) as d:
        c = d.client(timeout=scaled(60))
        with ck.section("tokens across rules"):
            across_rules(ck, c)
        with ck.section("UTF-8 across tokens, tiny model"):
            utf8_split(ck, c, "tiny")
        with ck.section("no token allowed"):
            empty_set(ck, c)
        with ck.section("depth"):
            depth(ck, c)
        c.close()
        with ck.section("hostile grammars and schemas, a plain client beside"):
            hostile(ck, d)
    if not INSTRUMENTED:
        with ck.section("UTF-8 across tokens, Gemma 3 270M"):
            try:
                model = rsd.gemma_path()
            except Skip as e:
                print("SKIP: %s" % e, flush=True)
                model = None
            if model is not None:
                with Daemon(model=model) as d, d.client(timeout=120) as c:
                    utf8_split(ck, c, "Gemma 3 270M")
    return ck


if __name__ == "__main__":
    rsd.main(main)
