#!/usr/bin/env python3
"""test_schema_property.py: json_schema through the real daemon.

1. Property (issue 35): RESIDENT_SCHEMA_N (1,000) random JSON Schemas of the
   subset jschema.h supports, made by a seeded generator here (the seed is
   printed; RESIDENT_SCHEMA_SEED repeats a run, RESIDENT_SCHEMA_ONLY=i runs
   schema i of it alone), each sent with generate at temperature 1.5 and
   nothing cut from the distribution (top_k 0, top_p 1, min_p 0: every token
   the grammar allows can be drawn) on a generated tiny model, 128 requests
   in flight. Every output that ends with finish "stop" must parse as JSON
   and validate with the `jsonschema` package (numbers compared exactly:
   decimal, not float), hold no duplicate of a named key, no U+0000 and no
   unpaired surrogate, and have no whitespace around the value. An output
   cut by max_tokens ("length") must be a prefix of some JSON text; at most
   MAX_LENGTH_SHARE of them may end so. The daemon refusing a schema of the
   generator is a failure: it only makes schemas PROTOCOL.md says are
   supported.

   Where jsonschema's Python reading of a keyword differs from ECMA-262 and
   from PROTOCOL.md, the check follows PROTOCOL.md: a pattern is checked as
   the ECMA-262 regex it is (\\d \\w ASCII, \\s ECMA's white space, `.` no
   line terminator, `$` the very end), matched by an automaton built here
   from the generator's tree (Nfa: Python's backtracking re takes time
   exponential in the text on nested quantifiers such as (?:x+)+, and one
   such schema held make check for an hour); the formats date, time,
   date-time (RFC 3339) and uuid by checkers here (jsonschema's need
   optional packages); enum and const compare numbers as the doubles JSON
   parsers read (the daemon spells 0.1 as jansson does,
   0.10000000000000001).

2. Greedy agreement, on the real Gemma 3 270M (skipped, saying so, when it
   is not installed): prompts whose unconstrained greedy reply is already a
   bare JSON value that a schema written for it validates; the same request
   constrained by that schema must give the identical reply (the mask never
   removes the token greedy decoding picks when the text stays valid).

Needs the PyPI package jsonschema (contrib/install-deps.sh installs it): a
missing one fails the test rather than skipping it.
"""
import json
import os
import random
import re
import sys
import time
import uuid as uuidlib
from datetime import date
from decimal import Decimal
from urllib.parse import unquote

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rsd  # noqa: E402
from rsd import Checks, Daemon, Skip  # noqa: E402

try:
    import jsonschema
    from jsonschema import validators as jvalidators
except ImportError:
    jsonschema = None

N_DEFAULT = 1000
WINDOW = 128             # requests in flight at once
MAX_TOKENS = 600
# At most this share of the outputs may end by max_tokens. Measured over 16
# seeds: 3.3-4.8% (strings without a bound, unanchored patterns and additional
# keys, which a random model rarely closes: one token in ~2,000 is the quote).
# A grammar that would not let the output end shows as far more.
MAX_LENGTH_SHARE = 0.08
SAMPLING = dict(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0)


# ==========================================================================
# random schemas

ECMA_WS = "\t\n\x0b\x0c\r \xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009" \
    "\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
LINE_TERM = "\n\r\u2028\u2029"
NAMES = ["a", "b", "id", "name", "x y", "ключ", "引用", 'q"t', "b\\s", "tab\t", "\U0001F600", "",
         "n1", "n2", "kind", "k-3", "A_B", "ü", "//", "~0", "$ref", "type"]
DEF_NAMES = ["a", "node", "x/y", "t~i", "sp ace", "d%", "b1", "item", "Q"]


def one(ptext):
    """A tree leaf: one code point that the Python regex ptext (a character,
    an escape or a class) matches."""
    return ("ch", re.compile(ptext))


