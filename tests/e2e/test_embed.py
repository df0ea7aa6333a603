#!/usr/bin/env python3
"""test_embed.py: the embed op on generated embedding models, and every
client of it: the CLI, the Python package, and resident-http driven by the
`openai` package (/v1/embeddings) and the `ollama` package (/api/embed,
/api/embeddings).

The models: `resident-model gen` tiny-qwen3-embed (a Qwen3 with last-token
pooling) and tiny-gemma3-embed (a Gemma 3 with bidirectional attention, a
sliding window of 16, mean pooling and two Dense modules), each as a GGUF
file (qwen3.pooling_type; llama.cpp's gemma-embedding with dense_2 and
dense_3) and as a sentence-transformers directory (modules.json, 1_Pooling,
2_Dense, 3_Dense, 4_Normalize) of the same weights, in float32.

Checked: the two files of a shape give the same vectors; vectors are unit
length; dimensions cuts and normalises again, and more than the model's is
refused; an input's vector does not depend on what else is in the request or
on where its chunks fall (a causal input longer than a step); token id inputs
equal their text; an input over the context is context_exceeded, or cut with
truncate; a model that is no embedding model, a generate on a bidirectional
one, empty inputs, too many, ids outside the vocabulary are refused with clear
errors (the bridge's: a body with a key twice too), and a client that leaves
with a large request in flight does not stop the daemon; the bridge's replies
print each float32 in the 9 significant digits that give it back. 256 inputs
in one request must take less time than 256 requests one after the other (the
figures are printed).

Skips (77) without msgpack; the openai and ollama parts each skip alone
(saying so) when their package is missing.
"""
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rsd  # noqa: E402
from rsd import Checks, Daemon  # noqa: E402
from test_openai import Bridge  # noqa: E402

sys.path.insert(0, os.path.join(rsd.common.srcdir(), "contrib", "python"))
import resident  # noqa: E402

try:
    import numpy as np
except ImportError:
    np = None

SHAPES = ["tiny-qwen3-embed", "tiny-gemma3-embed"]
TEXTS = ["hello world", "The quick brown fox jumps over the lazy dog.", "x",
         "A longer sentence, so that its tokens reach past the sliding window of the Gemma model's layers."]
N_BATCH = 256


def models(tmp):
    """{shape: (gguf path, safetensors directory)}, the same weights."""
    out = {}
    for s in SHAPES:
        g = os.path.join(tmp, s + ".gguf")
        d = os.path.join(tmp, s + "-st")
        for path, fmt in ((g, "gguf"), (d, "safetensors")):
            subprocess.run([rsd.tool("resident-model"), "gen", s, path, "--type", "f32", "--format", fmt, "--quiet"],
                           check=True, stdout=subprocess.DEVNULL)
        out[s] = (g, d)
    return out


def vecs(r):
    return np.array(r["embeddings"], dtype=np.float64)


def max_diff(a, b):
    return float(np.max(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64))))


def cos_min(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.min(np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))))


