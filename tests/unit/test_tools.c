/*
 * test_tools.c: tools and tool calls (chat_tools.c, and chat.c's renders
 * that have no reference template in tests/data/chat_templates): tools
 * checked and normalised, Python's json.dumps spelling, Llama 3.1's and
 * Gemma's renders, what the templates refuse, and calls parsed back out of
 * each family's output, a broken one reported.
 *
 * The Llama 3.1 expectation is meta-llama/Llama-3.1-8B-Instruct's template
 * rendered by transformers (render_jinja_template) with
 * date_string="05 Aug 2025"; Gemma 3 has no template for tools, and its
 * expectation spells out the prompt chat.c documents (GEMMA_TOOLS).
 */
#include "config.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "chat.h"
#include "chat_tools.h"
#include "util.h"
#include "chat_convs.h"

/* test_chat.c's TOOLS_JSON, in the flat shape for one and OpenAI's for the other. */
static const char TOOLS_JSON[] = "[" TOOL_WEATHER_FN "," TOOL_NOW "]";

static const char LLAMA31_ROUND[] =
	    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n"
	    "Cutting Knowledge Date: December 2023\nToday Date: 05 Aug 2025\n\n"
	    "You are a helpful assistant.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
	    "Given the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.\n"
	    "\n"
	    "Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}.Do not use variables.\n"
	    "\n{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"get_weather\",\n"
	    "        \"description\": \"The weather of a city, \\\"now\\\" or later.\",\n"
	    "        \"parameters\": {\n            \"type\": \"object\",\n            \"properties\": {\n"
	    "                \"city\": {\n                    \"type\": \"string\",\n"
	    "                    \"description\": \"The city, as Z\xc3""\xbc""rich\"\n                },\n"
	    "                \"days\": {\n                    \"type\": \"integer\",\n"
	    "                    \"default\": 1\n                },\n                \"unit\": {\n"
	    "                    \"type\": \"string\",\n                    \"enum\": [\n"
	    "                        \"c\",\n                        \"f\"\n                    ]\n"
	    "                },\n                \"low\": {\n                    \"type\": \"number\",\n"
	    "                    \"minimum\": -40.5\n                },\n                \"tags\": {\n"
	    "                    \"type\": \"array\",\n                    \"items\": {\n"
	    "                        \"type\": \"string\"\n                    }\n                }\n"
	    "            },\n            \"required\": [\n                \"city\"\n            ]\n"
	    "        }\n    }\n}\n\n{\n    \"type\": \"function\",\n    \"function\": {\n"
	    "        \"name\": \"now\",\n        \"description\": \"The time.\",\n        \"parameters\": {\n"
	    "            \"type\": \"object\",\n            \"properties\": {}\n        }\n    }\n}\n\n"
	    "Weather in Z\xc3""\xbc""rich for two days?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n"
	    "\n"
	    "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Z\xc3""\xbc""rich\", \"days\": 2, \"low\": -0.5}}<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n"
	    "\n\"{\\\"temp\\\": 21}\"<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
	    "It is 21 degrees.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
	    "Who are you?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n";