class Pat:
    """A random pattern, made twice: the ECMA-262 text sent in the schema and
    a tree with its meaning, matched by Nfa. A tree is ("ch", regex of one
    code point), ("cat", [trees]), ("alt", [trees]), ("rep", tree, lo, hi or
    None) or ("bol",) / ("eol",), the anchors."""

    # Copies of a counted group are positions of their own, so nested counts
    # multiply the positions the daemon prepares (PROTOCOL.md refuses past
    # 1,048,576). Each atom is made with the product of the counts around
    # it at most this: a quantifier that would pass it is left out.
    MAX_COPIES = 64

    def __init__(self, r):
        self.r = r
        self.groups = 0
        self.copies = 1

    def atom(self):
        """(ecma, tree, nullable)"""
        r = self.r
        k = r.random()
        if k < 0.35:
            c = r.choice("abcxyz019_-:@ /")
            return c, one(re.escape(c)), False
        if k < 0.42:
            c = r.choice(".*+?()[]{}|$^/\\")  # \\/ is an identity escape of ECMA's u mode too
            return "\\" + c, one(re.escape(c)), False
        if k < 0.50:
            c = r.choice(["é", "中", "\U0001F600", "ß"])
            cp = ord(c)
            if cp > 0xffff and r.random() < 0.5:
                v = cp - 0x10000
                e = "\\u%04X\\u%04X" % (0xD800 + (v >> 10), 0xDC00 + (v & 0x3ff))
            elif cp <= 0xffff and r.random() < 0.5:
                e = "\\u%04x" % cp
            else:
                e = c
            return e, one(re.escape(c)), False
        if k < 0.55:
            e, p = r.choice([("\\t", "\\t"), ("\\n", "\\n"), ("\\x41", "A"), ("\\u00e9", "é"), ("\\r", "\\r")])
            return e, one(p), False
        if k < 0.63:
            e, p = r.choice([("\\d", "[0-9]"), ("\\w", "[0-9A-Za-z_]"), ("\\D", "[^0-9]"),
                             ("\\W", "[^0-9A-Za-z_]"), ("\\s", "[%s]" % re.escape(ECMA_WS)),
                             ("\\S", "[^%s]" % re.escape(ECMA_WS))])
            return e, one(p), False
        if k < 0.68:
            return ".", one("[^%s]" % re.escape(LINE_TERM)), False
        if k < 0.85:
            return self.cls()
        # a group
        e, p, nul = self.alts(depth=1)
        self.groups += 1
        kind = r.choice(["(", "(?:", "(?<g%d>" % self.groups])
        return kind + e + ")", p, nul

    def cls(self):
        r = self.r
        neg = r.random() < 0.3
        ee, pp = [], []
        for _ in range(r.randint(1, 3)):
            k = r.random()
            if k < 0.5:
                a = r.choice("adkx0")
                b = chr(ord(a) + r.randint(0, 5))
                ee.append("%s-%s" % (a, b))
                pp.append("%s-%s" % (a, b))
            elif k < 0.65:
                e, p = r.choice([("\\d", "0-9"), ("\\w", "0-9A-Za-z_"), ("\\s", re.escape(ECMA_WS))])
                ee.append(e)
                pp.append(p)
            elif k < 0.75:
                c = r.choice("-]^\\[")
                ee.append("\\" + c)
                pp.append(re.escape(c))
            elif k < 0.85:
                e, p = r.choice([("é", "é"), ("\\u4e2d", "中"), ("\\u00DF", "ß"), ("\\uD83D\\uDE00", "\U0001F600")])
                ee.append(e)
                pp.append(p)
            else:
                c = r.choice("_@.*+ ,")
                ee.append(c)
                pp.append(re.escape(c))
        return "[%s%s]" % ("^" if neg else "", "".join(ee)), one("[%s%s]" % ("^" if neg else "", "".join(pp))), False

    def piece(self):
        r = self.r
        k = r.random()
        # the most copies each choice of k can give (a nullable atom falls
        # through * + and {n,} to the counts below them)
        most = 1 if k < 0.65 else 4 if k < 0.88 else 7
        if self.copies * most > self.MAX_COPIES:
            k, most = 0.0, 1
        self.copies *= most
        e, p, nul = self.atom()
        self.copies //= most
        if k < 0.55:
            return e, p, nul
        lazy = "?" if r.random() < 0.15 else ""
        if k < 0.65:
            q, lo, hi = "?", 0, 1
        elif k < 0.73 and not nul:
            q, lo, hi = "*", 0, None
        elif k < 0.8 and not nul:
            q, lo, hi = "+", 1, None
        elif k < 0.88:
            lo = hi = r.randint(0, 4)
            q = "{%d}" % lo
        elif k < 0.93 and not nul:
            lo, hi = r.randint(0, 3), None
            q = "{%d,}" % lo
        else:
            lo = r.randint(0, 3)
            hi = lo + r.randint(0, 4)
            q = "{%d,%d}" % (lo, hi)
        return e + q + lazy, ("rep", p, lo, hi), nul or lo == 0

    def seq(self):
        parts = [self.piece() for _ in range(self.r.randint(1, 4))]
        return "".join(a for a, _, _ in parts), ("cat", [b for _, b, _ in parts]), all(c for _, _, c in parts)

    def alts(self, depth=0):
        n = 1 if depth > 1 or self.r.random() < 0.7 else self.r.randint(2, 3)
        parts = []
        for _ in range(n):
            if depth < 2 and self.r.random() < 0.25:
                e, p, nul = self.alts(depth + 1)
                e = "(?:%s)" % e
            else:
                e, p, nul = self.seq()
            parts.append((e, p, nul))
        return "|".join(a for a, _, _ in parts), ("alt", [b for _, b, _ in parts]), any(c for _, _, c in parts)

    def top(self):
        """A whole pattern: top-level alternatives, each anchored or not;
        (ECMA text, its Nfa)."""
        parts = []
        for _ in range(1 if self.r.random() < 0.75 else 2):
            e, p, _ = self.seq()
            a, z = self.r.random() < 0.85, self.r.random() < 0.85
            parts.append((("^" if a else "") + e + ("$" if z else ""),
                          ("cat", [("bol",)] * a + [p] + [("eol",)] * z)))
        return "|".join(e for e, _ in parts), Nfa(("alt", [p for _, p in parts]))