def check_model(ck, c, shape, gguf, st):
    """The vectors of one shape through the protocol."""
    a = c.call("embed", input=TEXTS, model=gguf, timeout=120)
    b = c.call("embed", input=TEXTS, model=st, timeout=120)
    ck.eq(vecs(a).shape, (len(TEXTS), 256), "%s: a vector of 256 floats per input" % shape)
    ck.ok(cos_min(vecs(a), vecs(b)) > 0.99999, "%s: the GGUF file and the sentence-transformers directory agree "
          "(min cosine %.7f)" % (shape, cos_min(vecs(a), vecs(b))))
    ck.ok(max_diff(np.linalg.norm(vecs(a), axis=1), 1.0) < 1e-5, "%s: vectors are unit length" % shape)
    ck.ok(max_diff(vecs(a)[0], vecs(a)[1]) > 1e-2, "%s: two texts have different vectors" % shape)
    ck.eq(a["dimensions"], 256, "%s: dimensions reported" % shape)
    shown = c.call("model.show", model=st)["model"]
    ck.eq((shown["pooling"], shown["dimensions"], shown["bidirectional"]),
          ("last", 256, False) if "qwen3" in shape else ("mean", 256, True), "%s: model.show's embedding fields" % shape)
    ck.eq(len(a["tokens"]), len(TEXTS), "%s: a token count per input" % shape)
    ck.eq(a["usage"]["prompt_tokens"], sum(a["tokens"]), "%s: usage.prompt_tokens sums the inputs'" % shape)
    cut = c.call("embed", input=TEXTS, model=gguf, dimensions=64)
    full = vecs(a)[:, :64]
    full /= np.linalg.norm(full, axis=1, keepdims=True)
    ck.ok(vecs(cut).shape == (len(TEXTS), 64) and max_diff(vecs(cut), full) < 1e-6,
          "%s: dimensions 64 is the first 64 floats normalised again" % shape)
    ck.code(lambda: c.call("embed", input=TEXTS, model=gguf, dimensions=257), "invalid_param",
            "%s: dimensions over the model's 256" % shape)
    # an input's vector is its own: alone, or among others in the same steps
    many = ["filler text number %d, of a few words" % i for i in range(40)]
    mixed = c.call("embed", input=many[:20] + [TEXTS[3]] + many[20:], model=gguf, timeout=120)
    ck.ok(max_diff(vecs(mixed)[20], vecs(a)[3]) < 1e-6, "%s: an input among 40 others has the vector it has "
          "alone (max diff %.2g)" % (shape, max_diff(vecs(mixed)[20], vecs(a)[3])))
    ids = c.call("tokenize", text=TEXTS[1], model=gguf)["tokens"]
    by_ids = c.call("embed", input=[ids, TEXTS[0]], model=gguf)
    ck.ok(max_diff(vecs(by_ids)[0], vecs(a)[1]) < 1e-6 and by_ids["tokens"][0] == len(ids),
          "%s: token ids of a text give its vector" % shape)
    ck.code(lambda: c.call("embed", input=[[10 ** 6]], model=gguf), "invalid_param",
            "%s: a token id outside the vocabulary" % shape)
    return vecs(a)


def check_context(ck, c, m):
    """Inputs over the context; a causal input longer than a step, in chunks that fall anywhere."""
    g = m["tiny-gemma3-embed"][0]
    long_text = "word " * 1100
    ck.code(lambda: c.call("embed", input=["short", long_text], model=g), "context_exceeded",
            "an input over the context (1024 tokens)")
    r = c.call("embed", input=["short", long_text], model=g, truncate=True, timeout=120)
    ck.ok(r["tokens"][1] == 1024 and r["usage"]["truncated"] == 1 and len(r["embeddings"]) == 2,
          "truncate cuts it to the context, in one step with bidirectional attention: %r" % (r["tokens"],))
    q = m["tiny-qwen3-embed"][0]
    text = "many words " * 240   # about 1,200 tokens: three steps of 512
    alone = c.call("embed", input=[text], model=q, timeout=120)
    beside = c.call("embed", input=["a few words first", text], model=q, timeout=120)
    ck.ok(alone["tokens"][0] > 1024 and max_diff(vecs(alone)[0], vecs(beside)[1]) < 1e-6,
          "an input of %d tokens pooled over steps gives its vector whatever its chunks (max diff %.2g)" %
          (alone["tokens"][0], max_diff(vecs(alone)[0], vecs(beside)[1])))


def check_errors(ck, c, d, m):
    g = m["tiny-gemma3-embed"][0]
    ck.code(lambda: c.call("embed", input=TEXTS), "invalid_param", "embed on a model that is no embedding model")
    ck.code(lambda: c.generate(model=g, prompt="hello", max_tokens=4), "invalid_param",
            "generate on a model with bidirectional attention")
    ck.code(lambda: c.call("embed", input="", model=g), "invalid_param", "an empty input")
    ck.code(lambda: c.call("embed", input=[], model=g), "invalid_param", "no inputs")
    ck.code(lambda: c.call("embed", input=["x"] * 2049, model=g), "invalid_param", "2049 inputs")
    ck.code(lambda: c.call("embed", input=[1.5], model=g), "bad_request", "an input that is a float")
    ck.code(lambda: c.call("embed", model=g), "bad_request", "no input")
    ck.code(lambda: c.call("embed", input="x", model=g, dimensions=0), "invalid_param", "dimensions 0")
    r = c.generate(model=m["tiny-qwen3-embed"][0], prompt="hello", max_tokens=4, temperature=0)
    ck.ok(r.finish in ("stop", "length"), "a causal embedding model (Qwen3) still generates")
    # a client that leaves with a large request in flight
    other = d.client()
    other.request("embed", input=["text %d to embed" % i for i in range(1000)], model=g)
    other.close()
    ck.eq(len(c.call("embed", input="still here", model=g, timeout=60)["embeddings"]), 1,
          "the daemon serves on after a client left in the middle of 1000 inputs")
    rid = c.request("embed", input=["text %d to embed" % i for i in range(1000)], model=g)
    cid = c.request("cancel", target=rid)
    got = {}
    deadline = time.monotonic() + 60
    while len(got) < 2 and time.monotonic() < deadline:
        rep = c.any(timeout=60)
        got[rep["id"]] = rep
    ck.ok(got.get(rid, {}).get("type") == "result" or got.get(rid, {}).get("code") == "cancelled",
          "a cancelled embed ends with its result (done first) or the error cancelled: %r" %
          ({k: v for k, v in got.get(rid, {}).items() if k != "embeddings"},))