static const char GEMMA_ROUND[] =
	    "<bos><start_of_turn>user\nYou are a helpful assistant.\n\n"
	    "You have access to functions. If you decide to invoke any of the function(s), you MUST put it in the format of\n"
	    "{\"name\": function name, \"parameters\": dictionary of argument name and its value}\n\n"
	    "You SHOULD NOT include any other text in the response if you call a function\n[\n  {\n"
	    "    \"name\": \"get_weather\",\n"
	    "    \"description\": \"The weather of a city, \\\"now\\\" or later.\",\n    \"parameters\": {\n"
	    "      \"type\": \"object\",\n      \"properties\": {\n        \"city\": {\n"
	    "          \"type\": \"string\",\n          \"description\": \"The city, as Z\xc3""\xbc""rich\"\n"
	    "        },\n        \"days\": {\n          \"type\": \"integer\",\n          \"default\": 1\n"
	    "        },\n        \"unit\": {\n          \"type\": \"string\",\n          \"enum\": [\n"
	    "            \"c\",\n            \"f\"\n          ]\n        },\n        \"low\": {\n"
	    "          \"type\": \"number\",\n          \"minimum\": -40.5\n        },\n        \"tags\": {\n"
	    "          \"type\": \"array\",\n          \"items\": {\n            \"type\": \"string\"\n"
	    "          }\n        }\n      },\n      \"required\": [\n        \"city\"\n      ]\n    }\n"
	    "  },\n  {\n    \"name\": \"now\",\n    \"description\": \"The time.\",\n    \"parameters\": {\n"
	    "      \"type\": \"object\",\n      \"properties\": {}\n    }\n  }\n]\n\n"
	    "Weather in Z\xc3""\xbc""rich for two days?<end_of_turn>\n<start_of_turn>model\nChecking.\n"
	    "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Z\xc3""\xbc""rich\", \"days\": 2, \"low\": -0.5}}\n"
	    "{\"name\": \"now\", \"parameters\": {}}<end_of_turn>\n<start_of_turn>user\n{\"temp\": 21}\n\n"
	    "12:00<end_of_turn>\n<start_of_turn>model\nIt is 21 degrees.<end_of_turn>\n<start_of_turn>user\n"
	    "Who are you?<end_of_turn>\n<start_of_turn>model\n";

/* The tools, checked and in OpenAI's shape. */
static char *
tools_ok(void)
{
	char err[ERR_LEN], *out;
	size_t n;

	if (chat_tools_check(TOOLS_JSON, &out, &n, err) != 0)
		fail_msg("%s", err);
	assert_int_equal(n, 2);
	return out;
}

/* Renders with the tools on 2025-08-05, failing the test on error. */
static char *
render_tools(enum chat_tmpl t, const struct chat_msg *m, size_t n, const char *tools)
{
	struct chat_opts o = { .add_generation_prompt = 1, .date = "2025-08-05", .tools = tools };
	char err[ERR_LEN] = "", *out = NULL;
	size_t len;

	if (chat_render_opts(t, m, n, &o, &out, &len, err) != 0)
		fail_msg("%s: %s", chat_tmpl_name(t), err);
	return out;
}

/* A render that must be refused with a message containing needle. */
static void
refused(enum chat_tmpl t, const struct chat_msg *m, size_t n, const char *tools, const char *needle)
{
	struct chat_opts o = { .add_generation_prompt = 1, .date = "2025-08-05", .tools = tools };
	char err[ERR_LEN] = "", *out = NULL;
	size_t len;

	assert_int_equal(chat_render_opts(t, m, n, &o, &out, &len, err), ERR_INVAL);
	assert_null(out);
	if (strstr(err, needle) == NULL)
		fail_msg("%s: '%s' lacks '%s'", chat_tmpl_name(t), err, needle);
}

