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
  qwen3.jinja         Qwen/Qwen3-0.6B, the template of the Qwen3 hybrid-thinking models
                      (Qwen3-30B-A3B...), as llama.cpp keeps it (models/templates)
  gpt-oss.jinja       openai/gpt-oss-120b and -20b (the "harmony" format), from llama.cpp's
                      models/templates; its strftime_now is pinned to DATE below
  mistral-v1.jinja    mistralai/Mixtral-8x7B-Instruct-v0.1 (Mistral's "v1" template, also
                      Mistral-7B-Instruct-v0.1/v0.2's), as llama.cpp's test-chat-template.cpp
                      holds it

It also checks that every conversation test_chat.c expects chat_render to
refuse is refused by the real template too, and that the one harmony
conversation it refuses although gpt-oss's template accepts it (a system
message after the first) is one the template silently drops.
"""
import os
import sys
from datetime import datetime

from transformers.utils.chat_template_utils import render_jinja_template

HERE = os.path.dirname(os.path.abspath(__file__))

SYS = {"role": "system", "content": "You are a helpful assistant."}
U1 = {"role": "user", "content": " Hello!\n"}
A1 = {"role": "assistant", "content": "  Hi there.\u00a0\u3000"}
U2 = {"role": "user", "content": "Who are you?"}

# Qwen3's history rules: reasoning is kept only after the last real user query.
A_T1 = {"role": "assistant", "content": "<think>\nLet me greet.\n</think>\n\nHi there."}
A_T2 = {"role": "assistant", "content": "\n<think>\n\nI am Qwen.\n\n</think>\n\n\nI am Qwen, an assistant."}
A_P = {"role": "assistant", "content": "\nPlain answer."}
U_TR = {"role": "user", "content": "<tool_response>\n42\n</tool_response>"}


def reasoned(content, reasoning):
    """An assistant turn with its reasoning apart (chat_msg.reasoning): Qwen3's
    template reads it as reasoning_content, gpt-oss's as thinking."""
    return {"role": "assistant", "content": content, "reasoning_content": reasoning, "thinking": reasoning}


# Reasoning given apart: the content is then all reply, even with a </think>.
A_R1 = reasoned("\nHi there.", "\nLet me greet.\n")
A_R2 = reasoned("I am Qwen.", "")
A_R3 = reasoned("Plain </think> answer.", "Tool said 42.")

# Tools (the same JSON text is TOOLS_JSON in test_chat.c): strings to escape, a non-ASCII
# character, a real, an enum, a default, an array and an optional parameter.
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather of a city, \"now\" or later.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "The city, as Zürich"},
            "days": {"type": "integer", "default": 1},
            "unit": {"type": "string", "enum": ["c", "f"]},
            "low": {"type": "number", "minimum": -40.5},
            "tags": {"type": "array", "items": {"type": "string"}}},
            "required": ["city"]}}},
    {"type": "function", "function": {"name": "now", "description": "The time.",
                                      "parameters": {"type": "object", "properties": {}}}},
]
# A call's arguments: a dict for the templates that tojson them, the JSON text for Qwen3's,
# which writes a string verbatim (test_chat.c passes this text).
ARGS_TEXT = '{"city":"Zürich","days":2,"low":-0.5}'
ARGS = {"city": "Zürich", "days": 2, "low": -0.5}


def calls(args, n=1, content=""):
    """An assistant turn with n calls (get_weather, then now), ids of 9 characters for Mistral's."""
    fns = [("call00001", "get_weather", args), ("call00002", "now", {} if isinstance(args, dict) else "{}")]
    return {"role": "assistant", "content": content, "tool_calls": [
        {"id": i, "type": "function", "function": {"name": f, "arguments": a}} for i, f, a in fns[:n]]}


UQ = {"role": "user", "content": "Weather in Zürich for two days?"}
T1 = {"role": "tool", "tool_call_id": "call00001", "name": "get_weather", "content": '{"temp": 21}'}
T2 = {"role": "tool", "tool_call_id": "call00002", "name": "now", "content": "12:00"}
A_FIN = {"role": "assistant", "content": "It is 21 degrees."}

# name -> messages; the same lists are spelled out in test_chat.c.
CONVS = {
    "full": [SYS, U1, A1, U2],
    "nosys": [U1, A1, U2],
    "endasst": [SYS, U1, A1],
}
# Conversations rendered by one family only.
CONVS_OF = {
    "QWEN3": {
        "think": [SYS, U1, A_T1, U2, A_T2],
        "toolresp": [U2, A_T1, U_TR, A_P, U_TR, A_T2],
        "reasoned": [SYS, U1, A_R1, U2, A_R2],
        "reasontool": [U2, A_R1, U_TR, A_R3],
    },
    "HARMONY": {
        "reasoned": [SYS, U1, A_R1, U2, A_R2],
        "reasonlast": [U1, A_R1, U2, A_R3],
    },
}
# Conversations with TOOLS, by family: a question, and a round trip of calls and results.
TOOL_CONVS_OF = {
    "CHATML": {"tools_ask": [SYS, UQ], "tools_round": [SYS, UQ, calls(ARGS, 2, "Checking."), T1, T2, A_FIN, U2]},
    "QWEN3": {"tools_ask": [SYS, UQ], "tools_nosys": [UQ],
              "tools_round": [SYS, UQ, calls(ARGS_TEXT, 2, "Checking."), T1, T2, A_FIN, U2],
              "tools_bare": [UQ, calls(ARGS_TEXT, 2), T1, T2]},
    "MISTRAL": {"tools_ask": [SYS, UQ], "tools_round": [SYS, UQ, calls(ARGS, 2), T1, T2, A_FIN, U2]},
    "HARMONY": {"tools_ask": [SYS, UQ], "tools_nosys": [UQ],
                "tools_round": [SYS, UQ, calls(ARGS, 1), T1, A_FIN, U2],
                "tools_bare": [UQ, calls(ARGS, 1, "I should look."), T1]},
}