class Nfa:
    """A pattern tree (Pat) as a Thompson automaton, run over the text with a
    set of states a position: time linear in the text whatever the pattern.
    search(text) is ECMA's test(): a match anywhere, ^ and $ at the ends."""

    def __init__(self, tree):
        self.eps = []       # state -> states reached without a code point
        self.gate = {}      # state -> "bol" / "eol": passable only at that end
        self.char = {}      # state -> (regex of one code point, next state)
        self.start = self._state()
        self.final = self._build(tree, self.start)

    def _state(self):
        self.eps.append([])
        return len(self.eps) - 1

    def _build(self, t, s):
        """Adds tree t after state s; returns the state where it ends."""
        kind = t[0]
        if kind in ("ch", "bol", "eol"):
            a, e = self._state(), self._state()
            self.eps[s].append(a)
            if kind == "ch":
                self.char[a] = (t[1], e)
            else:
                self.gate[a] = kind
                self.eps[a].append(e)
            return e
        if kind == "cat":
            for x in t[1]:
                s = self._build(x, s)
            return s
        if kind == "alt":
            e = self._state()
            for x in t[1]:
                self.eps[self._build(x, s)].append(e)
            return e
        _, x, lo, hi = t
        for _ in range(lo):
            s = self._build(x, s)
        if hi is None:
            loop = self._state()
            self.eps[s].append(loop)
            self.eps[self._build(x, loop)].append(loop)
            return loop
        e = self._state()
        for _ in range(hi - lo):
            self.eps[s].append(e)
            s = self._build(x, s)
        self.eps[s].append(e)
        return e

    def _closure(self, states, pos, n):
        seen, todo, at = set(), list(states), {"bol": 0, "eol": n}  # where each anchor's gate is open
        while todo:
            q = todo.pop()
            if q in seen or at.get(self.gate.get(q), pos) != pos:
                continue
            seen.add(q)
            todo.extend(self.eps[q])
        return seen

    def search(self, text):
        cur = set()
        for pos in range(len(text) + 1):
            cur = self._closure(cur | {self.start}, pos, len(text))
            if self.final in cur:
                return True
            if pos < len(text):
                cur = {self.char[q][1] for q in cur if q in self.char and self.char[q][0].fullmatch(text[pos])}
        return False


def rand_string(r):
    return r.choice(["", "a", "hi there", 'q"uote', "back\\slash", "tab\tnew\nline", "\x01ctl", "é中",
                     "\U0001F600 x", "/", "</script>", "1", "null", "\u2028"])


def rand_value(r, depth=0):
    """A random JSON value for enum and const; floats only non-integers that
    are exact in binary or common decimals (compared as doubles)."""
    k = r.random()
    if depth >= 2:
        k = k * 0.8
    if k < 0.1:
        return None
    if k < 0.2:
        return r.random() < 0.5
    if k < 0.4:
        return r.choice([0, 1, -1, 7, 42, -300, 10 ** 12, -(10 ** 15), 9007199254740993, 2 ** 63 - 1])
    if k < 0.5:
        return r.choice([0.5, -2.25, 3.75, 0.1, 1e-7, -1.5e300, 123.456])
    if k < 0.8:
        return rand_string(r)
    if k < 0.9:
        return [rand_value(r, depth + 1) for _ in range(r.randint(0, 3))]
    keys = r.sample(NAMES, r.randint(0, 3))
    return {kk: rand_value(r, depth + 1) for kk in keys}


def json_type(v):
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    return "object"