def check_batching(ck, c, m):
    """N_BATCH inputs in one request against N_BATCH requests one after the other, each timed twice
    in turn (the best of each counts: make check runs other tests beside this one), for short
    inputs (what each request costs besides its tokens shows) and for longer ones (on a model this
    small a step's cost is mostly per token, so batching saves less). An instrumented build's times
    are not judged: there compute is most of either way, and one request's lead was 0.8x-1.1x. So
    there the inputs are fewer and each way runs once: what remains is that both give the same
    vectors."""
    timed = not rsd.instrumented()
    n = N_BATCH if timed else N_BATCH // 8
    for shape in SHAPES:
        g = m[shape][0]
        for kind, fmt in (("short", "item %d"), ("longer", "the %d-th sentence of the batch, about something else")):
            inputs = [fmt % i for i in range(n)]
            c.call("embed", input=inputs[:4], model=g)  # loaded, warm
            t_one = t_each = float("inf")
            for _ in range(2 if timed else 1):
                t0 = time.monotonic()
                one = c.call("embed", input=inputs, model=g, timeout=300)
                t_one = min(t_one, time.monotonic() - t0)
                t0 = time.monotonic()
                each = [c.call("embed", input=x, model=g, timeout=60)["embeddings"][0] for x in inputs]
                t_each = min(t_each, time.monotonic() - t0)
            what = "%s, %d %s inputs (%d tokens)" % (shape, n, kind, one["usage"]["prompt_tokens"])
            print("%s: in one request %.3f s, in %d requests %.3f s (%.1fx)" % (what, t_one, n, t_each,
                                                                             t_each / t_one))
            if kind == "short" and timed:
                ck.ok(t_one < t_each, "%s: one request (%.3f s) costs less than %d requests (%.3f s)" %
                      (what, t_one, n, t_each))
            ck.ok(max_diff(vecs(one), each) < 1e-6, "%s: both give the same vectors" % what)


def check_cli(ck, d, m, ref):
    g = m["tiny-gemma3-embed"][0]
    cli = [rsd.tool("resident"), "--socket", d.sock, "embed"]
    p = subprocess.run(cli + ["-m", g] + TEXTS, capture_output=True, text=True, timeout=120)
    out = json.loads(p.stdout) if p.returncode == 0 else {}
    ck.ok(p.returncode == 0 and max_diff(out.get("embeddings", [[0]]), ref) < 1e-6,
          "resident embed TEXT...: the daemon's vectors as JSON (%s)" % p.stderr.strip())
    p = subprocess.run(cli + ["-m", g, "--dimensions", "32"], input="\n".join(TEXTS) + "\n\n", capture_output=True,
                       text=True, timeout=120)
    out = json.loads(p.stdout) if p.returncode == 0 else {}
    ck.ok(p.returncode == 0 and out.get("dimensions") == 32 and len(out.get("embeddings", [])) == len(TEXTS),
          "resident embed --dimensions 32 reads a text a line from stdin (%s)" % p.stderr.strip())
    fd = os.open(d.tmp, os.O_RDONLY)   # a directory: reading it fails
    try:
        p = subprocess.run(cli + ["-m", g], stdin=fd, capture_output=True, text=True, timeout=60)
    finally:
        os.close(fd)
    ck.ok(p.returncode == 2 and "reading standard input: Is a directory" in p.stderr,
          "resident embed: stdin that cannot be read: exit 2, saying why (%d %r)" % (p.returncode, p.stderr.strip()))
    p = subprocess.run(cli + ["-m", g], input="\n\n", capture_output=True, text=True, timeout=60)
    ck.ok(p.returncode == 2 and "no text" in p.stderr, "resident embed: stdin without text: exit 2, saying so (%d %r)" %
          (p.returncode, p.stderr.strip()))
    p = subprocess.run(cli + ["hello"], capture_output=True, text=True, timeout=60)
    ck.ok(p.returncode == 1 and "not an embedding model" in p.stderr,
          "resident embed on a model that is none: exit 1, saying so (%r)" % p.stderr.strip())