/* Both shapes come out in OpenAI's, keys in their order; what is not a tool list is refused by name. */
static void
test_tools_check(void **state)
{
	static const struct { const char *json, *needle; } bad[] = {
		{ "[", "tools is not JSON" },
		{ "{}", "a JSON array of 1..128 tools" },
		{ "[]", "a JSON array of 1..128 tools" },
		{ "[1]", "tools[0] is not an object" },
		{ "[{\"type\":\"code\",\"function\":{\"name\":\"a\"}}]", "tools[0]: type must be \"function\"" },
		{ "[{\"type\":\"function\",\"function\":[]}]", "tools[0]: function must be an object" },
		{ "[{\"name\":\"a b\"}]", "tools[0]: name must be 1..64" },
		{ "[{\"name\":\"\"}]", "tools[0]: name must be" },
		{ "[{\"name\":\"a\"},{\"name\":\"b\",\"description\":1}]", "tools[1]: description must be a string" },
		{ "[{\"name\":\"a\",\"parameters\":true}]", "tools[0]: parameters must be a JSON Schema object" },
		{ "[{\"name\":\"a\"},{\"name\":\"b\"},{\"name\":\"a\"}]", "tools[2]: the name 'a' is also tools[0]'s" },
	};
	struct strbuf many = { 0 };
	char err[ERR_LEN], *out;
	size_t i, n;

	(void)state;
	out = tools_ok();
	assert_non_null(strstr(out, "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\""));
	assert_true(chat_tools_has(out, "now"));
	assert_false(chat_tools_has(out, "no"));
	free(out);
	for (i = 0; i < ARRAY_LEN(bad); i++) {
		out = NULL;
		assert_int_equal(chat_tools_check(bad[i].json, &out, &n, err), ERR_INVAL);
		assert_null(out);
		if (strstr(err, bad[i].needle) == NULL)
			fail_msg("%s: '%s' lacks '%s'", bad[i].json, err, bad[i].needle);
	}
	strbuf_cat(&many, "[");
	for (i = 0; i <= CHAT_MAX_TOOLS; i++)
		strbuf_printf(&many, "%s{\"name\":\"t%zu\"}", i ? "," : "", i);
	strbuf_cat(&many, "]");
	assert_int_equal(chat_tools_check(many.s, &out, &n, err), ERR_INVAL);
	many.n = many.n - strlen(",{\"name\":\"t128\"}]");
	strbuf_cat(&many, "]");
	assert_int_equal(chat_tools_check(many.s, &out, &n, err), 0);
	assert_int_equal(n, CHAT_MAX_TOOLS);
	free(out), free(many.s);
}

/* json.dumps's spelling: Python's float repr, its escapes, and indent's layout (printed by python3). */
static void
test_py_json(void **state)
{
	static const struct { const char *in, *out; } cases[] = {
		{ "[1e16,1e15,0.0001,0.00001,100.0,1.5e300,-0.0,123456789.125,0.1,-40.5,5e-324,"
		  "1.7976931348623157e308,12345.678e10,0.5]",
		  "[1e+16, 1000000000000000.0, 0.0001, 1e-05, 100.0, 1.5e+300, -0.0, 123456789.125, 0.1, -40.5, "
		  "5e-324, 1.7976931348623157e+308, 123456780000000.0, 0.5]" },
		{ "{\"a\":\"\\u0001\x7f\xe2\x80\xa8/\\\"\\\\\",\"b\":[],\"c\":{},\"d\":[1,{\"e\":null}]}",
		  "{\"a\": \"\\u0001\x7f\xe2\x80\xa8/\\\"\\\\\", \"b\": [], \"c\": {}, \"d\": [1, {\"e\": null}]}" },
	};
	struct strbuf b = { 0 };
	json_t *v;
	size_t i;

	(void)state;
	for (i = 0; i < ARRAY_LEN(cases); i++) {
		v = chat_json(cases[i].in);
		assert_non_null(v);
		b.n = 0;
		chat_py_json(&b, v, 0);
		strbuf_add(&b, "", 1);
		assert_string_equal(b.s, cases[i].out);
		json_decref(v);
	}
	v = chat_json("{\"a\":[1,{\"b\":true}],\"c\":{}}");
	b.n = 0;
	chat_py_json(&b, v, 2);
	strbuf_add(&b, "", 1);
	assert_string_equal(b.s, "{\n  \"a\": [\n    1,\n    {\n      \"b\": true\n    }\n  ],\n  \"c\": {}\n}");
	json_decref(v);
	free(b.s);
}

/* Llama 3.1's layout with tools, and Gemma's documented prompt. */
static void
test_render_llama3_gemma(void **state)
{
	const struct chat_msg llama[] = { SYS_M, U_Q, { "assistant", "", NULL, calls2, 1, NULL, NULL }, T_1, A_FIN,
		U_2 };
	const struct chat_msg gemma[] = { SYS_M, U_Q, { "assistant", "Checking.", NULL, calls2, 2, NULL, NULL }, T_1,
		T_2, A_FIN, U_2 };
	char *tools = tools_ok(), *out;

	(void)state;
	out = render_tools(CHAT_LLAMA3, llama, ARRAY_LEN(llama), tools);
	assert_string_equal(out, LLAMA31_ROUND);
	free(out);
	out = render_tools(CHAT_GEMMA, gemma, ARRAY_LEN(gemma), tools);
	assert_string_equal(out, GEMMA_ROUND);
	free(out);
	free(tools);
}