def unique_values(r, n):
    out, seen = [], set()
    for _ in range(n * 3):
        v = rand_value(r)
        key = json.dumps(v, sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append(v)
        if len(out) == n:
            break
    return out


class SchemaGen:
    """Random schemas of the subset jschema.h and PROTOCOL.md list. draft4:
    the keywords of draft 4 only ($schema says so, for the validator), with
    its boolean exclusiveMinimum / exclusiveMaximum and `definitions`."""

    def __init__(self, r, draft4=False):
        self.r = r
        self.draft4 = draft4
        self.defs = {}
        self.pats = {}          # ECMA text -> its Nfa
        self.defs_key = "definitions" if draft4 else "$defs"
        self.making = set()     # definitions being made (no $ref to them yet: it could consume nothing)

    def annotate(self, s):
        r = self.r
        if isinstance(s, dict) and r.random() < 0.15:
            k = r.choice(["title", "description", "$comment", "default", "examples", "deprecated",
                          "readOnly", "writeOnly"])
            s[k] = {"title": "t", "description": "a thing", "$comment": "c", "default": None,
                    "examples": [1, "x"], "deprecated": False, "readOnly": True,
                    "writeOnly": False}[k]
        return s

    def schema(self, depth):
        r = self.r
        if depth <= 0:
            kinds = ["null", "boolean", "integer", "number", "string", "enum", "const", "string", "integer"]
        else:
            kinds = ["null", "boolean", "integer", "number", "string", "string", "enum", "const",
                     "object", "object", "object", "array", "array", "anyOf", "oneOf", "allOf", "ref",
                     "typelist", "untyped", "any"]
        k = r.choice(kinds)
        if self.draft4 and k == "const":
            k = "enum"
        return self.annotate(getattr(self, "k_" + k)(depth))

    # ---- scalars
    def k_null(self, depth):
        return {"type": "null"}

    def k_boolean(self, depth):
        return {"type": "boolean"}

    def bounds(self, integer):
        """lo, hi (None: unbounded) and the keywords spelling them."""
        r = self.r
        scale = r.choice([10, 100, 10 ** 6, 10 ** 15, 9 * 10 ** 18])
        lo = r.randint(-scale, scale) if r.random() < 0.7 else None
        hi = None
        if r.random() < 0.7:
            base = lo if lo is not None else -scale
            hi = min(base + r.randint(2, 2 * scale + 2), 9 * 10 ** 18)
            if lo is not None and hi < lo + 2:
                hi = lo + 2
                if hi > 9 * 10 ** 18:
                    lo, hi = hi - 4, hi - 2
        s = {}
        if lo is not None:
            if self.draft4:
                s["minimum"] = lo
                if r.random() < 0.4:
                    s["exclusiveMinimum"] = True
            elif r.random() < 0.3:
                s["exclusiveMinimum"] = lo
            elif integer and r.random() < 0.2 and abs(lo) < 10 ** 15:
                s["minimum"] = lo - 0.5            # rounds inward to lo
            else:
                s["minimum"] = lo
            if not integer and r.random() < 0.2 and abs(lo) < 10 ** 15 and "minimum" in s:
                s["minimum"] = float(lo)          # a whole number spelled as a float
        if hi is not None:
            if self.draft4:
                s["maximum"] = hi
                if r.random() < 0.4:
                    s["exclusiveMaximum"] = True
            elif r.random() < 0.3:
                s["exclusiveMaximum"] = hi
            elif integer and r.random() < 0.2 and abs(hi) < 10 ** 15:
                s["maximum"] = hi + 0.25
            else:
                s["maximum"] = hi
        return s

    def k_integer(self, depth):
        s = {"type": "integer"}
        if self.r.random() < 0.75:
            s.update(self.bounds(True))
        return s

    def k_number(self, depth):
        s = {"type": "number"}
        if self.r.random() < 0.6:
            s.update(self.bounds(False))
        return s

    def k_string(self, depth):
        r = self.r
        s = {"type": "string"}
        k = r.random()
        if k < 0.12:
            return s                                # any string
        if k < 0.45:
            lo = r.randint(0, 6) if r.random() < 0.7 else None
            hi = (lo or 0) + r.randint(0, 12) if r.random() < 0.8 or lo is None else None
            if lo is not None:
                s["minLength"] = lo
            if hi is not None:
                s["maxLength"] = hi
            return s
        if k < 0.85:
            e, nfa = Pat(r).top()
            self.pats[e] = nfa
            s["pattern"] = e
            return s
        s["format"] = r.choice(["date", "time", "date-time", "uuid"])
        return s

    # ---- enum, const
    def k_enum(self, depth):
        r = self.r
        vals = unique_values(r, r.randint(1, 5))
        s = {}
        if not self.draft4 and r.random() < 0.15:
            s["const"] = r.choice(vals)
        if r.random() < 0.3:
            types = sorted({json_type(v) for v in vals})
            t = json_type(s["const"]) if "const" in s else r.choice(types)
            if t == "integer" and r.random() < 0.5:
                t = "number"                       # number takes integers too
            s["type"] = t if r.random() < 0.6 else [t, r.choice(["null", "string", "array"])]
        s["enum"] = vals
        return s

    def k_const(self, depth):
        return {"const": rand_value(self.r)}

    # ---- objects
    def name(self):
        return self.r.choice(NAMES)

    def k_object(self, depth):
        r = self.r
        s = {"type": "object"} if r.random() < 0.9 else {}
        names = list(dict.fromkeys(self.name() for _ in range(r.randint(0, 5))))
        props = {}
        for n in names:
            props[n] = self.schema(depth - 1) if r.random() < 0.93 or self.draft4 else False
        req = [n for n in names if props[n] is not False and r.random() < 0.5]
        k = r.random()
        extra_ok = True
        if k < 0.45:
            pass                                    # absent: named ones only (any object if none named)
        elif k < 0.6:
            s["additionalProperties"] = False
            extra_ok = False
        elif k < 0.75:
            s["additionalProperties"] = True
        else:
            s["additionalProperties"] = self.schema(min(depth - 1, 1))
        if extra_ok and r.random() < 0.15:
            extra = self.name()
            if extra not in props:
                req.append(extra)
        if props or r.random() < 0.5:
            s["properties"] = props
        if req or r.random() < 0.2:
            if "properties" not in s and not req:
                pass
            else:
                s["required"] = req
        if not names and not req and "additionalProperties" not in s and r.random() < 0.7:
            s["additionalProperties"] = False       # {} objects: mostly empty, not any object
        return s

    # ---- arrays
    def k_array(self, depth):
        r = self.r
        s = {"type": "array"} if r.random() < 0.9 else {}
        n_prefix = 0
        items_false = False
        if not self.draft4 and r.random() < 0.2:
            n_prefix = r.randint(1, 3)
            s["prefixItems"] = [self.schema(depth - 1) for _ in range(n_prefix)]
        k = r.random()
        if k < 0.75:
            s["items"] = self.schema(depth - 1)
        elif k < 0.82 and n_prefix:
            s["items"] = False
            items_false = True
        lo = r.randint(0, 3) if r.random() < 0.5 else None
        hi = (lo or 0) + r.randint(0, 4) if r.random() < 0.6 else None
        if items_false:
            lo = min(lo, n_prefix) if lo is not None else None
        if "items" not in s and hi is None:
            hi = (lo or 0) + r.randint(0, 3)        # any values: a few
        if lo is not None:
            s["minItems"] = lo
        if hi is not None:
            s["maxItems"] = hi
        if r.random() < 0.1:
            s["uniqueItems"] = False
        return s

    # ---- combinators
    def k_anyOf(self, depth):
        return {"anyOf": [self.schema(depth - 1) for _ in range(self.r.randint(1, 3))]}

    def k_oneOf(self, depth):
        r = self.r
        k = r.random()
        if k < 0.5:        # branches of different types
            kinds = r.sample(["null", "boolean", r.choice(["integer", "number"]), "string", "object", "array"],
                             r.randint(2, 3))
            br = []
            for t in kinds:
                b = getattr(self, "k_" + t)(depth - 1)
                b["type"] = t   # a branch without type validates every type (PROTOCOL.md: refused)
                br.append(b)
            return {"oneOf": br}
        if k < 0.75:       # enum / const values, none equal
            vals = unique_values(r, r.randint(2, 6))
            br, i = [], 0
            while i < len(vals):
                n = r.randint(1, 2)
                part = vals[i:i + n]
                i += n
                br.append({"const": part[0]} if len(part) == 1 and not self.draft4 else {"enum": part})
            if len(br) < 2:
                return {"oneOf": [{"enum": vals}, {"type": "object", "properties": {}, "required": ["only"]}]
                        if not any(isinstance(v, dict) for v in vals) else [{"enum": vals}]}
            return {"oneOf": br}
        # objects with a discriminator
        tags = r.sample(["cat", "dog", "emu", 1, 2, True, None], r.randint(2, 3))
        br = []
        for t in tags:
            o = self.k_object(depth - 1)
            o["type"] = "object"
            props = {"kind": {"const": t} if not self.draft4 else {"enum": [t]}}
            props.update({k2: v for k2, v in o.get("properties", {}).items() if k2 != "kind"})
            o["properties"] = props
            o["required"] = ["kind"] + [x for x in o.get("required", []) if x != "kind"]
            if o.get("additionalProperties") is False and any(x not in props for x in o["required"]):
                del o["additionalProperties"]
            br.append(o)
        return {"oneOf": br}

    def k_allOf(self, depth):
        br = [self.schema(depth - 1), {} if self.draft4 else True,
              {"description": "only says what it is"}][:self.r.randint(1, 3)]
        self.r.shuffle(br)
        return {"allOf": br}

    def def_ref(self, name, sub):
        self.defs[name] = sub
        esc = name.replace("~", "~0").replace("/", "~1").replace("%", "%25").replace(" ", "%20")
        return "#/%s/%s" % (self.defs_key, esc)

    def k_ref(self, depth):
        r = self.r
        name = r.choice(DEF_NAMES)
        if name in self.making:
            return self.k_integer(depth)
        if name in self.defs:
            return {"$ref": self.def_ref(name, self.defs[name])}
        if r.random() < 0.35:
            # recursive: a tree whose children are more of it
            node = {"type": "object", "properties": {"v": self.schema(0), "kids": {
                "type": "array", "maxItems": 2}}, "required": ["v"], "additionalProperties": False}
            ref = self.def_ref(name, node)
            node["properties"]["kids"]["items"] = {"$ref": ref}
            return {"$ref": ref}
        self.making.add(name)
        sub = self.schema(depth - 1)
        self.making.discard(name)
        return {"$ref": self.def_ref(name, sub)}

    # ---- others
    def k_typelist(self, depth):
        r = self.r
        t = r.sample(["null", "boolean", "integer", "string", "array"], r.randint(2, 3))
        s = {"type": t}
        if "string" in t and r.random() < 0.5:
            s["maxLength"] = r.randint(0, 5)
        if "integer" in t and r.random() < 0.5:
            s["minimum"] = r.randint(-5, 5)
        if "array" in t:
            s["maxItems"] = r.randint(0, 3)
            if r.random() < 0.7:
                s["items"] = self.schema(0)
        return s

    def k_untyped(self, depth):
        """Keywords without type: their types alone."""
        r = self.r
        return r.choice([{"minimum": r.randint(-9, 0), "maximum": r.randint(1, 99)},
                         {"maxLength": r.randint(0, 8)},
                         {"properties": {self.name(): self.schema(0)}, "additionalProperties": False},
                         {"items": self.schema(0), "maxItems": r.randint(0, 4)}])

    def k_any(self, depth):
        return self.r.choice([{}, {"title": "anything"}] + ([] if self.draft4 else [True]))

    def root(self, depth):
        """The whole schema. Never `true` or `false` alone: test_grammar_edges
        checks those (the daemon refused them as text: not an object)."""
        r = self.r
        if r.random() < 0.05:
            # recursion through the root: "#"
            s = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9},
                                                  "next": {"$ref": "#"}}, "additionalProperties": False}
            if r.random() < 0.5:
                s["required"] = ["n"]
        else:
            s = self.schema(depth)
        if self.defs:
            # unused definitions too are fine; the placeholder `true` stays valid
            if not isinstance(s, dict):
                s = {"allOf": [s]}
            s[self.defs_key] = self.defs
        if not isinstance(s, dict):
            s = {"allOf": [s]} if r.random() < 0.5 else {}
        if self.draft4:
            s["$schema"] = "http://json-schema.org/draft-04/schema#"
        elif r.random() < 0.05:
            s["$id"] = "https://example.com/schemas/t.json"   # the root's: $refs "#/..." stay in the document
        return s


