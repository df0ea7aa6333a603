/*
 * test_chat.c: chat template detection and rendering.
 *
 * The expected prompts below were not written by hand: they are the output
 * of tests/data/chat_templates/render_expected.py, which renders the
 * official templates stored next to it (Meta-Llama-3-8B-Instruct,
 * Qwen2.5-Instruct and OpenHermes-2.5 ChatML, gemma-3-it,
 * Mistral-7B-Instruct-v0.3, Llama-2-chat, Qwen3, gpt-oss,
 * Mixtral-8x7B-Instruct-v0.1) with transformers' own Jinja environment
 * (render_jinja_template, as apply_chat_template; transformers 5.17,
 * jinja2 3.1.6), gpt-oss's with its strftime_now pinned to TEST_DATE. The
 * conversations exercise what the templates differ on: where the system
 * text goes, which contents are stripped (with Unicode whitespace, as
 * Python's str.strip), what ends with an assistant turn, and for Qwen3
 * which assistant turns keep their reasoning.
 *
 * The detection tests read those template files from
 * $RESIDENT_SRCDIR/tests/data/chat_templates (make check sets
 * RESIDENT_SRCDIR); without it they are skipped.
 */
#include "config.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "chat.h"
#include "chat_tools.h"
#include "util.h"
#include "chat_convs.h"

/* The conversations of render_expected.py (U+00A0 and U+3000 end the assistant turn). */
static const struct chat_msg conv_full[] = {
	{ "system", "You are a helpful assistant.", NULL, NULL, 0, NULL, NULL },
	{ "user", " Hello!\n", NULL, NULL, 0, NULL, NULL },
	{ "assistant", "  Hi there.\xc2\xa0\xe3\x80\x80", NULL, NULL, 0, NULL, NULL },
	{ "user", "Who are you?", NULL, NULL, 0, NULL, NULL },
};
static const struct chat_msg *const conv_nosys = conv_full + 1;

/* Qwen3's history: reasoning is kept only after the last user query, and a tool response is none. */
#define A_T1 { "assistant", "<think>\nLet me greet.\n</think>\n\nHi there.", NULL, NULL, 0, NULL, NULL }
#define A_T2 { "assistant", "\n<think>\n\nI am Qwen.\n\n</think>\n\n\nI am Qwen, an assistant.", NULL, NULL, 0, NULL, NULL }
#define U_TR { "user", "<tool_response>\n42\n</tool_response>", NULL, NULL, 0, NULL, NULL }
static const struct chat_msg conv_think[] = {
	{ "system", "You are a helpful assistant.", NULL, NULL, 0, NULL, NULL }, { "user", " Hello!\n", NULL, NULL, 0, NULL, NULL }, A_T1,
	{ "user", "Who are you?", NULL, NULL, 0, NULL, NULL }, A_T2,
};
static const struct chat_msg conv_toolresp[] = {
	{ "user", "Who are you?", NULL, NULL, 0, NULL, NULL }, A_T1, U_TR, { "assistant", "\nPlain answer.", NULL, NULL, 0, NULL, NULL }, U_TR, A_T2,
};

/* Reasoning given apart (Qwen3's reasoning_content, harmony's thinking): the content is all reply. */
#define A_R1 { "assistant", "\nHi there.", "\nLet me greet.\n", NULL, 0, NULL, NULL }
#define A_R2 { "assistant", "I am Qwen.", "", NULL, 0, NULL, NULL }
#define A_R3 { "assistant", "Plain </think> answer.", "Tool said 42.", NULL, 0, NULL, NULL }
static const struct chat_msg conv_reasoned[] = {
	{ "system", "You are a helpful assistant.", NULL, NULL, 0, NULL, NULL }, { "user", " Hello!\n", NULL, NULL, 0, NULL, NULL }, A_R1,
	{ "user", "Who are you?", NULL, NULL, 0, NULL, NULL }, A_R2,
};
static const struct chat_msg conv_reasontool[] = { { "user", "Who are you?", NULL, NULL, 0, NULL, NULL }, A_R1, U_TR, A_R3 };
static const struct chat_msg conv_reasonlast[] = {
	{ "user", " Hello!\n", NULL, NULL, 0, NULL, NULL }, A_R1, { "user", "Who are you?", NULL, NULL, 0, NULL, NULL }, A_R3,
};

/* render_expected.py's TOOLS, as JSON text (chat_tools_check writes it as chat_opts.tools wants). */
static const char TOOLS_JSON[] = "[{\"type\":\"function\",\"function\":" TOOL_WEATHER_FN "}," TOOL_NOW "]";

static const struct chat_msg conv_tools_ask[] = { SYS_M, U_Q };
static const struct chat_msg conv_tools_round[] = {
	SYS_M, U_Q, { "assistant", "Checking.", NULL, calls2, 2, NULL, NULL }, T_1, T_2, A_FIN, U_2,
};
/* Mistral's and harmony's rounds: no content beside the calls; harmony's, one call. */
static const struct chat_msg conv_tools_round2[] = {
	SYS_M, U_Q, { "assistant", "", NULL, calls2, 2, NULL, NULL }, T_1, T_2, A_FIN, U_2,
};
static const struct chat_msg conv_tools_round1[] = {
	SYS_M, U_Q, { "assistant", "", NULL, calls2, 1, NULL, NULL }, T_1, A_FIN, U_2,
};
static const struct chat_msg conv_tools_bare2[] = { U_Q, { "assistant", "", NULL, calls2, 2, NULL, NULL }, T_1, T_2 };
static const struct chat_msg conv_tools_bare1[] = { U_Q, { "assistant", "I should look.", NULL, calls2, 1, NULL, NULL },
	T_1 };

/* The date render_expected.py pins gpt-oss's strftime_now to. */
#define TEST_DATE "2025-08-05"

enum conv { CONV_FULL, CONV_NOSYS, CONV_ENDASST, CONV_THINK, CONV_TOOLRESP, CONV_REASONED, CONV_REASONTOOL,
	CONV_REASONLAST, CONV_TOOLS_ASK, CONV_TOOLS_NOSYS, CONV_TOOLS_ROUND, CONV_TOOLS_BARE };

/* Whether a conversation is rendered with TOOLS_JSON. */
static int
conv_has_tools(enum conv c)
{
	return c >= CONV_TOOLS_ASK;
}

/* The messages and count of a conversation, as family t's expectations have them. */
static const struct chat_msg *
conv_msgs(enum chat_tmpl t, enum conv c, size_t *n)
{
	switch (c) {
	case CONV_TOOLS_ASK:
		*n = 2;
		return conv_tools_ask;
	case CONV_TOOLS_NOSYS:
		*n = 1;
		return conv_tools_ask + 1;
	case CONV_TOOLS_ROUND:
		*n = t == CHAT_HARMONY ? ARRAY_LEN(conv_tools_round1) : ARRAY_LEN(conv_tools_round);
		return t == CHAT_HARMONY ? conv_tools_round1 : t == CHAT_MISTRAL ? conv_tools_round2 : conv_tools_round;
	case CONV_TOOLS_BARE:
		*n = t == CHAT_HARMONY ? ARRAY_LEN(conv_tools_bare1) : ARRAY_LEN(conv_tools_bare2);
		return t == CHAT_HARMONY ? conv_tools_bare1 : conv_tools_bare2;
	case CONV_FULL:
		*n = 4;
		return conv_full;
	case CONV_NOSYS:
		*n = 3;
		return conv_nosys;
	case CONV_ENDASST:
		*n = 3;
		return conv_full;
	case CONV_THINK:
		*n = ARRAY_LEN(conv_think);
		return conv_think;
	case CONV_TOOLRESP:
		*n = ARRAY_LEN(conv_toolresp);
		return conv_toolresp;
	case CONV_REASONED:
		*n = ARRAY_LEN(conv_reasoned);
		return conv_reasoned;
	case CONV_REASONTOOL:
		*n = ARRAY_LEN(conv_reasontool);
		return conv_reasontool;
	case CONV_REASONLAST:
		*n = ARRAY_LEN(conv_reasonlast);
		return conv_reasonlast;
	}
	*n = 0;
	return NULL;
}

/*
 * The generation prompt of an expected rendering: 0, 1, or with Qwen3's
 * enable_thinking=false, gpt-oss's reasoning_effort low or high.
 */
enum { GEN_NO_THINK = 2, GEN_EFFORT_LOW, GEN_EFFORT_HIGH };

struct expected {
	enum chat_tmpl t;
	enum conv conv;
	int gen;
	const char *text;
};