/* What each family's template refuses of tools, calls and results. */
static void
test_tool_refusals(void **state)
{
	struct chat_call bad_args[] = { { "call00001", "f", "[1]" } }, bad_name[] = { { "call00001", "f g", "{}" } },
		short_id[] = { { "call1", "f", "{}" } };
	const struct chat_msg result[] = { U_Q, T_1 };
	const struct chat_msg two[] = { U_Q, { "assistant", "", NULL, calls2, 2, NULL, NULL } };
	const struct chat_msg args[] = { U_Q, { "assistant", "", NULL, bad_args, 1, NULL, NULL } };
	const struct chat_msg name[] = { U_Q, { "assistant", "", NULL, bad_name, 1, NULL, NULL } };
	const struct chat_msg user_calls[] = { { "user", "x", NULL, calls2, 1, NULL, NULL } };
	const struct chat_msg mistral_id[] = { U_Q, { "assistant", "", NULL, short_id, 1, NULL, NULL } };
	const struct chat_msg mistral_result[] = { U_Q, { "assistant", "", NULL, calls2, 1, NULL, NULL },
		{ "tool", "1", NULL, NULL, 0, "call1", NULL } };
	const struct chat_msg both[] = { U_Q, { "assistant", "a", "b", calls2, 1, NULL, NULL } };
	const struct chat_msg no_user[] = { SYS_M, A_FIN };
	char *tools = tools_ok();
	enum chat_tmpl none[] = { CHAT_RAW, CHAT_LLAMA2, CHAT_MISTRAL_V1 };

	(void)state;
	for (size_t i = 0; i < ARRAY_LEN(none); i++) {
		refused(none[i], result, 1, tools, "template has no tools");
		refused(none[i], result, 2, NULL, "message 1: the");
	}
	refused(CHAT_LLAMA3, two, 2, NULL, "message 1: the llama3 template renders one tool call a message");
	refused(CHAT_HARMONY, two, 2, NULL, "message 1: the harmony template renders one tool call a message");
	refused(CHAT_HARMONY, result, 2, NULL, "message 1: a tool result with no assistant tool call before it");
	refused(CHAT_HARMONY, both, 2, NULL, "refuses both content and reasoning beside a tool call");
	refused(CHAT_QWEN3, args, 2, NULL, "message 1: tool call 0's arguments are not the JSON text of an object");
	refused(CHAT_CHATML, name, 2, NULL, "message 1: tool call 0 has no valid name");
	refused(CHAT_GEMMA, user_calls, 1, NULL, "message 0: only an assistant message makes tool calls");
	refused(CHAT_MISTRAL, mistral_id, 2, NULL, "call ids of 9 letters or digits");
	refused(CHAT_MISTRAL, mistral_result, 3, NULL, "message 2: the mistral template needs the tool_call_id");
	refused(CHAT_LLAMA3, no_user, 2, tools, "the llama3 template puts the tools in the first user message");
	free(tools);
}

/* Parses raw output of family t: want calls named as listed (a NULL-ended list), or a failure (-1). */
static void
parse(enum chat_tmpl t, const char *raw, int want, const char *const *names, const char *args0)
{
	struct chat_call *calls;
	char err[ERR_LEN] = "";
	size_t n;
	int rc = chat_calls_parse(t, raw, strlen(raw), &calls, &n, err);

	if (rc != want)
		fail_msg("%s: %d calls, not %d (%s) in '%s'", chat_tmpl_name(t), rc, want, err, raw);
	for (size_t i = 0; rc > 0 && i < n; i++) {
		assert_string_equal(calls[i].name, names[i]);
		assert_true(strncmp(calls[i].id, "call_", 5) == 0 || t == CHAT_MISTRAL);
		assert_int_equal(strlen(calls[i].id), t == CHAT_MISTRAL ? 9 : 21);
	}
	if (rc > 0 && args0 != NULL)
		assert_string_equal(calls[0].arguments, args0);
	if (rc < 0)
		assert_non_null(strstr(err, "tool call"));
	chat_calls_free(calls, n);
}