def make_schema(seed, i):
    r = random.Random("%d:%d" % (seed, i))
    g = SchemaGen(r, draft4=r.random() < 0.1)
    s = g.root(r.choice([1, 2, 2, 3, 3, 4]))
    text = json.dumps(s, ensure_ascii=r.random() < 0.5)
    return text, g


# ==========================================================================
# checking an output

def _is_date(s):
    m = re.fullmatch(r"(\d{4})-(\d{2})-(\d{2})", s)
    if not m or int(m.group(1)) == 0:
        return False
    try:
        date(int(m.group(1)), int(m.group(2)), int(m.group(3)))
        return True
    except ValueError:
        return False


_TIME = r"([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d+)?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)"


def _is_time(s):
    return re.fullmatch(_TIME, s) is not None


def _is_datetime(s):
    return len(s) > 11 and s[10] == "T" and _is_date(s[:10]) and _is_time(s[11:])


def _is_uuid(s):
    if not re.fullmatch(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}", s):
        return False
    uuidlib.UUID(s)
    return True


def to_float(v):
    if isinstance(v, Decimal):
        return float(v)
    if isinstance(v, list):
        return [to_float(x) for x in v]
    if isinstance(v, dict):
        return {k: to_float(x) for k, x in v.items()}
    return v


def make_validator(schema, pats):
    """The validator for schema ($schema picks draft 4), with the checks
    above: patterns as ECMA-262 (pats: their automata), our
    formats, enum and const read as doubles, integers by value."""
    base = jvalidators.validator_for(schema, default=jvalidators.Draft202012Validator)
    fc = jsonschema.FormatChecker(formats=())
    for name, fn in (("date", _is_date), ("time", _is_time), ("date-time", _is_datetime), ("uuid", _is_uuid)):
        fc.checks(name)(lambda v, fn=fn: not isinstance(v, str) or fn(v))

    def pattern(validator, patrn, instance, sch):
        if validator.is_type(instance, "string") and not pats[patrn].search(instance):
            yield jsonschema.ValidationError("%r does not match the ECMA-262 pattern %r" % (instance, patrn))

    orig_enum, orig_const = base.VALIDATORS["enum"], base.VALIDATORS.get("const")

    def enum(validator, enums, instance, sch):
        yield from orig_enum(validator, enums, to_float(instance), sch)

    vals = {"pattern": pattern, "enum": enum}
    if orig_const is not None:
        def const(validator, c, instance, sch):
            yield from orig_const(validator, c, to_float(instance), sch)
        vals["const"] = const

    def is_integer(checker, inst):
        if isinstance(inst, bool):
            return False
        return isinstance(inst, int) or (isinstance(inst, Decimal) and inst.is_finite()
                                         and inst == inst.to_integral_value())

    def is_number(checker, inst):
        return not isinstance(inst, bool) and isinstance(inst, (int, float, Decimal))

    tc = base.TYPE_CHECKER.redefine_many({"integer": is_integer, "number": is_number})
    cls = jvalidators.extend(base, validators=vals, type_checker=tc)
    return cls(schema, format_checker=fc)