/* Generated by tests/data/chat_templates/render_expected.py. */
static const struct expected expected[] = {
	{ CHAT_LLAMA3, CONV_FULL, 0,
	    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHi there.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWho are you?<|eot_id|>" },
	{ CHAT_LLAMA3, CONV_FULL, 1,
	    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHi there.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWho are you?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n" },
	{ CHAT_LLAMA3, CONV_NOSYS, 0,
	    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHi there.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWho are you?<|eot_id|>" },
	{ CHAT_LLAMA3, CONV_NOSYS, 1,
	    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHi there.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWho are you?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n" },
	{ CHAT_LLAMA3, CONV_ENDASST, 0,
	    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHi there.<|eot_id|>" },
	{ CHAT_LLAMA3, CONV_ENDASST, 1,
	    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHi there.<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n" },
	{ CHAT_CHATML, CONV_FULL, 0,
	    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n Hello!\n<|im_end|>\n<|im_start|>assistant\n  Hi there.\xc2""\xa0""\xe3""\x80""\x80""<|im_end|>\n<|im_start|>user\nWho are you?<|im_end|>\n" },
	{ CHAT_CHATML, CONV_FULL, 1,
	    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n Hello!\n<|im_end|>\n<|im_start|>assistant\n  Hi there.\xc2""\xa0""\xe3""\x80""\x80""<|im_end|>\n<|im_start|>user\nWho are you?<|im_end|>\n<|im_start|>assistant\n" },
	{ CHAT_CHATML, CONV_NOSYS, 0,
	    "<|im_start|>user\n Hello!\n<|im_end|>\n<|im_start|>assistant\n  Hi there.\xc2""\xa0""\xe3""\x80""\x80""<|im_end|>\n<|im_start|>user\nWho are you?<|im_end|>\n" },
	{ CHAT_CHATML, CONV_NOSYS, 1,
	    "<|im_start|>user\n Hello!\n<|im_end|>\n<|im_start|>assistant\n  Hi there.\xc2""\xa0""\xe3""\x80""\x80""<|im_end|>\n<|im_start|>user\nWho are you?<|im_end|>\n<|im_start|>assistant\n" },
	{ CHAT_CHATML, CONV_ENDASST, 0,
	    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n Hello!\n<|im_end|>\n<|im_start|>assistant\n  Hi there.\xc2""\xa0""\xe3""\x80""\x80""<|im_end|>\n" },
	{ CHAT_CHATML, CONV_ENDASST, 1,
	    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n Hello!\n<|im_end|>\n<|im_start|>assistant\n  Hi there.\xc2""\xa0""\xe3""\x80""\x80""<|im_end|>\n<|im_start|>assistant\n" },
	{ CHAT_GEMMA, CONV_FULL, 0,
	    "<bos><start_of_turn>user\nYou are a helpful assistant.\n\nHello!<end_of_turn>\n<start_of_turn>model\nHi there.<end_of_turn>\n<start_of_turn>user\nWho are you?<end_of_turn>\n" },
	{ CHAT_GEMMA, CONV_FULL, 1,
	    "<bos><start_of_turn>user\nYou are a helpful assistant.\n\nHello!<end_of_turn>\n<start_of_turn>model\nHi there.<end_of_turn>\n<start_of_turn>user\nWho are you?<end_of_turn>\n<start_of_turn>model\n" },
	{ CHAT_GEMMA, CONV_NOSYS, 0,
	    "<bos><start_of_turn>user\nHello!<end_of_turn>\n<start_of_turn>model\nHi there.<end_of_turn>\n<start_of_turn>user\nWho are you?<end_of_turn>\n" },
	{ CHAT_GEMMA, CONV_NOSYS, 1,
	    "<bos><start_of_turn>user\nHello!<end_of_turn>\n<start_of_turn>model\nHi there.<end_of_turn>\n<start_of_turn>user\nWho are you?<end_of_turn>\n<start_of_turn>model\n" },
	{ CHAT_GEMMA, CONV_ENDASST, 0,
	    "<bos><start_of_turn>user\nYou are a helpful assistant.\n\nHello!<end_of_turn>\n<start_of_turn>model\nHi there.<end_of_turn>\n" },
	{ CHAT_GEMMA, CONV_ENDASST, 1,
	    "<bos><start_of_turn>user\nYou are a helpful assistant.\n\nHello!<end_of_turn>\n<start_of_turn>model\nHi there.<end_of_turn>\n<start_of_turn>model\n" },
	{ CHAT_MISTRAL, CONV_FULL, 0,
	    "<s>[INST]  Hello!\n[/INST] Hi there.</s>[INST] You are a helpful assistant.\n\nWho are you?[/INST]" },
	{ CHAT_MISTRAL, CONV_FULL, 1,
	    "<s>[INST]  Hello!\n[/INST] Hi there.</s>[INST] You are a helpful assistant.\n\nWho are you?[/INST]" },
	{ CHAT_MISTRAL, CONV_NOSYS, 0,
	    "<s>[INST]  Hello!\n[/INST] Hi there.</s>[INST] Who are you?[/INST]" },
	{ CHAT_MISTRAL, CONV_NOSYS, 1,
	    "<s>[INST]  Hello!\n[/INST] Hi there.</s>[INST] Who are you?[/INST]" },
	{ CHAT_MISTRAL, CONV_ENDASST, 0,
	    "<s>[INST]  Hello!\n[/INST] Hi there.</s>" },
	{ CHAT_MISTRAL, CONV_ENDASST, 1,
	    "<s>[INST]  Hello!\n[/INST] Hi there.</s>" },
	{ CHAT_LLAMA2, CONV_FULL, 0,
	    "<s>[INST] <<SYS>>\nYou are a helpful assistant.\n<</SYS>>\n\n Hello! [/INST] Hi there. </s><s>[INST] Who are you? [/INST]" },
	{ CHAT_LLAMA2, CONV_FULL, 1,
	    "<s>[INST] <<SYS>>\nYou are a helpful assistant.\n<</SYS>>\n\n Hello! [/INST] Hi there. </s><s>[INST] Who are you? [/INST]" },
	{ CHAT_LLAMA2, CONV_NOSYS, 0,
	    "<s>[INST] Hello! [/INST] Hi there. </s><s>[INST] Who are you? [/INST]" },
	{ CHAT_LLAMA2, CONV_NOSYS, 1,
	    "<s>[INST] Hello! [/INST] Hi there. </s><s>[INST] Who are you? [/INST]" },
	{ CHAT_LLAMA2, CONV_ENDASST, 0,
	    "<s>[INST] <<SYS>>\nYou are a helpful assistant.\n<</SYS>>\n\n Hello! [/INST] Hi there. </s>" },
	{ CHAT_LLAMA2, CONV_ENDASST, 1,
	    "<s>[INST] <<SYS>>\nYou are a helpful assistant.\n<</SYS>>\n\n Hello! [/INST] Hi there. </s>" },
	{ CHAT_QWEN3, CONV_FULL, 0,
	    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n Hello!\n<|im_end|>\n<|im_start|>assistant\n  Hi there.\xc2""\xa0""\xe3""\x80""\x80""<|im_end|>\n<|im_start|>user\nWho are you?<|im_end|>\n" },
	{ CHAT_QWEN3, CONV_FULL, 1,
	    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n Hello!\n<|im_end|>\n<|im_start|>assistant\n  Hi there.\xc2""\xa0""\xe3""\x80""\x80""<|im_end|>\n<|im_start|>user\nWho are you?<|im_end|>\n<|im_start|>assistant\n" },
	{ CHAT_QWEN3, CONV_FULL, GEN_NO_THINK,
	    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n Hello!\n<|im_end|>\n<|im_start|>assistant\n  Hi there.\xc2""\xa0""\xe3""\x80""\x80""<|im_end|>\n<|im_start|>user\nWho are you?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n" },
	{ CHAT_QWEN3, CONV_NOSYS, 0,
	    "<|im_start|>user\n Hello!\n<|im_end|>\n<|im_start|>assistant\n  Hi there.\xc2""\xa0""\xe3""\x80""\x80""<|im_end|>\n<|im_start|>user\nWho are you?<|im_end|>\n" },
	{ CHAT_QWEN3, CONV_NOSYS, 1,
	    "<|im_start|>user\n Hello!\n<|im_end|>\n<|im_start|>assistant\n  Hi there.\xc2""\xa0""\xe3""\x80""\x80""<|im_end|>\n<|im_start|>user\nWho are you?<|im_end|>\n<|im_start|>assistant\n" },
	{ CHAT_QWEN3, CONV_NOSYS, GEN_NO_THINK,
	    "<|im_start|>user\n Hello!\n<|im_end|>\n<|im_start|>assistant\n  Hi there.\xc2""\xa0""\xe3""\x80""\x80""<|im_end|>\n<|im_start|>user\nWho are you?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n" },
	{ CHAT_QWEN3, CONV_ENDASST, 0,
	    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n Hello!\n<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n  Hi there.\xc2""\xa0""\xe3""\x80""\x80""<|im_end|>\n" },
	{ CHAT_QWEN3, CONV_ENDASST, 1,
	    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n Hello!\n<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n  Hi there.\xc2""\xa0""\xe3""\x80""\x80""<|im_end|>\n<|im_start|>assistant\n" },
	{ CHAT_QWEN3, CONV_ENDASST, GEN_NO_THINK,
	    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n Hello!\n<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n  Hi there.\xc2""\xa0""\xe3""\x80""\x80""<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n" },
	{ CHAT_QWEN3, CONV_THINK, 0,
	    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n Hello!\n<|im_end|>\n<|im_start|>assistant\nHi there.<|im_end|>\n<|im_start|>user\nWho are you?<|im_end|>\n<|im_start|>assistant\n<think>\nI am Qwen.\n</think>\n\nI am Qwen, an assistant.<|im_end|>\n" },
	{ CHAT_QWEN3, CONV_THINK, 1,
	    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n Hello!\n<|im_end|>\n<|im_start|>assistant\nHi there.<|im_end|>\n<|im_start|>user\nWho are you?<|im_end|>\n<|im_start|>assistant\n<think>\nI am Qwen.\n</think>\n\nI am Qwen, an assistant.<|im_end|>\n<|im_start|>assistant\n" },
	{ CHAT_QWEN3, CONV_THINK, GEN_NO_THINK,
	    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n Hello!\n<|im_end|>\n<|im_start|>assistant\nHi there.<|im_end|>\n<|im_start|>user\nWho are you?<|im_end|>\n<|im_start|>assistant\n<think>\nI am Qwen.\n</think>\n\nI am Qwen, an assistant.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n" },
	{ CHAT_QWEN3, CONV_TOOLRESP, 0,
	    "<|im_start|>user\nWho are you?<|im_end|>\n<|im_start|>assistant\n<think>\nLet me greet.\n</think>\n\nHi there.<|im_end|>\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n\nPlain answer.<|im_end|>\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\nI am Qwen.\n</think>\n\nI am Qwen, an assistant.<|im_end|>\n" },
	{ CHAT_QWEN3, CONV_TOOLRESP, 1,
	    "<|im_start|>user\nWho are you?<|im_end|>\n<|im_start|>assistant\n<think>\nLet me greet.\n</think>\n\nHi there.<|im_end|>\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n\nPlain answer.<|im_end|>\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\nI am Qwen.\n</think>\n\nI am Qwen, an assistant.<|im_end|>\n<|im_start|>assistant\n" },
	{ CHAT_QWEN3, CONV_TOOLRESP, GEN_NO_THINK,
	    "<|im_start|>user\nWho are you?<|im_end|>\n<|im_start|>assistant\n<think>\nLet me greet.\n</think>\n\nHi there.<|im_end|>\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n\nPlain answer.<|im_end|>\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\nI am Qwen.\n</think>\n\nI am Qwen, an assistant.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n" },
	{ CHAT_QWEN3, CONV_REASONED, 0,
	    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n Hello!\n<|im_end|>\n<|im_start|>assistant\n\nHi there.<|im_end|>\n<|im_start|>user\nWho are you?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nI am Qwen.<|im_end|>\n" },
	{ CHAT_QWEN3, CONV_REASONED, 1,
	    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n Hello!\n<|im_end|>\n<|im_start|>assistant\n\nHi there.<|im_end|>\n<|im_start|>user\nWho are you?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nI am Qwen.<|im_end|>\n<|im_start|>assistant\n" },
	{ CHAT_QWEN3, CONV_REASONED, GEN_NO_THINK,
	    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n Hello!\n<|im_end|>\n<|im_start|>assistant\n\nHi there.<|im_end|>\n<|im_start|>user\nWho are you?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nI am Qwen.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n" },
	{ CHAT_QWEN3, CONV_REASONTOOL, 0,
	    "<|im_start|>user\nWho are you?<|im_end|>\n<|im_start|>assistant\n<think>\nLet me greet.\n</think>\n\nHi there.<|im_end|>\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\nTool said 42.\n</think>\n\nPlain </think> answer.<|im_end|>\n" },
	{ CHAT_QWEN3, CONV_REASONTOOL, 1,
	    "<|im_start|>user\nWho are you?<|im_end|>\n<|im_start|>assistant\n<think>\nLet me greet.\n</think>\n\nHi there.<|im_end|>\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\nTool said 42.\n</think>\n\nPlain </think> answer.<|im_end|>\n<|im_start|>assistant\n" },
	{ CHAT_QWEN3, CONV_REASONTOOL, GEN_NO_THINK,
	    "<|im_start|>user\nWho are you?<|im_end|>\n<|im_start|>assistant\n<think>\nLet me greet.\n</think>\n\nHi there.<|im_end|>\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\nTool said 42.\n</think>\n\nPlain </think> answer.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n" },
	{ CHAT_HARMONY, CONV_FULL, 0,
	    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: 2025-08-05\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|><|start|>developer<|message|># Instructions\n\nYou are a helpful assistant.\n\n<|end|><|start|>user<|message|> Hello!\n<|end|><|start|>assistant<|channel|>final<|message|>  Hi there.\xc2""\xa0""\xe3""\x80""\x80""<|end|><|start|>user<|message|>Who are you?<|end|>" },
	{ CHAT_HARMONY, CONV_FULL, 1,
	    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: 2025-08-05\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|><|start|>developer<|message|># Instructions\n\nYou are a helpful assistant.\n\n<|end|><|start|>user<|message|> Hello!\n<|end|><|start|>assistant<|channel|>final<|message|>  Hi there.\xc2""\xa0""\xe3""\x80""\x80""<|end|><|start|>user<|message|>Who are you?<|end|><|start|>assistant" },
	{ CHAT_HARMONY, CONV_FULL, GEN_EFFORT_LOW,
	    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: 2025-08-05\n\nReasoning: low\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|><|start|>developer<|message|># Instructions\n\nYou are a helpful assistant.\n\n<|end|><|start|>user<|message|> Hello!\n<|end|><|start|>assistant<|channel|>final<|message|>  Hi there.\xc2""\xa0""\xe3""\x80""\x80""<|end|><|start|>user<|message|>Who are you?<|end|><|start|>assistant" },
	{ CHAT_HARMONY, CONV_FULL, GEN_EFFORT_HIGH,
	    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: 2025-08-05\n\nReasoning: high\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|><|start|>developer<|message|># Instructions\n\nYou are a helpful assistant.\n\n<|end|><|start|>user<|message|> Hello!\n<|end|><|start|>assistant<|channel|>final<|message|>  Hi there.\xc2""\xa0""\xe3""\x80""\x80""<|end|><|start|>user<|message|>Who are you?<|end|><|start|>assistant" },
	{ CHAT_HARMONY, CONV_NOSYS, 0,
	    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: 2025-08-05\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|><|start|>user<|message|> Hello!\n<|end|><|start|>assistant<|channel|>final<|message|>  Hi there.\xc2""\xa0""\xe3""\x80""\x80""<|end|><|start|>user<|message|>Who are you?<|end|>" },
	{ CHAT_HARMONY, CONV_NOSYS, 1,
	    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: 2025-08-05\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|><|start|>user<|message|> Hello!\n<|end|><|start|>assistant<|channel|>final<|message|>  Hi there.\xc2""\xa0""\xe3""\x80""\x80""<|end|><|start|>user<|message|>Who are you?<|end|><|start|>assistant" },
	{ CHAT_HARMONY, CONV_NOSYS, GEN_EFFORT_LOW,
	    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: 2025-08-05\n\nReasoning: low\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|><|start|>user<|message|> Hello!\n<|end|><|start|>assistant<|channel|>final<|message|>  Hi there.\xc2""\xa0""\xe3""\x80""\x80""<|end|><|start|>user<|message|>Who are you?<|end|><|start|>assistant" },
	{ CHAT_HARMONY, CONV_NOSYS, GEN_EFFORT_HIGH,
	    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: 2025-08-05\n\nReasoning: high\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|><|start|>user<|message|> Hello!\n<|end|><|start|>assistant<|channel|>final<|message|>  Hi there.\xc2""\xa0""\xe3""\x80""\x80""<|end|><|start|>user<|message|>Who are you?<|end|><|start|>assistant" },
	{ CHAT_HARMONY, CONV_ENDASST, 0,
	    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: 2025-08-05\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|><|start|>developer<|message|># Instructions\n\nYou are a helpful assistant.\n\n<|end|><|start|>user<|message|> Hello!\n<|end|><|start|>assistant<|channel|>final<|message|>  Hi there.\xc2""\xa0""\xe3""\x80""\x80""<|return|>" },
	{ CHAT_HARMONY, CONV_ENDASST, 1,
	    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: 2025-08-05\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|><|start|>developer<|message|># Instructions\n\nYou are a helpful assistant.\n\n<|end|><|start|>user<|message|> Hello!\n<|end|><|start|>assistant<|channel|>final<|message|>  Hi there.\xc2""\xa0""\xe3""\x80""\x80""<|end|><|start|>assistant" },
	{ CHAT_HARMONY, CONV_ENDASST, GEN_EFFORT_LOW,
	    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: 2025-08-05\n\nReasoning: low\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|><|start|>developer<|message|># Instructions\n\nYou are a helpful assistant.\n\n<|end|><|start|>user<|message|> Hello!\n<|end|><|start|>assistant<|channel|>final<|message|>  Hi there.\xc2""\xa0""\xe3""\x80""\x80""<|end|><|start|>assistant" },
	{ CHAT_HARMONY, CONV_ENDASST, GEN_EFFORT_HIGH,
	    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: 2025-08-05\n\nReasoning: high\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|><|start|>developer<|message|># Instructions\n\nYou are a helpful assistant.\n\n<|end|><|start|>user<|message|> Hello!\n<|end|><|start|>assistant<|channel|>final<|message|>  Hi there.\xc2""\xa0""\xe3""\x80""\x80""<|end|><|start|>assistant" },
	{ CHAT_HARMONY, CONV_REASONED, 0,
	    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: 2025-08-05\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|><|start|>developer<|message|># Instructions\n\nYou are a helpful assistant.\n\n<|end|><|start|>user<|message|> Hello!\n<|end|><|start|>assistant<|channel|>final<|message|>\nHi there.<|end|><|start|>user<|message|>Who are you?<|end|><|start|>assistant<|channel|>analysis<|message|><|end|><|start|>assistant<|channel|>final<|message|>I am Qwen.<|return|>" },
	{ CHAT_HARMONY, CONV_REASONED, 1,
	    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: 2025-08-05\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|><|start|>developer<|message|># Instructions\n\nYou are a helpful assistant.\n\n<|end|><|start|>user<|message|> Hello!\n<|end|><|start|>assistant<|channel|>final<|message|>\nHi there.<|end|><|start|>user<|message|>Who are you?<|end|><|start|>assistant<|channel|>final<|message|>I am Qwen.<|end|><|start|>assistant" },
	{ CHAT_HARMONY, CONV_REASONED, GEN_EFFORT_LOW,
	    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: 2025-08-05\n\nReasoning: low\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|><|start|>developer<|message|># Instructions\n\nYou are a helpful assistant.\n\n<|end|><|start|>user<|message|> Hello!\n<|end|><|start|>assistant<|channel|>final<|message|>\nHi there.<|end|><|start|>user<|message|>Who are you?<|end|><|start|>assistant<|channel|>final<|message|>I am Qwen.<|end|><|start|>assistant" },
	{ CHAT_HARMONY, CONV_REASONED, GEN_EFFORT_HIGH,
	    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: 2025-08-05\n\nReasoning: high\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|><|start|>developer<|message|># Instructions\n\nYou are a helpful assistant.\n\n<|end|><|start|>user<|message|> Hello!\n<|end|><|start|>assistant<|channel|>final<|message|>\nHi there.<|end|><|start|>user<|message|>Who are you?<|end|><|start|>assistant<|channel|>final<|message|>I am Qwen.<|end|><|start|>assistant" },
	{ CHAT_HARMONY, CONV_REASONLAST, 0,
	    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: 2025-08-05\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|><|start|>user<|message|> Hello!\n<|end|><|start|>assistant<|channel|>final<|message|>\nHi there.<|end|><|start|>user<|message|>Who are you?<|end|><|start|>assistant<|channel|>analysis<|message|>Tool said 42.<|end|><|start|>assistant<|channel|>final<|message|>Plain </think> answer.<|return|>" },
	{ CHAT_HARMONY, CONV_REASONLAST, 1,
	    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: 2025-08-05\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|><|start|>user<|message|> Hello!\n<|end|><|start|>assistant<|channel|>final<|message|>\nHi there.<|end|><|start|>user<|message|>Who are you?<|end|><|start|>assistant<|channel|>final<|message|>Plain </think> answer.<|end|><|start|>assistant" },
	{ CHAT_HARMONY, CONV_REASONLAST, GEN_EFFORT_LOW,
	    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: 2025-08-05\n\nReasoning: low\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|><|start|>user<|message|> Hello!\n<|end|><|start|>assistant<|channel|>final<|message|>\nHi there.<|end|><|start|>user<|message|>Who are you?<|end|><|start|>assistant<|channel|>final<|message|>Plain </think> answer.<|end|><|start|>assistant" },
	{ CHAT_HARMONY, CONV_REASONLAST, GEN_EFFORT_HIGH,
	    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: 2025-08-05\n\nReasoning: high\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|><|start|>user<|message|> Hello!\n<|end|><|start|>assistant<|channel|>final<|message|>\nHi there.<|end|><|start|>user<|message|>Who are you?<|end|><|start|>assistant<|channel|>final<|message|>Plain </think> answer.<|end|><|start|>assistant" },
	{ CHAT_MISTRAL_V1, CONV_FULL, 0,
	    "<s> [INST] You are a helpful assistant.\n\n Hello!\n [/INST]   Hi there.\xc2""\xa0""\xe3""\x80""\x80""</s> [INST] Who are you? [/INST]" },
	{ CHAT_MISTRAL_V1, CONV_FULL, 1,
	    "<s> [INST] You are a helpful assistant.\n\n Hello!\n [/INST]   Hi there.\xc2""\xa0""\xe3""\x80""\x80""</s> [INST] Who are you? [/INST]" },
	{ CHAT_MISTRAL_V1, CONV_NOSYS, 0,
	    "<s> [INST]  Hello!\n [/INST]   Hi there.\xc2""\xa0""\xe3""\x80""\x80""</s> [INST] Who are you? [/INST]" },
	{ CHAT_MISTRAL_V1, CONV_NOSYS, 1,
	    "<s> [INST]  Hello!\n [/INST]   Hi there.\xc2""\xa0""\xe3""\x80""\x80""</s> [INST] Who are you? [/INST]" },
	{ CHAT_MISTRAL_V1, CONV_ENDASST, 0,
	    "<s> [INST] You are a helpful assistant.\n\n Hello!\n [/INST]   Hi there.\xc2""\xa0""\xe3""\x80""\x80""</s>" },
	{ CHAT_MISTRAL_V1, CONV_ENDASST, 1,
	    "<s> [INST] You are a helpful assistant.\n\n Hello!\n [/INST]   Hi there.\xc2""\xa0""\xe3""\x80""\x80""</s>" },
	{ CHAT_CHATML, CONV_TOOLS_ASK, 0,
	    "<|im_start|>system\nYou are a helpful assistant.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"The weather of a city, \\\"now\\\" or later.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"description\": \"The city, as Z\xc3""\xbc""rich\"}, \"days\": {\"type\": \"integer\", \"default\": 1}, \"unit\": {\"type\": \"string\", \"enum\": [\"c\", \"f\"]}, \"low\": {\"type\": \"number\", \"minimum\": -40.5}, \"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}}}, \"required\": [\"city\"]}}}\n{\"type\": \"function\", \"function\": {\"name\": \"now\", \"description\": \"The time.\", \"parameters\": {\"type\": \"object\", \"properties\": {}}}}\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nWeather in Z\xc3""\xbc""rich for two days?<|im_end|>\n" },
	{ CHAT_CHATML, CONV_TOOLS_ASK, 1,
	    "<|im_start|>system\nYou are a helpful assistant.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"The weather of a city, \\\"now\\\" or later.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"description\": \"The city, as Z\xc3""\xbc""rich\"}, \"days\": {\"type\": \"integer\", \"default\": 1}, \"unit\": {\"type\": \"string\", \"enum\": [\"c\", \"f\"]}, \"low\": {\"type\": \"number\", \"minimum\": -40.5}, \"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}}}, \"required\": [\"city\"]}}}\n{\"type\": \"function\", \"function\": {\"name\": \"now\", \"description\": \"The time.\", \"parameters\": {\"type\": \"object\", \"properties\": {}}}}\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nWeather in Z\xc3""\xbc""rich for two days?<|im_end|>\n<|im_start|>assistant\n" },
	{ CHAT_CHATML, CONV_TOOLS_ROUND, 0,
	    "<|im_start|>system\nYou are a helpful assistant.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"The weather of a city, \\\"now\\\" or later.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"description\": \"The city, as Z\xc3""\xbc""rich\"}, \"days\": {\"type\": \"integer\", \"default\": 1}, \"unit\": {\"type\": \"string\", \"enum\": [\"c\", \"f\"]}, \"low\": {\"type\": \"number\", \"minimum\": -40.5}, \"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}}}, \"required\": [\"city\"]}}}\n{\"type\": \"function\", \"function\": {\"name\": \"now\", \"description\": \"The time.\", \"parameters\": {\"type\": \"object\", \"properties\": {}}}}\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nWeather in Z\xc3""\xbc""rich for two days?<|im_end|>\n<|im_start|>assistant\nChecking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Z\xc3""\xbc""rich\", \"days\": 2, \"low\": -0.5}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response>\n<tool_response>\n12:00\n</tool_response><|im_end|>\n<|im_start|>assistant\nIt is 21 degrees.<|im_end|>\n<|im_start|>user\nWho are you?<|im_end|>\n" },
	{ CHAT_CHATML, CONV_TOOLS_ROUND, 1,
	    "<|im_start|>system\nYou are a helpful assistant.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"The weather of a city, \\\"now\\\" or later.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"description\": \"The city, as Z\xc3""\xbc""rich\"}, \"days\": {\"type\": \"integer\", \"default\": 1}, \"unit\": {\"type\": \"string\", \"enum\": [\"c\", \"f\"]}, \"low\": {\"type\": \"number\", \"minimum\": -40.5}, \"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}}}, \"required\": [\"city\"]}}}\n{\"type\": \"function\", \"function\": {\"name\": \"now\", \"description\": \"The time.\", \"parameters\": {\"type\": \"object\", \"properties\": {}}}}\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nWeather in Z\xc3""\xbc""rich for two days?<|im_end|>\n<|im_start|>assistant\nChecking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Z\xc3""\xbc""rich\", \"days\": 2, \"low\": -0.5}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response>\n<tool_response>\n12:00\n</tool_response><|im_end|>\n<|im_start|>assistant\nIt is 21 degrees.<|im_end|>\n<|im_start|>user\nWho are you?<|im_end|>\n<|im_start|>assistant\n" },
	{ CHAT_QWEN3, CONV_TOOLS_ASK, 0,
	    "<|im_start|>system\nYou are a helpful assistant.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"The weather of a city, \\\"now\\\" or later.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"description\": \"The city, as Z\xc3""\xbc""rich\"}, \"days\": {\"type\": \"integer\", \"default\": 1}, \"unit\": {\"type\": \"string\", \"enum\": [\"c\", \"f\"]}, \"low\": {\"type\": \"number\", \"minimum\": -40.5}, \"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}}}, \"required\": [\"city\"]}}}\n{\"type\": \"function\", \"function\": {\"name\": \"now\", \"description\": \"The time.\", \"parameters\": {\"type\": \"object\", \"properties\": {}}}}\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nWeather in Z\xc3""\xbc""rich for two days?<|im_end|>\n" },
	{ CHAT_QWEN3, CONV_TOOLS_ASK, 1,
	    "<|im_start|>system\nYou are a helpful assistant.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"The weather of a city, \\\"now\\\" or later.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"description\": \"The city, as Z\xc3""\xbc""rich\"}, \"days\": {\"type\": \"integer\", \"default\": 1}, \"unit\": {\"type\": \"string\", \"enum\": [\"c\", \"f\"]}, \"low\": {\"type\": \"number\", \"minimum\": -40.5}, \"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}}}, \"required\": [\"city\"]}}}\n{\"type\": \"function\", \"function\": {\"name\": \"now\", \"description\": \"The time.\", \"parameters\": {\"type\": \"object\", \"properties\": {}}}}\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nWeather in Z\xc3""\xbc""rich for two days?<|im_end|>\n<|im_start|>assistant\n" },
	{ CHAT_QWEN3, CONV_TOOLS_NOSYS, 0,
	    "<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"The weather of a city, \\\"now\\\" or later.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"description\": \"The city, as Z\xc3""\xbc""rich\"}, \"days\": {\"type\": \"integer\", \"default\": 1}, \"unit\": {\"type\": \"string\", \"enum\": [\"c\", \"f\"]}, \"low\": {\"type\": \"number\", \"minimum\": -40.5}, \"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}}}, \"required\": [\"city\"]}}}\n{\"type\": \"function\", \"function\": {\"name\": \"now\", \"description\": \"The time.\", \"parameters\": {\"type\": \"object\", \"properties\": {}}}}\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nWeather in Z\xc3""\xbc""rich for two days?<|im_end|>\n" },
	{ CHAT_QWEN3, CONV_TOOLS_NOSYS, 1,
	    "<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"The weather of a city, \\\"now\\\" or later.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"description\": \"The city, as Z\xc3""\xbc""rich\"}, \"days\": {\"type\": \"integer\", \"default\": 1}, \"unit\": {\"type\": \"string\", \"enum\": [\"c\", \"f\"]}, \"low\": {\"type\": \"number\", \"minimum\": -40.5}, \"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}}}, \"required\": [\"city\"]}}}\n{\"type\": \"function\", \"function\": {\"name\": \"now\", \"description\": \"The time.\", \"parameters\": {\"type\": \"object\", \"properties\": {}}}}\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nWeather in Z\xc3""\xbc""rich for two days?<|im_end|>\n<|im_start|>assistant\n" },
	{ CHAT_QWEN3, CONV_TOOLS_ROUND, 0,
	    "<|im_start|>system\nYou are a helpful assistant.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"The weather of a city, \\\"now\\\" or later.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"description\": \"The city, as Z\xc3""\xbc""rich\"}, \"days\": {\"type\": \"integer\", \"default\": 1}, \"unit\": {\"type\": \"string\", \"enum\": [\"c\", \"f\"]}, \"low\": {\"type\": \"number\", \"minimum\": -40.5}, \"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}}}, \"required\": [\"city\"]}}}\n{\"type\": \"function\", \"function\": {\"name\": \"now\", \"description\": \"The time.\", \"parameters\": {\"type\": \"object\", \"properties\": {}}}}\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nWeather in Z\xc3""\xbc""rich for two days?<|im_end|>\n<|im_start|>assistant\nChecking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Z\xc3""\xbc""rich\",\"days\":2,\"low\":-0.5}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response>\n<tool_response>\n12:00\n</tool_response><|im_end|>\n<|im_start|>assistant\nIt is 21 degrees.<|im_end|>\n<|im_start|>user\nWho are you?<|im_end|>\n" },
	{ CHAT_QWEN3, CONV_TOOLS_ROUND, 1,
	    "<|im_start|>system\nYou are a helpful assistant.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"The weather of a city, \\\"now\\\" or later.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"description\": \"The city, as Z\xc3""\xbc""rich\"}, \"days\": {\"type\": \"integer\", \"default\": 1}, \"unit\": {\"type\": \"string\", \"enum\": [\"c\", \"f\"]}, \"low\": {\"type\": \"number\", \"minimum\": -40.5}, \"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}}}, \"required\": [\"city\"]}}}\n{\"type\": \"function\", \"function\": {\"name\": \"now\", \"description\": \"The time.\", \"parameters\": {\"type\": \"object\", \"properties\": {}}}}\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nWeather in Z\xc3""\xbc""rich for two days?<|im_end|>\n<|im_start|>assistant\nChecking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Z\xc3""\xbc""rich\",\"days\":2,\"low\":-0.5}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response>\n<tool_response>\n12:00\n</tool_response><|im_end|>\n<|im_start|>assistant\nIt is 21 degrees.<|im_end|>\n<|im_start|>user\nWho are you?<|im_end|>\n<|im_start|>assistant\n" },
	{ CHAT_QWEN3, CONV_TOOLS_BARE, 0,
	    "<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"The weather of a city, \\\"now\\\" or later.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"description\": \"The city, as Z\xc3""\xbc""rich\"}, \"days\": {\"type\": \"integer\", \"default\": 1}, \"unit\": {\"type\": \"string\", \"enum\": [\"c\", \"f\"]}, \"low\": {\"type\": \"number\", \"minimum\": -40.5}, \"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}}}, \"required\": [\"city\"]}}}\n{\"type\": \"function\", \"function\": {\"name\": \"now\", \"description\": \"The time.\", \"parameters\": {\"type\": \"object\", \"properties\": {}}}}\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nWeather in Z\xc3""\xbc""rich for two days?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Z\xc3""\xbc""rich\",\"days\":2,\"low\":-0.5}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response>\n<tool_response>\n12:00\n</tool_response><|im_end|>\n" },
	{ CHAT_QWEN3, CONV_TOOLS_BARE, 1,
	    "<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"The weather of a city, \\\"now\\\" or later.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"description\": \"The city, as Z\xc3""\xbc""rich\"}, \"days\": {\"type\": \"integer\", \"default\": 1}, \"unit\": {\"type\": \"string\", \"enum\": [\"c\", \"f\"]}, \"low\": {\"type\": \"number\", \"minimum\": -40.5}, \"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}}}, \"required\": [\"city\"]}}}\n{\"type\": \"function\", \"function\": {\"name\": \"now\", \"description\": \"The time.\", \"parameters\": {\"type\": \"object\", \"properties\": {}}}}\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nWeather in Z\xc3""\xbc""rich for two days?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Z\xc3""\xbc""rich\",\"days\":2,\"low\":-0.5}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response>\n<tool_response>\n12:00\n</tool_response><|im_end|>\n<|im_start|>assistant\n" },
	{ CHAT_MISTRAL, CONV_TOOLS_ASK, 0,
	    "<s>[AVAILABLE_TOOLS] [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"The weather of a city, \"now\" or later.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"description\": \"The city, as Z\xc3""\xbc""rich\"}, \"days\": {\"type\": \"integer\", \"default\": 1}, \"unit\": {\"type\": \"string\", \"enum\": [\"c\", \"f\"]}, \"low\": {\"type\": \"number\", \"minimum\": -40.5}, \"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}}}, \"required\": [\"city\"]}}}, {\"type\": \"function\", \"function\": {\"name\": \"now\", \"description\": \"The time.\", \"parameters\": {\"type\": \"object\", \"properties\": {}}}}][/AVAILABLE_TOOLS][INST] You are a helpful assistant.\n\nWeather in Z\xc3""\xbc""rich for two days?[/INST]" },
	{ CHAT_MISTRAL, CONV_TOOLS_ASK, 1,
	    "<s>[AVAILABLE_TOOLS] [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"The weather of a city, \"now\" or later.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"description\": \"The city, as Z\xc3""\xbc""rich\"}, \"days\": {\"type\": \"integer\", \"default\": 1}, \"unit\": {\"type\": \"string\", \"enum\": [\"c\", \"f\"]}, \"low\": {\"type\": \"number\", \"minimum\": -40.5}, \"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}}}, \"required\": [\"city\"]}}}, {\"type\": \"function\", \"function\": {\"name\": \"now\", \"description\": \"The time.\", \"parameters\": {\"type\": \"object\", \"properties\": {}}}}][/AVAILABLE_TOOLS][INST] You are a helpful assistant.\n\nWeather in Z\xc3""\xbc""rich for two days?[/INST]" },
	{ CHAT_MISTRAL, CONV_TOOLS_ROUND, 0,
	    "<s>[INST] Weather in Z\xc3""\xbc""rich for two days?[/INST][TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Z\xc3""\xbc""rich\", \"days\": 2, \"low\": -0.5}, \"id\": \"call00001\"}, {\"name\": \"now\", \"arguments\": {}, \"id\": \"call00002\"}]</s>[TOOL_RESULTS] {\"content\": {\"temp\": 21}, \"call_id\": \"call00001\"}[/TOOL_RESULTS][TOOL_RESULTS] {\"content\": 12:00, \"call_id\": \"call00002\"}[/TOOL_RESULTS] It is 21 degrees.</s>[AVAILABLE_TOOLS] [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"The weather of a city, \"now\" or later.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"description\": \"The city, as Z\xc3""\xbc""rich\"}, \"days\": {\"type\": \"integer\", \"default\": 1}, \"unit\": {\"type\": \"string\", \"enum\": [\"c\", \"f\"]}, \"low\": {\"type\": \"number\", \"minimum\": -40.5}, \"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}}}, \"required\": [\"city\"]}}}, {\"type\": \"function\", \"function\": {\"name\": \"now\", \"description\": \"The time.\", \"parameters\": {\"type\": \"object\", \"properties\": {}}}}][/AVAILABLE_TOOLS][INST] You are a helpful assistant.\n\nWho are you?[/INST]" },
	{ CHAT_MISTRAL, CONV_TOOLS_ROUND, 1,
	    "<s>[INST] Weather in Z\xc3""\xbc""rich for two days?[/INST][TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Z\xc3""\xbc""rich\", \"days\": 2, \"low\": -0.5}, \"id\": \"call00001\"}, {\"name\": \"now\", \"arguments\": {}, \"id\": \"call00002\"}]</s>[TOOL_RESULTS] {\"content\": {\"temp\": 21}, \"call_id\": \"call00001\"}[/TOOL_RESULTS][TOOL_RESULTS] {\"content\": 12:00, \"call_id\": \"call00002\"}[/TOOL_RESULTS] It is 21 degrees.</s>[AVAILABLE_TOOLS] [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"The weather of a city, \"now\" or later.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"description\": \"The city, as Z\xc3""\xbc""rich\"}, \"days\": {\"type\": \"integer\", \"default\": 1}, \"unit\": {\"type\": \"string\", \"enum\": [\"c\", \"f\"]}, \"low\": {\"type\": \"number\", \"minimum\": -40.5}, \"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}}}, \"required\": [\"city\"]}}}, {\"type\": \"function\", \"function\": {\"name\": \"now\", \"description\": \"The time.\", \"parameters\": {\"type\": \"object\", \"properties\": {}}}}][/AVAILABLE_TOOLS][INST] You are a helpful assistant.\n\nWho are you?[/INST]" },
	{ CHAT_HARMONY, CONV_TOOLS_ASK, 0,
	    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: 2025-08-05\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.\nCalls to these tools must go to the commentary channel: 'functions'.<|end|><|start|>developer<|message|># Instructions\n\nYou are a helpful assistant.\n\n# Tools\n\n## functions\n\nnamespace functions {\n\n// The weather of a city, \"now\" or later.\ntype get_weather = (_: {\n// The city, as Z\xc3""\xbc""rich\ncity: string,\ndays?: number, // default: 1,\nunit?: \"c\" | \"f\",\nlow?: number,\ntags?: string[],\n}) => any;\n\n// The time.\ntype now = () => any;\n\n} // namespace functions<|end|><|start|>user<|message|>Weather in Z\xc3""\xbc""rich for two days?<|end|>" },
	{ CHAT_HARMONY, CONV_TOOLS_ASK, 1,
	    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: 2025-08-05\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.\nCalls to these tools must go to the commentary channel: 'functions'.<|end|><|start|>developer<|message|># Instructions\n\nYou are a helpful assistant.\n\n# Tools\n\n## functions\n\nnamespace functions {\n\n// The weather of a city, \"now\" or later.\ntype get_weather = (_: {\n// The city, as Z\xc3""\xbc""rich\ncity: string,\ndays?: number, // default: 1,\nunit?: \"c\" | \"f\",\nlow?: number,\ntags?: string[],\n}) => any;\n\n// The time.\ntype now = () => any;\n\n} // namespace functions<|end|><|start|>user<|message|>Weather in Z\xc3""\xbc""rich for two days?<|end|><|start|>assistant" },
	{ CHAT_HARMONY, CONV_TOOLS_NOSYS, 0,
	    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: 2025-08-05\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.\nCalls to these tools must go to the commentary channel: 'functions'.<|end|><|start|>developer<|message|># Tools\n\n## functions\n\nnamespace functions {\n\n// The weather of a city, \"now\" or later.\ntype get_weather = (_: {\n// The city, as Z\xc3""\xbc""rich\ncity: string,\ndays?: number, // default: 1,\nunit?: \"c\" | \"f\",\nlow?: number,\ntags?: string[],\n}) => any;\n\n// The time.\ntype now = () => any;\n\n} // namespace functions<|end|><|start|>user<|message|>Weather in Z\xc3""\xbc""rich for two days?<|end|>" },
	{ CHAT_HARMONY, CONV_TOOLS_NOSYS, 1,
	    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: 2025-08-05\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.\nCalls to these tools must go to the commentary channel: 'functions'.<|end|><|start|>developer<|message|># Tools\n\n## functions\n\nnamespace functions {\n\n// The weather of a city, \"now\" or later.\ntype get_weather = (_: {\n// The city, as Z\xc3""\xbc""rich\ncity: string,\ndays?: number, // default: 1,\nunit?: \"c\" | \"f\",\nlow?: number,\ntags?: string[],\n}) => any;\n\n// The time.\ntype now = () => any;\n\n} // namespace functions<|end|><|start|>user<|message|>Weather in Z\xc3""\xbc""rich for two days?<|end|><|start|>assistant" },
	{ CHAT_HARMONY, CONV_TOOLS_ROUND, 0,
	    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: 2025-08-05\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.\nCalls to these tools must go to the commentary channel: 'functions'.<|end|><|start|>developer<|message|># Instructions\n\nYou are a helpful assistant.\n\n# Tools\n\n## functions\n\nnamespace functions {\n\n// The weather of a city, \"now\" or later.\ntype get_weather = (_: {\n// The city, as Z\xc3""\xbc""rich\ncity: string,\ndays?: number, // default: 1,\nunit?: \"c\" | \"f\",\nlow?: number,\ntags?: string[],\n}) => any;\n\n// The time.\ntype now = () => any;\n\n} // namespace functions<|end|><|start|>user<|message|>Weather in Z\xc3""\xbc""rich for two days?<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Z\xc3""\xbc""rich\", \"days\": 2, \"low\": -0.5}<|call|><|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>\"{\\\"temp\\\": 21}\"<|end|><|start|>assistant<|channel|>final<|message|>It is 21 degrees.<|end|><|start|>user<|message|>Who are you?<|end|>" },
	{ CHAT_HARMONY, CONV_TOOLS_ROUND, 1,
	    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: 2025-08-05\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.\nCalls to these tools must go to the commentary channel: 'functions'.<|end|><|start|>developer<|message|># Instructions\n\nYou are a helpful assistant.\n\n# Tools\n\n## functions\n\nnamespace functions {\n\n// The weather of a city, \"now\" or later.\ntype get_weather = (_: {\n// The city, as Z\xc3""\xbc""rich\ncity: string,\ndays?: number, // default: 1,\nunit?: \"c\" | \"f\",\nlow?: number,\ntags?: string[],\n}) => any;\n\n// The time.\ntype now = () => any;\n\n} // namespace functions<|end|><|start|>user<|message|>Weather in Z\xc3""\xbc""rich for two days?<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Z\xc3""\xbc""rich\", \"days\": 2, \"low\": -0.5}<|call|><|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>\"{\\\"temp\\\": 21}\"<|end|><|start|>assistant<|channel|>final<|message|>It is 21 degrees.<|end|><|start|>user<|message|>Who are you?<|end|><|start|>assistant" },
	{ CHAT_HARMONY, CONV_TOOLS_BARE, 0,
	    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: 2025-08-05\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.\nCalls to these tools must go to the commentary channel: 'functions'.<|end|><|start|>developer<|message|># Tools\n\n## functions\n\nnamespace functions {\n\n// The weather of a city, \"now\" or later.\ntype get_weather = (_: {\n// The city, as Z\xc3""\xbc""rich\ncity: string,\ndays?: number, // default: 1,\nunit?: \"c\" | \"f\",\nlow?: number,\ntags?: string[],\n}) => any;\n\n// The time.\ntype now = () => any;\n\n} // namespace functions<|end|><|start|>user<|message|>Weather in Z\xc3""\xbc""rich for two days?<|end|><|start|>assistant<|channel|>analysis<|message|>I should look.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Z\xc3""\xbc""rich\", \"days\": 2, \"low\": -0.5}<|call|><|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>\"{\\\"temp\\\": 21}\"<|end|>" },
	{ CHAT_HARMONY, CONV_TOOLS_BARE, 1,
	    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: 2025-08-05\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.\nCalls to these tools must go to the commentary channel: 'functions'.<|end|><|start|>developer<|message|># Tools\n\n## functions\n\nnamespace functions {\n\n// The weather of a city, \"now\" or later.\ntype get_weather = (_: {\n// The city, as Z\xc3""\xbc""rich\ncity: string,\ndays?: number, // default: 1,\nunit?: \"c\" | \"f\",\nlow?: number,\ntags?: string[],\n}) => any;\n\n// The time.\ntype now = () => any;\n\n} // namespace functions<|end|><|start|>user<|message|>Weather in Z\xc3""\xbc""rich for two days?<|end|><|start|>assistant<|channel|>analysis<|message|>I should look.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Z\xc3""\xbc""rich\", \"days\": 2, \"low\": -0.5}<|call|><|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>\"{\\\"temp\\\": 21}\"<|end|><|start|>assistant" },
};

/* The BOS text render_expected.py gave each family's template. */
static const char *
bos_of(enum chat_tmpl t)
{
	switch (t) {
	case CHAT_LLAMA3:
		return "<|begin_of_text|>";
	case CHAT_GEMMA:
		return "<bos>";
	case CHAT_MISTRAL:
	case CHAT_LLAMA2:
	case CHAT_MISTRAL_V1:
		return "<s>";
	default:
		return "";
	}
}

/* Renders with options and returns the text (freed by the caller), failing the test on error. */
static char *
render_opts_ok(enum chat_tmpl t, const struct chat_msg *m, size_t n, const struct chat_opts *o)
{
	char err[ERR_LEN] = "";
	char *out = NULL;
	size_t len = 0;
	int rc;

	rc = chat_render_opts(t, m, n, o, &out, &len, err);
	if (rc != 0)
		fail_msg("%s: %s", chat_tmpl_name(t), err);
	assert_non_null(out);
	assert_int_equal(strlen(out), len);
	return out;
}

/* Renders with the generation prompt and BOS given, on TEST_DATE, and returns the text. */
static char *
render_ok(enum chat_tmpl t, const struct chat_msg *m, size_t n, int gen, const char *bos)
{
	struct chat_opts o = { .add_generation_prompt = gen, .bos_text = bos, .date = TEST_DATE };

	return render_opts_ok(t, m, n, &o);
}

/* Renders a conversation that must be refused with a message containing needle. */
static void
render_bad(enum chat_tmpl t, const struct chat_msg *m, size_t n, const char *needle)
{
	char err[ERR_LEN] = "";
	char *out = NULL;
	size_t len = 0;

	assert_int_equal(chat_render(t, m, n, 1, NULL, &out, &len, err), ERR_INVAL);
	assert_null(out);
	if (strstr(err, needle) == NULL)
		fail_msg("%s: message '%s' lacks '%s'", chat_tmpl_name(t), err, needle);
}

/* 1 if s ends with tail. */
static int
ends_with_str(const char *s, const char *tail)
{
	size_t n = strlen(s), k = strlen(tail);

	return n >= k && strcmp(s + n - k, tail) == 0;
}

/* Every family renders what its official template renders. */
static void
test_render_matches_templates(void **state)
{
	struct chat_opts o = { .date = TEST_DATE };
	const struct chat_msg *m;
	char err[ERR_LEN], *tools, *out;
	size_t i, n, n_tools;

	(void)state;
	assert_int_equal(chat_tools_check(TOOLS_JSON, &tools, &n_tools, err), 0);
	assert_int_equal(n_tools, 2);
	for (i = 0; i < ARRAY_LEN(expected); i++) {
		m = conv_msgs(expected[i].t, expected[i].conv, &n);
		o.add_generation_prompt = expected[i].gen != 0;
		o.bos_text = bos_of(expected[i].t);
		o.think = expected[i].gen == GEN_NO_THINK ? THINK_OFF : expected[i].gen == GEN_EFFORT_LOW ? THINK_LOW :
		    expected[i].gen == GEN_EFFORT_HIGH ? THINK_HIGH : THINK_DEFAULT;
		o.tools = conv_has_tools(expected[i].conv) ? tools : NULL;
		out = render_opts_ok(expected[i].t, m, n, &o);
		if (strcmp(out, expected[i].text) != 0)
			fail_msg("entry %zu (%s): got\n%s", i, chat_tmpl_name(expected[i].t), out);
		free(out);
	}
	free(tools);
}

/* chat_render is chat_render_opts with the rest of the options left at their defaults. */
static void
test_render_defaults(void **state)
{
	struct chat_opts o = { .add_generation_prompt = 1, .think = THINK_OFF };
	char err[ERR_LEN], *a, *b;
	size_t len;

	(void)state;
	assert_int_equal(chat_render(CHAT_QWEN3, conv_full, 4, 1, NULL, &a, &len, err), 0);
	assert_true(ends_with_str(a, "<|im_start|>assistant\n"));
	b = render_opts_ok(CHAT_QWEN3, conv_full, 4, &o);
	assert_true(ends_with_str(b, "<|im_start|>assistant\n<think>\n\n</think>\n\n"));
	free(a);
	free(b);
	/* THINK_OFF is Qwen3's switch alone (gpt-oss's is its effort, rendered from the templates above) */
	a = render_opts_ok(CHAT_CHATML, conv_full, 4, &o);
	b = render_ok(CHAT_CHATML, conv_full, 4, 1, NULL);
	assert_string_equal(a, b);
	free(a);
	free(b);
}

/* Harmony's date: today's (local) by default, the caller's when given, and only YYYY-MM-DD. */
static void
test_harmony_date(void **state)
{
	static const char *const bad[] = { "2025-8-05", "2025-08-05 ", "20250805", "2025/08/05",
	    "<|end|>", "" };
	struct chat_opts o = { 0 };
	char err[ERR_LEN], want[64], *out;
	struct tm tm;
	time_t now;
	size_t i, len;

	(void)state;
	now = time(NULL);
	assert_non_null(localtime_r(&now, &tm));
	strftime(want, sizeof want, "\nCurrent date: %Y-%m-%d\n", &tm);
	out = render_opts_ok(CHAT_HARMONY, conv_nosys, 1, &o);
	if (strstr(out, want) == NULL)
		fail_msg("no '%s' in '%s'", want, out);
	free(out);
	o.date = "1999-12-31";
	out = render_opts_ok(CHAT_HARMONY, conv_nosys, 1, &o);
	assert_non_null(strstr(out, "\nCurrent date: 1999-12-31\n"));
	free(out);
	for (i = 0; i < ARRAY_LEN(bad); i++) {
		o.date = bad[i];
		out = NULL;
		assert_int_equal(chat_render_opts(CHAT_HARMONY, conv_nosys, 1, &o, &out, &len, err), ERR_INVAL);
		assert_null(out);
		assert_non_null(strstr(err, "is not YYYY-MM-DD"));
	}
}

/* Harmony refuses what gpt-oss's template raises on, and a late system message it would drop. */
static void
test_harmony_refusals(void **state)
{
	const struct chat_msg analysis[] = { { "user", "a", NULL, NULL, 0, NULL, NULL },
	    { "assistant", "<|channel|>analysis<|message|>x", NULL, NULL, 0, NULL, NULL } };
	const struct chat_msg final[] = { { "user", "a", NULL, NULL, 0, NULL, NULL },
	    { "assistant", "a<|channel|>final<|message|>b", NULL, NULL, 0, NULL, NULL } };
	const struct chat_msg thinking[] = { { "user", "a", NULL, NULL, 0, NULL, NULL },
	    { "assistant", "b", "a<|channel|>final<|message|>b", NULL, 0, NULL, NULL } };
	const struct chat_msg late_sys[] = { { "user", "a", NULL, NULL, 0, NULL, NULL }, { "assistant", "b", NULL, NULL, 0, NULL, NULL },
	    { "system", "c", NULL, NULL, 0, NULL, NULL } };
	const struct chat_msg empty_sys[] = { { "system", "", NULL, NULL, 0, NULL, NULL }, { "user", "a", NULL, NULL, 0, NULL, NULL } };
	char *out;

	(void)state;
	render_bad(CHAT_HARMONY, analysis, 2, "message 1: the harmony template refuses <|channel|> tags");
	render_bad(CHAT_HARMONY, final, 2, "message 1: the harmony template refuses <|channel|> tags");
	render_bad(CHAT_HARMONY, thinking, 2, "message 1: the harmony template refuses <|channel|> tags");
	render_bad(CHAT_HARMONY, late_sys, 3, "message 2: the harmony template allows a system message only");
	/* an empty system prompt makes no developer message, as in the template */
	out = render_ok(CHAT_HARMONY, empty_sys, 2, 0, NULL);
	assert_null(strstr(out, "developer"));
	assert_true(ends_with_str(out, "<|end|><|start|>user<|message|>a<|end|>"));
	free(out);
}

/* A NULL bos_text means the family's usual BOS; a given one is used as is. */
static void
test_bos_text(void **state)
{
	char *a, *b;

	(void)state;
	a = render_ok(CHAT_GEMMA, conv_full, 4, 1, NULL);
	b = render_ok(CHAT_GEMMA, conv_full, 4, 1, "<bos>");
	assert_string_equal(a, b);
	free(a);
	free(b);
	a = render_ok(CHAT_LLAMA3, conv_full, 2, 0, "<B>");
	assert_string_equal(a, "<B><|start_header_id|>system<|end_header_id|>\n\n"
	    "You are a helpful assistant.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
	    "Hello!<|eot_id|>");
	free(a);
}

/* Raw mode concatenates the contents, with no BOS and no generation prompt. */
static void
test_raw(void **state)
{
	char *out;

	(void)state;
	out = render_ok(CHAT_RAW, conv_full + 1, 2, 1, "<s>");
	assert_string_equal(out, " Hello!\n  Hi there.\xc2\xa0\xe3\x80\x80");
	free(out);
	out = render_ok(CHAT_RAW, conv_full, 0, 1, NULL);
	assert_string_equal(out, "");
	free(out);
}

/*
 * Trimming removes what Python's str.isspace accepts (U+2003, U+0085,
 * U+001F) and keeps what it does not (U+200B); rendered by the llama3
 * template: '<B><|start_header_id|>user<|end_header_id|>\n\nx\u200by<|eot_id|>'.
 */
static void
test_unicode_strip(void **state)
{
	const struct chat_msg m[] = { { "user", "\t\xe2\x80\x83x\xe2\x80\x8by\xc2\x85\x1f", NULL, NULL, 0, NULL, NULL } };
	const struct chat_msg blank[] = { { "user", " \xe3\x80\x80\n", NULL, NULL, 0, NULL, NULL } };
	char *out;

	(void)state;
	out = render_ok(CHAT_LLAMA3, m, 1, 0, "<B>");
	assert_string_equal(out, "<B><|start_header_id|>user<|end_header_id|>\n\n"
	    "x\xe2\x80\x8by<|eot_id|>");
	free(out);
	out = render_ok(CHAT_GEMMA, blank, 1, 0, NULL);
	assert_string_equal(out, "<bos><start_of_turn>user\n<end_of_turn>\n");
	free(out);
}

/* Llama 3 and ChatML templates accept any order of turns. */
static void
test_free_order(void **state)
{
	const struct chat_msg m[] = { { "user", "a", NULL, NULL, 0, NULL, NULL }, { "user", "b", NULL, NULL, 0, NULL, NULL }, { "system", "c", NULL, NULL, 0, NULL, NULL } };
	char *out;

	(void)state;
	out = render_ok(CHAT_CHATML, m, 3, 0, NULL);
	assert_string_equal(out, "<|im_start|>user\na<|im_end|>\n<|im_start|>user\nb<|im_end|>\n"
	    "<|im_start|>system\nc<|im_end|>\n");
	free(out);
	out = render_ok(CHAT_LLAMA3, m, 2, 0, NULL);
	free(out);
}

/* What the alternating templates raise on is refused (render_expected.py checks they raise). */
static void
test_alternation(void **state)
{
	const struct chat_msg two_users[] = { { "user", "a", NULL, NULL, 0, NULL, NULL }, { "user", "b", NULL, NULL, 0, NULL, NULL } };
	const struct chat_msg asst_first[] = { { "assistant", "a", NULL, NULL, 0, NULL, NULL }, { "user", "b", NULL, NULL, 0, NULL, NULL } };
	const struct chat_msg sys_asst[] = { { "system", "s", NULL, NULL, 0, NULL, NULL }, { "assistant", "a", NULL, NULL, 0, NULL, NULL } };
	const struct chat_msg late_sys[] = { { "user", "a", NULL, NULL, 0, NULL, NULL }, { "assistant", "b", NULL, NULL, 0, NULL, NULL },
	    { "system", "c", NULL, NULL, 0, NULL, NULL } };
	const enum chat_tmpl strict[] = { CHAT_GEMMA, CHAT_MISTRAL, CHAT_LLAMA2, CHAT_MISTRAL_V1 };
	size_t i;

	(void)state;
	for (i = 0; i < ARRAY_LEN(strict); i++) {
		render_bad(strict[i], two_users, 2, "message 1: ");
		render_bad(strict[i], asst_first, 2, "alternate user/assistant");
		render_bad(strict[i], sys_asst, 2, "message 1: ");
		render_bad(strict[i], late_sys, 3, "system message only as the first");
	}
}

/* Bad messages are refused with a message naming them, for every family. */
static void
test_bad_messages(void **state)
{
	const struct chat_msg tool[] = { { "user", "a", NULL, NULL, 0, NULL, NULL },
		{ "function", "b", NULL, NULL, 0, NULL, NULL } };
	const struct chat_msg no_role[] = { { NULL, "a", NULL, NULL, 0, NULL, NULL } };
	const struct chat_msg no_content[] = { { "user", NULL, NULL, NULL, 0, NULL, NULL } };
	const struct chat_msg bad_utf8[] = { { "user", "a\xc3(", NULL, NULL, 0, NULL, NULL } };
	const struct chat_msg bad_reasoning[] = { { "user", "a", NULL, NULL, 0, NULL, NULL }, { "assistant", "b", "c\xc3(", NULL, 0, NULL, NULL } };
	char err[ERR_LEN];
	char *out = NULL;
	size_t len, t;

	(void)state;
	for (t = CHAT_RAW; t <= CHAT_TMPL_LAST; t++) {
		render_bad((enum chat_tmpl)t, tool, 2, "message 1: unknown role 'function'");
		render_bad((enum chat_tmpl)t, no_role, 1, "unknown role '(null)'");
		render_bad((enum chat_tmpl)t, no_content, 1, "message 0: no content");
		render_bad((enum chat_tmpl)t, bad_utf8, 1, "not valid UTF-8");
		render_bad((enum chat_tmpl)t, bad_reasoning, 2, "message 1: reasoning is not valid UTF-8");
		if (t != CHAT_RAW)
			render_bad((enum chat_tmpl)t, tool, 0, "no messages");
	}
	assert_int_equal(chat_render((enum chat_tmpl)42, tool, 1, 0, NULL, &out, &len, err), ERR_INVAL);
	assert_null(out);
}

/* Names round-trip; others are refused. */
static void
test_names(void **state)
{
	char err[ERR_LEN];
	enum chat_tmpl t, back;

	(void)state;
	for (t = CHAT_RAW; t <= CHAT_TMPL_LAST; t++) {
		assert_int_equal(chat_tmpl_from_name(chat_tmpl_name(t), &back, err), 0);
		assert_int_equal(back, t);
	}
	assert_string_equal(chat_tmpl_name(CHAT_GEMMA), "gemma");
	assert_string_equal(chat_tmpl_name(CHAT_MISTRAL_V1), "mistral-v1");
	assert_string_equal(chat_tmpl_name((enum chat_tmpl)(CHAT_TMPL_LAST + 1)), "?");
	assert_int_equal(chat_tmpl_from_name("Gemma3", &back, err), ERR_INVAL);
	assert_non_null(strstr(err, "unknown chat template 'Gemma3'"));
	assert_int_equal(chat_tmpl_from_name(NULL, &back, err), ERR_INVAL);
}

/* The official templates in tests/data/chat_templates are recognised. */
static void
test_detect_files(void **state)
{
	static const struct {
		const char *file;
		enum chat_tmpl t;
	} files[] = {
		{ "llama3.jinja", CHAT_LLAMA3 }, { "qwen2.5.jinja", CHAT_CHATML },
		{ "chatml.jinja", CHAT_CHATML }, { "gemma3.jinja", CHAT_GEMMA },
		{ "mistral-v0.3.jinja", CHAT_MISTRAL }, { "llama2.jinja", CHAT_LLAMA2 },
		{ "qwen3.jinja", CHAT_QWEN3 }, { "gpt-oss.jinja", CHAT_HARMONY },
		{ "mistral-v1.jinja", CHAT_MISTRAL_V1 },
	};
	const char *srcdir = getenv("RESIDENT_SRCDIR");
	char path[4096], err[ERR_LEN];
	char *src;
	size_t i, len;
	enum chat_tmpl t;

	(void)state;
	if (srcdir == NULL) {
		print_message("RESIDENT_SRCDIR is not set: skipping the template files\n");
		skip();
	}
	for (i = 0; i < ARRAY_LEN(files); i++) {
		snprintf(path, sizeof path, "%s/tests/data/chat_templates/%s", srcdir, files[i].file);
		if (read_file(path, &src, &len, err) != 0)
			fail_msg("%s", err);
		if (chat_detect(src, &t, err) != 0)
			fail_msg("%s: %s", files[i].file, err);
		if (t != files[i].t)
			fail_msg("%s: detected %s", files[i].file, chat_tmpl_name(t));
		free(src);
	}
}

/* Detection follows llama.cpp's markers; variants we cannot render exactly are refused. */
static void
test_detect_variants(void **state)
{
	/* google/gemma-7b-it (as in llama.cpp's test-chat-template.cpp) */
	const char *gemma1 = "{% if messages[0]['role'] == 'system' %}{{ raise_exception("
	    "'System role not supported') }}{% endif %}{% for message in messages %}"
	    "{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"
	    "{% endfor %}";
	/* mistralai/Mistral-7B-Instruct-v0.2's first template: llama2 family, as llama.cpp has it */
	const char *mistral02 = "{{ bos_token }}{% for message in messages %}{% if message['role'] == "
	    "'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% endif %}{% endfor %}";
	/* Qwen/QwQ-32B's generation prompt (llama.cpp's models/templates), which opens the reasoning */
	const char *qwq = "{%- if message.role == \"assistant\" %}{%- set content = message.content."
	    "split('</think>')[-1].lstrip('\\n') %}{%- endif %}{{- '<|im_start|>' + message.role }}"
	    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}";
	static const struct {
		const char *src;
		const char *what;
	} refused[] = {
		{ "{{- \"[INST]\" + message[\"content\"] + \"[/INST]\" }}{{- \"[AVAILABLE_TOOLS][\" }}",
		  "the Mistral v3-Tekken chat template" },
		{ "{{- '[SYSTEM_PROMPT]' + system_message + '[/SYSTEM_PROMPT]' }}[INST]",
		  "the Mistral v7 chat template" },
		{ "{{'<|im_start|>' + message['role'] + '<|im_sep|>' + message['content']}}",
		  "a ChatML variant (Phi-4" },
		{ "{% for m in messages %}{{ m.content }}{% endfor %}", "unknown chat template" },
	};
	char err[ERR_LEN];
	enum chat_tmpl t;
	size_t i;

	(void)state;
	assert_int_equal(chat_detect(gemma1, &t, err), 0);
	assert_int_equal(t, CHAT_GEMMA);
	assert_int_equal(chat_detect(mistral02, &t, err), 0);
	assert_int_equal(t, CHAT_LLAMA2);
	assert_int_equal(chat_detect(qwq, &t, err), ERR_UNSUPPORTED);
	assert_non_null(strstr(err, "a ChatML variant with reasoning"));
	for (i = 0; i < ARRAY_LEN(refused); i++) {
		assert_int_equal(chat_detect(refused[i].src, &t, err), ERR_UNSUPPORTED);
		if (strncmp(err, refused[i].what, strlen(refused[i].what)) != 0 ||
		    strstr(err, "use raw prompt mode") == NULL)
			fail_msg("%s", err);
	}
	assert_int_equal(chat_detect(NULL, &t, err), ERR_NOTFOUND);
	assert_int_equal(chat_detect("", &t, err), ERR_NOTFOUND);
}

/* The quoted start of an unknown template is one line, 40 bytes, cut between characters. */
static void
test_detect_excerpt(void **state)
{
	char err[ERR_LEN];
	enum chat_tmpl t;

	(void)state;
	assert_int_equal(chat_detect("{{ a }}\n{{ b }}", &t, err), ERR_UNSUPPORTED);
	assert_non_null(strstr(err, "(\"{{ a }} {{ b }}\")"));
	/* 39 ASCII bytes, then a 3-byte character that does not fit */
	assert_int_equal(chat_detect("{{ 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx' }}\xe2\x80\x83 tail", &t, err),
	    ERR_UNSUPPORTED);
	assert_non_null(strstr(err, "(\"{{ 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx' }}...\")"));
	assert_int_equal(chat_detect("\xff{{ x }}", &t, err), ERR_UNSUPPORTED);
	assert_non_null(strstr(err, "(\"?{{ x }}\")"));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_render_matches_templates),
		cmocka_unit_test(test_render_defaults),
		cmocka_unit_test(test_harmony_date),
		cmocka_unit_test(test_harmony_refusals),
		cmocka_unit_test(test_bos_text),
		cmocka_unit_test(test_raw),
		cmocka_unit_test(test_unicode_strip),
		cmocka_unit_test(test_free_order),
		cmocka_unit_test(test_alternation),
		cmocka_unit_test(test_bad_messages),
		cmocka_unit_test(test_names),
		cmocka_unit_test(test_detect_files),
		cmocka_unit_test(test_detect_variants),
		cmocka_unit_test(test_detect_excerpt),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