/* Each family's calls, read back out of output as its model writes it; a broken call is an error. */
static void
test_parse(void **state)
{
	static const char *const gw[] = { "get_weather", "now", NULL };
	static const char args[] = "{\"city\": \"Paris\", \"days\": 2}";

	(void)state;
	parse(CHAT_QWEN3, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\",\"days\":2}}\n"
	    "</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>", 2, gw, args);
	parse(CHAT_CHATML, "Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": "
	    "\\\"Paris\\\", \\\"days\\\": 2}\"}", 1, gw, args);
	parse(CHAT_CHATML, "No call here.", 0, gw, NULL);
	parse(CHAT_QWEN3, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }\n</tool_call>", -1, gw,
	    NULL);
	parse(CHAT_QWEN3, "<tool_call>\n{\"name\": \"get weather\", \"arguments\": {}}\n</tool_call>", -1, gw, NULL);
	parse(CHAT_LLAMA3, " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"days\": 2}}", 1, gw,
	    args);
	parse(CHAT_LLAMA3, "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", "
	    "\"days\": 2}}", 1, gw, args);
	parse(CHAT_LLAMA3, "The weather is fine.", 0, gw, NULL);
	parse(CHAT_LLAMA3, "{\"name\": \"get_weather\"}", -1, gw, NULL);
	parse(CHAT_GEMMA, "```json\n{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"days\": 2}}\n```",
	    1, gw, args);
	parse(CHAT_MISTRAL, "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}},"
	    " {\"name\": \"now\", \"arguments\": {}}]", 2, gw, args);
	parse(CHAT_MISTRAL, "[TOOL_CALLS] [{\"name\": \"get_weather\"", -1, gw, NULL);
	parse(CHAT_MISTRAL, "Plain.", 0, gw, NULL);
	parse(CHAT_HARMONY, "<|channel|>analysis<|message|>Look it up.<|end|><|start|>assistant<|channel|>commentary "
	    "to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\",\"days\":2}<|call|>", 1, gw, args);
	parse(CHAT_HARMONY, " to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Paris\", "
	    "\"days\": 2}", 1, gw, args);
	parse(CHAT_HARMONY, "<|channel|>final<|message|>Hi.<|return|>", 0, gw, NULL);
	parse(CHAT_HARMONY, "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\"<|call|>",
	    -1, gw, NULL);
	parse(CHAT_LLAMA2, "{\"name\": \"get_weather\", \"parameters\": {}}", 0, gw, NULL);
}

/* Calls through the store's JSON text and back; ids are new each time. */
static void
test_calls_json(void **state)
{
	struct chat_call *back;
	char err[ERR_LEN], *text, a[CHAT_CALL_ID_LEN], b[CHAT_CALL_ID_LEN];
	size_t n;

	(void)state;
	text = chat_calls_json(calls2, 2);
	assert_int_equal(chat_calls_from_json(text, &back, &n, err), 0);
	assert_int_equal(n, 2);
	for (size_t i = 0; i < n; i++) {
		assert_string_equal(back[i].id, calls2[i].id);
		assert_string_equal(back[i].name, calls2[i].name);
		assert_string_equal(back[i].arguments, calls2[i].arguments);
	}
	chat_calls_free(back, n);
	free(text);
	assert_int_equal(chat_calls_from_json("[{\"id\":1}]", &back, &n, err), ERR_INVAL);
	chat_calls_free(back, n);
	chat_call_id(CHAT_QWEN3, a);
	chat_call_id(CHAT_QWEN3, b);
	assert_string_not_equal(a, b);
	chat_call_id(CHAT_MISTRAL, a);
	assert_int_equal(strlen(a), 9);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_tools_check),
		cmocka_unit_test(test_py_json),
		cmocka_unit_test(test_render_llama3_gemma),
		cmocka_unit_test(test_tool_refusals),
		cmocka_unit_test(test_parse),
		cmocka_unit_test(test_calls_json),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