class Obj(dict):
    """A parsed JSON object that keeps its members in order, repeats included."""

    def __init__(self, pairs):
        super().__init__(pairs)
        self.pairs = pairs


def resolve(root, ref):
    """The schema a "#..." $ref names in root (JSON pointer, ~0 ~1 %XX)."""
    t = root
    for tok in ref[1:].split("/")[1:]:
        tok = unquote(tok).replace("~1", "/").replace("~0", "~")
        t = t[int(tok)] if isinstance(t, list) else t[tok]
    return t


def spelling(root, schema, v, where="", depth=0):
    """The member order PROTOCOL.md promises (properties, then required
    names missing from them, then additional ones), with no named key twice,
    checked where the schema of a value is known without choosing a branch
    (anyOf, oneOf: not followed). None, or what is wrong."""
    for _ in range(64):
        if isinstance(schema, dict) and "$ref" in schema:
            schema = resolve(root, schema["$ref"])
        elif isinstance(schema, dict) and "allOf" in schema:
            br = [x for x in schema["allOf"] if x is not True and
                  not (isinstance(x, dict) and set(x) <= {"title", "description", "$comment"})]
            if len(br) != 1:
                return None
            schema = br[0]
        else:
            break
    if not isinstance(schema, dict) or depth > 64 or "anyOf" in schema or "oneOf" in schema:
        return None
    if isinstance(v, Obj):
        props = schema.get("properties", {})
        named = list(props) + [n for n in schema.get("required", []) if n not in props]
        keys = [k for k, _ in v.pairs]
        for k in set(keys):
            if k in named and keys.count(k) > 1:
                return "%s: the named key %r twice" % (where or "(root)", k)
        ranks = [named.index(k) if k in named else len(named) for k in keys]
        if ranks != sorted(ranks):
            return "%s: members %r out of the promised order %r" % (where or "(root)", keys, named)
        for k, x in v.pairs:
            sub = props[k] if k in props else schema.get("additionalProperties", True)
            e = spelling(root, sub, x, "%s/%s" % (where, k), depth + 1)
            if e:
                return e
    elif isinstance(v, list):
        prefix = schema.get("prefixItems", [])
        for i, x in enumerate(v):
            e = spelling(root, prefix[i] if i < len(prefix) else schema.get("items", True), x,
                         "%s/%d" % (where, i), depth + 1)
            if e:
                return e
    return None


def strings_ok(v):
    """No U+0000 and no unpaired surrogate in any string or key."""
    if isinstance(v, str):
        if "\x00" in v:
            return False
        try:
            v.encode("utf-8")
            return True
        except UnicodeEncodeError:
            return False
    if isinstance(v, list):
        return all(strings_ok(x) for x in v)
    if isinstance(v, Obj):
        return all(strings_ok(k) and strings_ok(x) for k, x in v.pairs)
    return True


def parse_output(text):
    """json.loads with exact numbers, objects as Obj."""
    return json.loads(text, parse_float=exact_number, object_pairs_hook=Obj)


def exact_number(s):
    """A JSON number with a fraction or exponent, exactly; one whose exponent
    passes Decimal's range (1e999999999999999999...) as the float it is."""
    try:
        return Decimal(s)
    except ArithmeticError:
        return float(s)