def check_python(ck, d, m, ref):
    g = m["tiny-gemma3-embed"][0]
    with resident.connect(d.sock) as rc:
        r = rc.embed(TEXTS, model=g)
        ck.ok(max_diff(r["embeddings"], ref) < 1e-6, "the Python package's embed")
        ck.eq(len(rc.embed("one text", model=g, dimensions=16)["embeddings"][0]), 16,
              "the Python package's embed of one string, dimensions 16")
        ck.raises(lambda: rc.embed(TEXTS), resident.InvalidParam, "the Python package: no embedding model")


def post(b, path, body):
    """(status, JSON body) of a POST to the bridge b (test_openai's Bridge) at path."""
    return post_text(b, path, json.dumps(body))


def post_text(b, path, text):
    """(status, JSON body) of a POST of the JSON text to the bridge b at path."""
    req = urllib.request.Request(base(b) + path, data=text.encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def post_reals(b, path, body):
    """The JSON body of a 200 POST to the bridge b, its reals kept as the text it printed."""
    req = urllib.request.Request(base(b) + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read(), parse_float=str)


def float32_text(texts, ref):
    """Whether each real's text has at most 9 significant digits and is ref's float32."""
    digits = [len(t.lstrip("-").split("e")[0].split("E")[0].replace(".", "").strip("0")) for t in texts]
    return len(texts) == len(ref) and max(digits) <= 9 and \
        bool(np.all(np.array([float(t) for t in texts], dtype=np.float32) == np.array(ref, dtype=np.float32)))


def base(b):
    """The bridge's address, without OpenAI's /v1."""
    return "http://127.0.0.1:%d" % b.port


def check_bridge(ck, c, d, m, ref):
    g = m["tiny-gemma3-embed"][0]
    name = c.call("embed", input="x", model=g)["model"]
    b = Bridge(d.sock)
    try:
        st, body = post(b, "/v1/embeddings", {"model": name, "input": TEXTS, "encoding_format": "float"})
        got = [x["embedding"] for x in body.get("data", [])] if st == 200 else [[0]]
        ck.ok(st == 200 and max_diff(got, ref) < 1e-6 and body["usage"]["prompt_tokens"] > 0 and
              body["object"] == "list" and body["model"] == name, "POST /v1/embeddings: %d %s" % (st, str(body)[:200]))
        body = post_reals(b, "/v1/embeddings", {"model": name, "input": TEXTS[:1], "encoding_format": "float"})
        ck.ok(float32_text(body["data"][0]["embedding"], ref[0]),
              "/v1/embeddings: each float in the 9 digits that give the daemon's float32 back")
        body = post_reals(b, "/api/embed", {"model": name, "input": TEXTS[1]})
        ck.ok(float32_text(body["embeddings"][0], ref[1]), "/api/embed: floats in 9 digits, the daemon's float32s")
        for path in ("/v1/embeddings", "/api/embed"):
            st, body = post_text(b, path, '{"model": "%s", "input": "x", "input": "y"}' % name)
            msg = str(body.get("error")) if isinstance(body, dict) else ""
            ck.ok(st == 400 and "duplicate" in msg and "at byte" in msg,
                  "%s: a body with a key twice is refused, saying where (%d %s)" % (path, st, msg[:200]))
        st, body = post(b, "/v1/embeddings", {"model": name, "input": [[1, 2, 3]]})
        ck.ok(st == 400 and body["error"]["param"] == "input", "token id inputs (OpenAI's tokenizer's) are refused")
        st, body = post(b, "/v1/embeddings", {"model": "no-such-model", "input": "x"})
        ck.eq(st, 404, "/v1/embeddings of a model residentd does not list")
        st, body = post(b, "/v1/embeddings", {"model": name, "input": "x", "dimensions": 999})
        ck.ok(st == 400 and "dimensions" in body["error"]["message"], "dimensions over the model's: 400")
        st, body = post(b, "/api/embed", {"model": name, "input": TEXTS, "keep_alive": "5m"})
        ck.ok(st == 200 and max_diff(body.get("embeddings", [[0]]), ref) < 1e-6 and body["prompt_eval_count"] > 0 and
              body["total_duration"] > 0 and "load_duration" in body, "POST /api/embed: %d %s" % (st, str(body)[:200]))
        st, body = post(b, "/api/embed", {"model": name, "input": "word " * 1100, "truncate": False})
        ck.ok(st == 400 and isinstance(body.get("error"), str), "/api/embed truncate false over the context: 400 "
              "with Ollama's error shape (%s)" % body)
        st, body = post(b, "/api/embed", {"model": name, "input": "word " * 1100})
        ck.ok(st == 200 and body["prompt_eval_count"] == 1024, "/api/embed cuts to the context by default")
        st, body = post(b, "/api/embeddings", {"model": name, "prompt": TEXTS[0]})
        ck.ok(st == 200 and max_diff(body.get("embedding", [0]), ref[0]) < 1e-6, "POST /api/embeddings (prompt)")
        # no input: Ollama loads the model and answers no vectors (its clients' way to load one ahead)
        loaded = lambda: next(m for m in c.call("model.list")["models"] if m["name"] == name)["loaded"]
        for path, empty, want in (("/api/embed", {"input": []}, {"model": name, "embeddings": []}),
                                  ("/api/embed", {"input": ""}, {"model": name, "embeddings": []}),
                                  ("/api/embeddings", {"prompt": ""}, {"embedding": []}),
                                  ("/api/embeddings", {}, {"embedding": []})):
            c.call("model.unload", model=name)
            st, body = post(b, path, dict(model=name, **empty))
            ck.ok((st, body, loaded()) == (200, want, True), "%s %s: the model loaded, no vectors: %d %s" %
                  (path, empty, st, body))
        check_ollama(ck, b, name, ref)
    finally:
        ck.eq(b.stop(), 0, "resident-http exits 0 on SIGTERM")


def check_openai(ck, b, name, ref):
    try:
        import openai
    except ImportError:
        print("SKIP part: the openai package is not installed")
        return
    oc = openai.OpenAI(base_url=base(b) + "/v1", api_key="none", max_retries=0, timeout=60)
    r = oc.embeddings.create(model=name, input=TEXTS)   # the package asks for base64 and decodes it
    ck.ok(max_diff([x.embedding for x in r.data], ref) < 1e-6 and r.usage.prompt_tokens > 0,
          "the openai package's embeddings.create (base64)")
    r = oc.embeddings.create(model=name, input=TEXTS[0], encoding_format="float", dimensions=64)
    ck.eq(len(r.data[0].embedding), 64, "the openai package: float, dimensions 64")
    ck.raises(lambda: oc.embeddings.create(model=name, input="x", dimensions=999), openai.BadRequestError,
              "the openai package: dimensions over the model's is a BadRequestError")


def check_ollama(ck, b, name, ref):
    try:
        import ollama
    except ImportError:
        print("SKIP part: the ollama package is not installed")
        return
    oc = ollama.Client(host=base(b))
    r = oc.embed(model=name, input=TEXTS)
    ck.ok(max_diff(r.embeddings, ref) < 1e-6 and r.prompt_eval_count > 0, "the ollama package's embed")
    r = oc.embed(model=name, input=TEXTS[0], dimensions=32, keep_alive=-1)
    ck.eq(len(r.embeddings[0]), 32, "the ollama package's embed, dimensions 32, keep_alive -1")
    r = oc.embeddings(model=name, prompt=TEXTS[0])
    ck.ok(max_diff(r.embedding, ref[0]) < 1e-6, "the ollama package's embeddings (the older route)")
    caps = oc.show(name).capabilities or []
    ck.ok("embedding" in caps and "completion" not in caps,
          "the ollama package's show: an embedding model's capabilities are embedding, not completion: %r" % caps)
    ck.raises(lambda: oc.embed(model=name, input="word " * 1100, truncate=False), ollama.ResponseError,
              "the ollama package: an input over the context with truncate false")


def main():
    if np is None:
        raise rsd.Skip("numpy is not installed")
    ck = Checks()
    tmp = tempfile.mkdtemp(prefix="rsd-embed-")
    m = models(tmp)
    with Daemon(extra=["--device", "cpu"], tmp=tmp) as d:
        c = d.client()
        ck.ok("embed" in c.call("hello")["capabilities"], "hello lists the capability embed")
        ref = None
        for shape in SHAPES:
            with ck.section(shape):
                ref = check_model(ck, c, shape, *m[shape])
        for name, part in (("context", lambda: check_context(ck, c, m)), ("errors", lambda: check_errors(ck, c, d, m)),
                           ("batching", lambda: check_batching(ck, c, m)),
                           ("cli", lambda: check_cli(ck, d, m, ref)), ("python", lambda: check_python(ck, d, m, ref)),
                           ("bridge", lambda: check_bridge(ck, c, d, m, ref))):
            with ck.section(name):
                part()
    return ck


if __name__ == "__main__":
    rsd.main(main)