# The date harmony's system message carries (test_chat.c passes the same).
DATE = datetime(2025, 8, 5)

# family -> (template for conversations with a system message, without, bos, eos)
FAMILIES = {
    "LLAMA3": ("llama3.jinja", "llama3.jinja", "<|begin_of_text|>", "<|eot_id|>"),
    "CHATML": ("qwen2.5.jinja", "chatml.jinja", None, "<|im_end|>"),
    "GEMMA": ("gemma3.jinja", "gemma3.jinja", "<bos>", "<eos>"),
    "MISTRAL": ("mistral-v0.3.jinja", "mistral-v0.3.jinja", "<s>", "</s>"),
    "LLAMA2": ("llama2.jinja", "llama2.jinja", "<s>", "</s>"),
    "QWEN3": ("qwen3.jinja", "qwen3.jinja", None, "<|im_end|>"),
    "HARMONY": ("gpt-oss.jinja", "gpt-oss.jinja", "<|startoftext|>", "<|return|>"),
    "MISTRAL_V1": ("mistral-v1.jinja", "mistral-v1.jinja", "<s>", "</s>"),
}

# Generation prompts with options (test_chat.c's GEN_* code), as template variables.
OPTIONS = {
    "QWEN3": [("GEN_NO_THINK", {"enable_thinking": False})],
    "HARMONY": [("GEN_EFFORT_LOW", {"reasoning_effort": "low"}), ("GEN_EFFORT_HIGH", {"reasoning_effort": "high"})],
}

# Conversations the official templates of these families reject.
REJECTED = {
    "GEMMA": [[U1, U2], [A1, U1], [SYS, A1]],
    "MISTRAL": [[U1, U2], [A1, U1], [SYS, A1]],
    "LLAMA2": [[U1, U2], [A1, U1], [SYS, A1]],
    "MISTRAL_V1": [[U1, U2], [A1, U1], [SYS, A1], [U1, A1, SYS]],
    "HARMONY": [[U1, {"role": "assistant", "content": "<|channel|>analysis<|message|>x"}],
                [U1, {"role": "assistant", "content": "a<|channel|>final<|message|>b"}],
                [U1, reasoned("b", "a<|channel|>final<|message|>b")]],
}


def load(name):
    with open(os.path.join(HERE, name), encoding="utf-8") as f:
        return f.read()


def render(tmpl, msgs, gen, bos, eos, **kw):
    out, _ = render_jinja_template(conversations=[msgs], chat_template=tmpl,
                                   add_generation_prompt=gen, bos_token=bos,
                                   eos_token=eos, strftime_now=DATE.strftime, **kw)
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
        for conv, msgs in {**CONVS, **CONVS_OF.get(fam, {})}.items():
            name = with_sys if msgs[0]["role"] == "system" else without_sys
            for gen in (0, 1):
                out = render(load(name), msgs, bool(gen), bos, eos)
                print("\t{ CHAT_%s, CONV_%s, %d,\n\t    %s }," %
                      (fam, conv.upper(), gen, c_literal(out)))
                for code, kw in OPTIONS.get(fam, []) if gen else []:
                    out = render(load(name), msgs, True, bos, eos, **kw)
                    print("\t{ CHAT_%s, CONV_%s, %s,\n\t    %s }," %
                          (fam, conv.upper(), code, c_literal(out)))
    for fam, convs in TOOL_CONVS_OF.items():
        tmpl = load(FAMILIES[fam][0])
        for conv, msgs in convs.items():
            for gen in (0, 1):
                out = render(tmpl, msgs, bool(gen), FAMILIES[fam][2], FAMILIES[fam][3], tools=TOOLS)
                print("\t{ CHAT_%s, CONV_%s, %d,\n\t    %s }," % (fam, conv.upper(), gen, c_literal(out)))
    for fam, convs in REJECTED.items():
        tmpl = load(FAMILIES[fam][0])
        for msgs in convs:
            try:
                render(tmpl, msgs, True, FAMILIES[fam][2], FAMILIES[fam][3])
            except Exception:
                continue
            sys.exit("%s accepted %r" % (fam, msgs))
    late = [U1, A1, SYS, U2]
    gpt_oss = load(FAMILIES["HARMONY"][0])
    if render(gpt_oss, late, True, None, None) != render(gpt_oss, late[:2] + late[3:], True, None, None):
        sys.exit("HARMONY does not drop a late system message")


if __name__ == "__main__":
    main()