def json_prefix_ok(s):
    """Whether s is a prefix of some JSON text (no whitespace around it)."""
    i, n = 0, len(s)

    class End(Exception):
        pass

    def peek():
        if i >= n:
            raise End
        return s[i]

    def ws():
        nonlocal i
        while i < n and s[i] in " \t\n\r":
            i += 1

    def lit(word):
        nonlocal i
        for c in word:
            if peek() != c:
                raise ValueError("bad literal")
            i += 1

    def digits(need):
        nonlocal i
        j = i
        while i < n and s[i].isdigit() and s[i] in "0123456789":
            i += 1
        if i == n:
            raise End
        if need and i == j:
            raise ValueError("digit expected")

    def number():
        nonlocal i
        if peek() == "-":
            i += 1
        if peek() == "0":
            i += 1
        elif peek() in "123456789":
            digits(False)
        else:
            raise ValueError("bad number")
        if i == n:
            raise End
        if s[i] == ".":
            i += 1
            peek()
            digits(True)
        if s[i] in "eE":
            i += 1
            if peek() in "+-":
                i += 1
            peek()
            digits(True)

    def string():
        nonlocal i
        i += 1
        while True:
            c = peek()
            if c == '"':
                i += 1
                return
            if c == "\\":
                i += 1
                e = peek()
                if e in '"\\/bfnrt':
                    i += 1
                elif e == "u":
                    i += 1
                    for _ in range(4):
                        if peek() not in "0123456789abcdefABCDEF":
                            raise ValueError("bad \\u")
                        i += 1
                else:
                    raise ValueError("bad escape")
            elif ord(c) < 0x20:
                raise ValueError("raw control character")
            else:
                i += 1

    def container(close, item):
        # an object's or array's items, past its opening bracket, up to close
        nonlocal i
        i += 1
        ws()
        if peek() == close:
            i += 1
            return
        while True:
            ws()
            item()
            ws()
            if peek() == ",":
                i += 1
                continue
            lit(close)
            return

    def member():
        if peek() != '"':
            raise ValueError("key expected")
        string()
        ws()
        lit(":")
        ws()
        value()

    def value():
        c = peek()
        if c == "{":
            return container("}", member)
        if c == "[":
            return container("]", value)
        if c == '"':
            return string()
        if c in "-0123456789":
            return number()
        for w in ("true", "false", "null"):
            if c == w[0]:
                return lit(w)
        raise ValueError("bad value")

    try:
        value()
    except End:
        return True
    except (ValueError, IndexError):
        return False
    return i == n


def check_output(schema_text, g, done):
    """None if the output is right, else what is wrong."""
    text = done.get("text", "")
    finish = done.get("finish")
    if finish == "length":
        return None if json_prefix_ok(text) else "a length-cut output that no JSON text begins with"
    if finish != "stop":
        return "finish %r" % finish
    if text != text.strip(" \t\n\r"):
        return "whitespace around the value"
    try:
        v = parse_output(text)
    except (ValueError, ArithmeticError) as e:
        return "not JSON: %r" % e
    if not strings_ok(v):
        return "a string holds U+0000 or an unpaired surrogate"
    schema = json.loads(schema_text)
    try:
        errs = sorted(make_validator(schema, g.pats).iter_errors(v), key=lambda e: list(e.path))
    except Exception as e:  # noqa: BLE001 (a bad schema from the generator is a failure too)
        return "the validator failed: %r" % e
    if errs:
        e = errs[0]
        return "invalid at %s: %s" % ("/".join(str(p) for p in e.absolute_path) or "(root)", e.message[:300])
    return spelling(schema, schema, v)


# ==========================================================================
# 1. the property test

def property_test(ck, seed, n, only):
    rng = random.Random(seed)
    jobs = []
    for i in range(n):
        if only is not None and i != only:
            continue
        text, g = make_schema(seed, i)
        jobs.append((i, text, g, rng.randrange(1 << 31)))
    if only is not None:
        jobs = jobs[:1]
    prompts = ["Output:", "hello", "The answer is", "{", "[1, 2"]
    t0 = time.monotonic()
    results = {}
    with Daemon(extra=["--ctx", "1024", "--kv-tokens", str(WINDOW * (MAX_TOKENS + 64))]) as d:
        c = d.client(timeout=120)
        pending = {}
        it = iter(jobs)
        exhausted = False
        while pending or not exhausted:
            while not exhausted and len(pending) < WINDOW:
                try:
                    i, text, g, rseed = next(it)
                except StopIteration:
                    exhausted = True
                    break
                rid = c.start_generate(prompt=prompts[i % len(prompts)], json_schema=text, seed=rseed,
                                       max_tokens=MAX_TOKENS, stream=False, **SAMPLING)
                pending[rid] = (i, text, g, rseed)
            if not pending:
                break
            rep = c.any(timeout=120)
            if rep["id"] not in pending:
                ck.ok(False, "a reply to no request in flight: %r" % rep)
                continue
            if rep["type"] in ("token", "progress"):
                continue
            results[rep["id"]] = (pending.pop(rep["id"]), rep)
        ck.ok(d.alive(), "the daemon is alive after %d schemas" % len(jobs))
        st = c.call("status")
    elapsed = time.monotonic() - t0

    fin = {}
    tokens = 0
    bad = 0
    for rid in sorted(results):
        (i, text, g, rseed), rep = results[rid]
        if rep["type"] == "error":
            what = "refused: %s: %s" % (rep.get("code"), rep.get("message"))
            fin["error"] = fin.get("error", 0) + 1
        else:
            fin[rep["finish"]] = fin.get(rep["finish"], 0) + 1
            tokens += rep["usage"]["generated_tokens"]
            what = check_output(text, g, rep)
        if what is not None:
            bad += 1
            if bad <= 10 or os.environ.get("RESIDENT_SCHEMA_SHOW"):
                print("FAIL schema %d (RESIDENT_SCHEMA_SEED=%d RESIDENT_SCHEMA_ONLY=%d):\n  schema: %s\n"
                      "  request seed: %d\n  output (%s): %r\n  %s" %
                      (i, seed, i, text, rseed, rep.get("finish", rep["type"]), rep.get("text"), what),
                      flush=True)
            ck.ok(False, "schema %d: %s" % (i, what))
    n_done = len(results)
    print("%d schemas in %.1fs (seed %d): finish %s, %d tokens generated; status %s" %
          (n_done, elapsed, seed, fin, tokens, {k: st.get(k) for k in ("queued", "active") if k in st}),
          flush=True)
    ck.eq(n_done, len(jobs), "every request was answered")
    ck.eq(bad, 0, "outputs that break their schema, or schemas refused")
    if only is None:
        share = fin.get("length", 0) / max(1, n_done)
        ck.ok(share <= MAX_LENGTH_SHARE, "outputs cut by max_tokens: %.1f%%, at most %.0f%%" %
              (100 * share, 100 * MAX_LENGTH_SHARE))


