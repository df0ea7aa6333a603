#!/usr/bin/env python3
"""Renders the official chat templates in this directory with transformers'
own Jinja environment (render_jinja_template, what apply_chat_template uses)
and prints the expected outputs as C string literals for tests/unit/test_chat.c.

Usage: python3 render_expected.py > /tmp/expected.inc   (needs transformers, jinja2)

The templates, as their tokenizer_config.json "chat_template" values decode:
  llama3.jinja        meta-llama/Meta-Llama-3-8B-Instruct
  qwen2.5.jinja       Qwen/Qwen2.5-*-Instruct (ChatML, with a default system prompt)
  chatml.jinja        teknium/OpenHermes-2.5-Mistral-7B (plain ChatML)
  gemma3.jinja        google/gemma-3-*-it
  mistral-v0.3.jinja  mistralai/Mistral-7B-Instruct-v0.3 (Mistral's "v3" template)
  llama2.jinja        meta-llama/Llama-2-*-chat-hf

It also checks that every conversation test_chat.c expects chat_render to
refuse is refused by the real template too.
"""
import os
import sys

from transformers.utils.chat_template_utils import render_jinja_template

HERE = os.path.dirname(os.path.abspath(__file__))

SYS = {"role": "system", "content": "You are a helpful assistant."}
U1 = {"role": "user", "content": " Hello!\n"}
A1 = {"role": "assistant", "content": "  Hi there.\u00a0\u3000"}
U2 = {"role": "user", "content": "Who are you?"}

# name -> messages; the same lists are spelled out in test_chat.c.
CONVS = {
    "full": [SYS, U1, A1, U2],
    "nosys": [U1, A1, U2],
    "endasst": [SYS, U1, A1],
}

# family -> (template for conversations with a system message, without, bos, eos)
FAMILIES = {
    "LLAMA3": ("llama3.jinja", "llama3.jinja", "<|begin_of_text|>", "<|eot_id|>"),
    "CHATML": ("qwen2.5.jinja", "chatml.jinja", None, "<|im_end|>"),
    "GEMMA": ("gemma3.jinja", "gemma3.jinja", "<bos>", "<eos>"),
    "MISTRAL": ("mistral-v0.3.jinja", "mistral-v0.3.jinja", "<s>", "</s>"),
    "LLAMA2": ("llama2.jinja", "llama2.jinja", "<s>", "</s>"),
}

# Conversations the official templates of these families reject.
REJECTED = {
    "GEMMA": [[U1, U2], [A1, U1], [SYS, A1]],
    "MISTRAL": [[U1, U2], [A1, U1], [SYS, A1]],
    "LLAMA2": [[U1, U2], [A1, U1], [SYS, A1]],
}


def load(name):
    with open(os.path.join(HERE, name), encoding="utf-8") as f:
        return f.read()


def render(tmpl, msgs, gen, bos, eos):
    out, _ = render_jinja_template(conversations=[msgs], chat_template=tmpl,
                                   add_generation_prompt=gen, bos_token=bos,
                                   eos_token=eos)
    return out[0]


def c_literal(s):
    parts = []
    for b in s.encode("utf-8"):
        if b == 0x0A:
            parts.append("\\n")
        elif b in (0x22, 0x5C):
            parts.append("\\" + chr(b))
        elif 0x20 <= b < 0x7F:
            parts.append(chr(b))
        else:
            parts.append('\\x%02x""' % b)
    return '"' + "".join(parts) + '"'


def main():
    for fam, (with_sys, without_sys, bos, eos) in FAMILIES.items():
        for conv, msgs in CONVS.items():
            name = with_sys if msgs[0]["role"] == "system" else without_sys
            for gen in (0, 1):
                out = render(load(name), msgs, bool(gen), bos, eos)
                print("\t{ CHAT_%s, CONV_%s, %d,\n\t    %s }," %
                      (fam, conv.upper(), gen, c_literal(out)))
    for fam, convs in REJECTED.items():
        tmpl = load(FAMILIES[fam][0])
        for msgs in convs:
            try:
                render(tmpl, msgs, True, FAMILIES[fam][2], FAMILIES[fam][3])
            except Exception:
                continue
            sys.exit("%s accepted %r" % (fam, msgs))


if __name__ == "__main__":
    main()