# ==========================================================================
# 2. greedy agreement on Gemma 3 270M

# Gemma 3 270M of the PyPI package is the pretrained model, not the
# instruction-tuned one: it continues text rather than answering a chat. So
# the prompts are raw few-shot text after which its greedy continuation is a
# JSON value on a line of its own; the stop string "\n" ends the free reply
# right after the value.
GREEDY_CASES = [
    ("record",
     'Convert each record to JSON.\nRecord: name Ada, age 36\nJSON:\n{"name": "Ada", "age": 36}\n'
     'Record: name Bob, age 25\nJSON:\n{"name": "Bob", "age": 25}\nRecord: name Cy, age 41\nJSON:\n',
     {"type": "object", "properties": {"name": {"type": "string", "pattern": "^[A-Z][a-z]+$"},
                                       "age": {"type": "integer", "minimum": 0, "maximum": 150}},
      "required": ["name", "age"], "additionalProperties": False}),
    ("enum",
     'Classify the sentiment as JSON.\nText: I love it\nJSON:\n{"sentiment": "positive"}\n'
     'Text: This is awful\nJSON:\n{"sentiment": "negative"}\nText: What a wonderful day\nJSON:\n',
     {"type": "object", "properties": {"sentiment": {"enum": ["positive", "negative", "neutral"]}},
      "required": ["sentiment"], "additionalProperties": False}),
    ("array of objects",
     'List the items as JSON.\nItems: pen 2, cup 3\nJSON:\n[{"item": "pen", "count": 2}, {"item": "cup", "count": 3}]\n'
     'Items: book 1, lamp 4\nJSON:\n',
     {"type": "array", "minItems": 1, "items": {
         "type": "object", "properties": {"item": {"type": "string", "maxLength": 20},
                                          "count": {"type": "integer", "minimum": 1}},
         "required": ["item", "count"], "additionalProperties": False}}),
    ("array of integers",
     "Primes below 12 as a JSON array:\n[2, 3, 5, 7, 11]\nEven numbers below 10 as a JSON array:\n",
     {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 100}, "maxItems": 30}),
    ("nested object",
     'Describe each person as nested JSON.\nAda, 36, lives in London, UK\nJSON:\n'
     '{"name": "Ada", "age": 36, "address": {"city": "London", "country": "UK"}}\n'
     'Bob, 25, lives in Paris, France\nJSON:\n',
     {"type": "object", "properties": {
         "name": {"type": "string"}, "age": {"type": "integer"},
         "address": {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
                     "required": ["city", "country"]}},
      "required": ["name", "address"], "additionalProperties": False}),
]


def greedy_test(ck):
    try:
        model = rsd.gemma_path()
    except Skip as e:
        print("SKIP greedy agreement: %s" % e, flush=True)
        return
    with Daemon(model=model) as d:
        c = d.client(timeout=300)
        for name, prompt, schema in GREEDY_CASES:
            kw = dict(prompt=prompt, temperature=0, max_tokens=100, stop=["\n"])
            free = c.generate(**kw)
            try:
                v = json.loads(free.text)
                errs = list(jsonschema.Draft202012Validator(schema).iter_errors(v))
            except ValueError as e:
                errs = [e]
            if not ck.ok(free.finish == "stop" and not errs and free.text == free.text.strip(),
                         "%s: the free greedy reply is one bare JSON value valid under its schema: %r %s" %
                         (name, free.text, errs[:1])):
                continue
            cons = c.generate(json_schema=json.dumps(schema), **kw)
            ck.eq((cons.text, cons.finish), (free.text, "stop"), "%s: constrained greedy = free greedy" % name)
            ck.eq(cons.ids, free.ids[:len(cons.ids)], "%s: the same tokens" % name)
            print("greedy agreement, %s: %r" % (name, cons.text), flush=True)


def main():
    if jsonschema is None:
        raise AssertionError("the PyPI package jsonschema is not installed (contrib/install-deps.sh "
                             "installs it; pip install jsonschema): this test does not skip without it")
    ck = Checks()
    seed = int(os.environ.get("RESIDENT_SCHEMA_SEED") or random.SystemRandom().randrange(1 << 31))
    n = int(os.environ.get("RESIDENT_SCHEMA_N") or N_DEFAULT)
    only = os.environ.get("RESIDENT_SCHEMA_ONLY")
    only = int(only) if only not in (None, "") else None
    print("seed %d (RESIDENT_SCHEMA_SEED=%d repeats this run)" % (seed, seed), flush=True)
    with ck.section("random schemas, sampled at temperature 1.5"):
        property_test(ck, seed, n, only)
    if only is not None or os.environ.get("RESIDENT_SCHEMA_NO_GEMMA"):
        pass
    elif rsd.instrumented():
        print("SKIP greedy agreement: an instrumented build runs Gemma at about a token a second", flush=True)
    else:
        with ck.section("greedy agreement on Gemma 3 270M"):
            greedy_test(ck)
    return ck


if __name__ == "__main__":
    rsd.main(main)
