/*
 * test_openai.c: resident-http's translation between OpenAI's JSON and
 * resident's generate fields (contrib/http/api.c): requests parsed and
 * refused, response_format as the output's constraint, replies, stream
 * chunks and errors built; logprobs mapped and shown in OpenAI's shapes.
 */
#include "config.h"
#include "openai.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

static const char *const uuid = "0123abcd-4567-89ab-cdef-0123456789ab";

/* Parses body; asserts success. */
static void
parse_ok(enum api_kind kind, const char *body, const char *header, struct api_req *r)
{
	struct api_error e;

	if (api_parse(kind, body, strlen(body), header, r, &e) != 0)
		fail_msg("%s: %d %s", body, e.status, e.message);
}

/* Parses body; asserts a 400 about param (NULL: none) whose message holds what. */
static void
parse_bad(enum api_kind kind, const char *body, const char *header, const char *param, const char *what)
{
	struct api_error e;
	struct api_req r;

	if (api_parse(kind, body, strlen(body), header, &r, &e) == 0)
		fail_msg("%s: accepted", body);
	assert_int_equal(e.status, 400);
	assert_string_equal(e.type, "invalid_request_error");
	if (param == NULL)
		assert_null(e.param);
	else
		assert_string_equal(e.param, param);
	if (strstr(e.message, what) == NULL)
		fail_msg("%s: message '%s' does not say '%s'", body, e.message, what);
}

static const struct api_num *
num(const struct api_req *r, const char *key)
{
	int i;

	for (i = 0; i < r->n_nums; i++)
		if (strcmp(r->nums[i].key, key) == 0)
			return &r->nums[i];
	return NULL;
}

/* A chat request with one user message and these fields after it. */
#define CHAT(rest) "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]" rest "}"

static void
test_chat_request(void **state)
{
	struct api_req r;

	parse_ok(API_CHAT, "{\"model\": \"tiny\", \"messages\": [{\"role\": \"developer\", \"content\": \"Be brief.\"},"
	    "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\"}, {\"type\": \"text\", \"text\": \"b\"}]},"
	    "{\"role\": \"assistant\", \"content\": \"c\", \"name\": \"x\"}, {\"role\": \"user\", \"content\": \"d\"}],"
	    "\"max_tokens\": 7, \"max_completion_tokens\": 9, \"temperature\": 0, \"top_p\": 0.5, \"seed\": 42,"
	    "\"stop\": \"END\", \"n\": 1, \"user\": \"ignored\", \"logprobs\": false, \"tools\": [],"
	    "\"response_format\": {\"type\": \"text\"}, \"top_k\": 3, \"frequency_penalty\": null}", NULL, &r);
	assert_int_equal(r.kind, API_CHAT);
	assert_string_equal(r.model, "tiny");
	assert_int_equal(r.n_msgs, 4);
	assert_string_equal(r.msgs[0].role, "system");
	assert_string_equal(r.msgs[1].content, "a\nb");
	assert_string_equal(r.msgs[2].role, "assistant");
	assert_string_equal(r.msgs[3].content, "d");
	assert_null(r.prompt);
	assert_null(r.session);
	assert_false(r.stream);
	/* max_completion_tokens wins over the older max_tokens */
	assert_int_equal(num(&r, "max_tokens")->u, 9);
	assert_true(num(&r, "temperature")->f == 0.0 && !num(&r, "temperature")->is_uint);
	assert_true(num(&r, "top_p")->f == 0.5);
	assert_int_equal(num(&r, "seed")->u, 42);
	assert_int_equal(num(&r, "top_k")->u, 3);
	assert_null(num(&r, "frequency_penalty"));       /* null is not given */
	assert_int_equal(r.n_stop, 1);
	assert_string_equal(r.stop[0], "END");
	assert_null(r.think);                           /* no reasoning_effort: the daemon's default */
	api_req_free(&r);
	/* reasoning_effort: the daemon's think */
	parse_ok(API_CHAT, CHAT(", \"reasoning_effort\": \"minimal\""), NULL, &r);
	assert_string_equal(r.think, "low");
	api_req_free(&r);
	parse_ok(API_CHAT, CHAT(", \"reasoning_effort\": \"none\""), NULL, &r);
	assert_string_equal(r.think, "off");
	api_req_free(&r);
	/* OpenAI's seed is any int64: a negative one is the daemon's seed of the same 64 bits */
	parse_ok(API_CHAT, CHAT(", \"seed\": -1"), NULL, &r);
	assert_true(num(&r, "seed")->is_uint && num(&r, "seed")->u == UINT64_MAX);
	api_req_free(&r);
	parse_ok(API_COMPLETION, "{\"model\": \"m\", \"prompt\": \"x\", \"seed\": -9223372036854775808}", NULL, &r);
	assert_true(num(&r, "seed")->u == UINT64_C(1) << 63);
	api_req_free(&r);
}

static void
test_completion_request(void **state)
{
	struct api_req r;

	parse_ok(API_COMPLETION, "{\"model\": \"m\", \"prompt\": [\"Once\"], \"stream\": true,"
	    "\"stream_options\": {\"include_usage\": true}, \"stop\": [\"a\", \"b\"], \"echo\": false}", NULL, &r);
	assert_string_equal(r.prompt, "Once");
	assert_int_equal(r.n_msgs, 0);
	assert_true(r.stream);
	assert_true(r.include_usage);
	assert_int_equal(r.n_stop, 2);
	assert_string_equal(r.stop[1], "b");
	api_req_free(&r);
}

static void
test_bad_requests(void **state)
{
	static const struct {
		enum api_kind kind;
		const char *body, *param, *what;
	} bad[] = {
		{ API_CHAT, "{\"model\": \"m\", \"messages\": [", NULL, "not valid JSON" },
		{ API_CHAT, "[1]", NULL, "JSON object" },
		{ API_CHAT, "{\"model\": \"m\", \"model\": \"n\", \"messages\": []}", NULL, "duplicate" },
		{ API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", "model", "model is required" },
		{ API_CHAT, "{\"model\": \"m\"}", "messages", "messages is required" },
		{ API_CHAT, "{\"model\": \"m\", \"messages\": []}", "messages", "non-empty" },
		{ API_CHAT, "{\"model\": \"m\", \"messages\": [{\"role\": \"function\", \"content\": \"x\"}]}",
		  "messages", "role 'function'" },
		{ API_CHAT, "{\"model\": \"m\", \"messages\": [{\"role\": \"user\"}]}", "messages", "no content" },
		{ API_CHAT, "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": "
		  "[{\"type\": \"image_url\", \"image_url\": {}}]}]}", "messages", "only text parts" },
		{ API_CHAT, CHAT(", \"temperature\": \"hot\""), "temperature", "must be a number" },
		{ API_CHAT, CHAT(", \"max_tokens\": 0"), "max_tokens", "at least 1" },
		{ API_CHAT, CHAT(", \"seed\": 1.5"), "seed", "must be an integer" },
		{ API_CHAT, CHAT(", \"stop\": [1]"), "stop", "array of strings" },
		{ API_CHAT, CHAT(", \"reasoning_effort\": \"hard\""), "reasoning_effort", "must be \"none\"" },
		{ API_CHAT, CHAT(", \"n\": 9"), "n", "from 1 to 8" },
		{ API_CHAT, CHAT(", \"n\": 0"), "n", "from 1 to 8" },
		{ API_COMPLETION, "{\"model\": \"m\", \"prompt\": \"x\", \"n\": \"2\"}", "n", "from 1 to 8" },
		{ API_CHAT, CHAT(", \"functions\": [{\"name\": \"f\"}]"), "functions", "not supported" },
		{ API_CHAT, CHAT(", \"tools\": {\"type\": \"function\"}"), "tools", "must be an array" },
		{ API_CHAT, CHAT(", \"tool_choice\": \"auto\""), "tool_choice", "needs tools" },
		{ API_CHAT, CHAT(", \"tools\": [{}], \"tool_choice\": \"any\""), "tool_choice", "must be \"auto\"" },
		{ API_CHAT, CHAT(", \"tools\": [{}], \"tool_choice\": {\"type\": \"function\"}"), "tool_choice",
		  "must be \"auto\"" },
		{ API_CHAT, "{\"model\": \"m\", \"messages\": [{\"role\": \"assistant\", \"tool_calls\": "
		  "[{\"id\": \"c\", \"function\": {}}]}]}", "messages", "tool_calls[0] must be" },
		{ API_CHAT, "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"tool_calls\": []}]}", "messages",
		  "on an assistant message" },
		{ API_CHAT, "{\"model\": \"m\", \"messages\": [{\"role\": \"assistant\"}]}", "messages", "no content" },
		{ API_COMPLETION, "{\"model\": \"m\", \"prompt\": \"x\", \"tools\": [{}]}", "tools", "chat/completions" },
		{ API_CHAT, CHAT(", \"response_format\": {\"type\": \"xml\"}"), "response_format",
		  "type 'xml' is not supported" },
		{ API_CHAT, CHAT(", \"stream\": \"yes\""), "stream", "boolean" },
		{ API_CHAT, CHAT(", \"stream_options\": {\"include_usage\": true}"), "stream_options",
		  "only allowed when stream" },
		{ API_COMPLETION, "{\"model\": \"m\", \"prompt\": [1, 2]}", "prompt", "a string" },
		{ API_COMPLETION, "{\"model\": \"m\", \"prompt\": \"x\", \"echo\": true}", "echo", "not supported" },
		{ API_COMPLETION, "{\"model\": \"m\", \"prompt\": \"x\", \"best_of\": 3}", "best_of", "1" },
	};
	size_t i;

	for (i = 0; i < sizeof bad / sizeof bad[0]; i++)
		parse_bad(bad[i].kind, bad[i].body, NULL, bad[i].param, bad[i].what);
}

/*
 * Tools: OpenAI's list as the daemon's JSON text, tool_choice as its
 * tool_choice or tool_name, an assistant message's calls (arguments given
 * as an object taken as its text; content may be null) and a tool result.
 */
static void
test_tools(void **state)
{
	struct api_req r;

	(void)state;
	parse_ok(API_CHAT, "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"w?\"}, "
	    "{\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"call_1\", \"type\": \"function\", "
	    "\"function\": {\"name\": \"get\", \"arguments\": \"{\\\"a\\\": 1}\"}}, {\"type\": \"function\", "
	    "\"function\": {\"name\": \"now\", \"arguments\": {\"z\": \"UTC\"}}}]}, "
	    "{\"role\": \"tool\", \"tool_call_id\": \"call_1\", \"content\": \"21\"}], "
	    "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get\", \"parameters\": {}}}], "
	    "\"tool_choice\": \"required\", \"parallel_tool_calls\": true}", NULL, &r);
	assert_string_equal(r.tools, "[{\"type\":\"function\",\"function\":{\"name\":\"get\",\"parameters\":{}}}]");
	assert_string_equal(r.tool_choice, "required");
	assert_null(r.tool_name);
	assert_int_equal(r.n_msgs, 3);
	assert_string_equal(r.msgs[1].content, "");
	assert_int_equal(r.msgs[1].n_calls, 2);
	assert_string_equal(r.msgs[1].calls[0].id, "call_1");
	assert_string_equal(r.msgs[1].calls[0].arguments, "{\"a\": 1}");
	assert_null(r.msgs[1].calls[1].id);
	assert_string_equal(r.msgs[1].calls[1].arguments, "{\"z\":\"UTC\"}");
	assert_string_equal(r.msgs[2].role, "tool");
	assert_string_equal(r.msgs[2].tool_call_id, "call_1");
	assert_null(r.msgs[2].name);
	/* held back while it may be a call: only with tools, and not with tool_choice none */
	assert_true(api_tools_may_call(&r, " {\"na"));
	assert_true(api_tools_may_call(&r, "```"));
	assert_true(api_tools_may_call(&r, "``"));
	assert_true(api_tools_may_call(&r, "\n"));
	assert_false(api_tools_may_call(&r, "It is"));
	r.tool_choice = "none";
	assert_false(api_tools_may_call(&r, "{"));
	api_req_free(&r);
	parse_ok(API_CHAT, CHAT(", \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get\"}}], "
	    "\"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"get\"}}"), NULL, &r);
	assert_null(r.tool_choice);
	assert_string_equal(r.tool_name, "get");
	api_req_free(&r);
	parse_ok(API_CHAT, CHAT(", \"tools\": []"), NULL, &r);
	assert_null(r.tools);
	assert_false(api_tools_may_call(&r, "{"));
	api_req_free(&r);
}

/* Parses a chat request with these fields; asserts its constraint (NULL: none) and text. */
static void
constraint_is(const char *fields, const char *constraint, const char *text)
{
	char body[1024];
	struct api_req r;

	snprintf(body, sizeof body, CHAT("%s"), fields);
	parse_ok(API_CHAT, body, NULL, &r);
	if (constraint == NULL)
		assert_null(r.constraint);
	else
		assert_string_equal(r.constraint, constraint);
	if (text == NULL)
		assert_null(r.constraint_text);
	else
		assert_string_equal(r.constraint_text, text);
	api_req_free(&r);
}

static void
test_constraints(void **state)
{
	static const struct {
		const char *fields, *param, *what;
	} bad[] = {
		{ ", \"response_format\": \"json\"", "response_format", "an object with a type" },
		{ ", \"response_format\": {\"json_schema\": {}}", "response_format", "an object with a type" },
		{ ", \"response_format\": {\"type\": \"grammar\"}", "response_format", "'grammar' is not supported" },
		{ ", \"response_format\": {\"type\": \"json_schema\"}", "response_format",
		  "json_schema must be an object" },
		{ ", \"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"x\"}}",
		  "response_format", "schema must be a JSON Schema" },
		{ ", \"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"schema\": [1]}}",
		  "response_format", "schema must be a JSON Schema" },
		{ ", \"grammar\": {\"root\": 1}", "grammar", "grammar must be a string" },
		{ ", \"grammar\": \"root ::= [a-z]+\", \"response_format\": {\"type\": \"json_object\"}", "grammar",
		  "give one of them" },
	};
	char body[512];
	struct api_req r;
	size_t i;

	constraint_is("", NULL, NULL);
	constraint_is(", \"response_format\": {\"type\": \"text\"}", NULL, NULL);
	constraint_is(", \"response_format\": null", NULL, NULL);
	constraint_is(", \"response_format\": {\"type\": \"json_object\"}", "json", NULL);
	/* the schema's JSON text, its keys in their order (properties' order is the output's) */
	constraint_is(", \"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"point\", "
	    "\"strict\": true, \"schema\": {\"type\": \"object\", \"properties\": {\"y\": {\"type\": \"integer\"}, "
	    "\"x\": {\"enum\": [1.5, \"\u00e9\", null]}}, \"required\": [\"y\", \"x\"], "
	    "\"additionalProperties\": false}}}",
	    "json_schema", "{\"type\":\"object\",\"properties\":{\"y\":{\"type\":\"integer\"},\"x\":{\"enum\":"
	    "[1.5,\"\u00e9\",null]}},\"required\":[\"y\",\"x\"],\"additionalProperties\":false}");
	/* strict false and no name: the daemon holds the output to the schema all the same */
	constraint_is(", \"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"schema\": true, "
	    "\"strict\": false}}", "json_schema", "true");
	constraint_is(", \"grammar\": \"root ::= \\\"yes\\\" | \\\"no\\\"\"", "grammar", "root ::= \"yes\" | \"no\"");
	constraint_is(", \"grammar\": \"root ::= [a-z]+\", \"response_format\": {\"type\": \"text\"}", "grammar",
	    "root ::= [a-z]+");
	/* completions take them too */
	parse_ok(API_COMPLETION, "{\"model\": \"m\", \"prompt\": \"p\", "
	    "\"response_format\": {\"type\": \"json_object\"}}", NULL, &r);
	assert_string_equal(r.constraint, "json");
	api_req_free(&r);
	for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		snprintf(body, sizeof body, CHAT("%s"), bad[i].fields);
		parse_bad(API_CHAT, body, NULL, bad[i].param, bad[i].what);
	}
}

static void
test_sessions(void **state)
{
	static const char msgs[] = "\"messages\": [{\"role\": \"system\", \"content\": \"S\"}, "
	    "{\"role\": \"user\", \"content\": \"U\"}]";
	char body[512];
	struct api_req r;

	/* a new session takes the leading system message as its system prompt */
	snprintf(body, sizeof body, "{\"model\": \"m\", \"session\": \"new\", %s}", msgs);
	parse_ok(API_CHAT, body, NULL, &r);
	assert_string_equal(r.session, "new");
	assert_string_equal(r.system, "S");
	assert_int_equal(r.n_msgs, 1);
	assert_string_equal(r.msgs[0].content, "U");
	api_req_free(&r);
	/* a session's id, from the header, uppercase accepted; its messages stay as sent */
	snprintf(body, sizeof body, "{\"model\": \"m\", %s}", msgs);
	parse_ok(API_CHAT, body, "0123ABCD-4567-89AB-CDEF-0123456789AB", &r);
	assert_string_equal(r.session, uuid);
	assert_null(r.system);
	assert_int_equal(r.n_msgs, 2);
	api_req_free(&r);
	/* the same in the body and the header is fine */
	snprintf(body, sizeof body, "{\"model\": \"m\", \"session\": \"%s\", %s}", uuid, msgs);
	parse_ok(API_CHAT, body, uuid, &r);
	api_req_free(&r);
	parse_bad(API_CHAT, body, "new", "session", "differ");
	snprintf(body, sizeof body, "{\"model\": \"m\", \"session\": \"abc\", %s}", msgs);
	parse_bad(API_CHAT, body, NULL, "session", "8-4-4-4-12");
	snprintf(body, sizeof body, "{\"model\": \"m\", \"session\": 5, %s}", msgs);
	parse_bad(API_CHAT, body, NULL, "session", "must be a string");
	parse_bad(API_CHAT, "{\"model\": \"m\", \"session\": \"new\", \"messages\": "
	    "[{\"role\": \"system\", \"content\": \"S\"}]}", NULL, "messages", "more than the system message");
	parse_bad(API_COMPLETION, "{\"model\": \"m\", \"prompt\": \"p\"}", uuid, "session", "chat/completions");
}

/* Asserts that the JSON text of j equals want; frees j. */
static void
json_is(json_t *j, const char *want)
{
	char *s = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);

	assert_non_null(s);
	if (strcmp(s, want) != 0)
		fail_msg("got  %s\nwant %s", s, want);
	free(s);
	json_decref(j);
}

/* A reply of one choice (api_reply, api_add_choice); *choice (if not NULL) gets that choice. */
static json_t *
reply1(const struct api_req *r, const struct api_meta *m, const char *text, const char *reasoning,
    const char *finish_reason, const struct api_usage *u, json_t **choice)
{
	json_t *o = api_reply(r, m, u), *c = api_add_choice(r, o, text, reasoning, finish_reason);

	if (choice != NULL)
		*choice = c;
	return o;
}

static void
test_replies(void **state)
{
	struct api_req chat = { .kind = API_CHAT }, cmpl = { .kind = API_COMPLETION, .include_usage = 1 };
	struct api_meta m = { .id = "chatcmpl-1", .created = 5, .model = "tiny" };
	struct api_usage u = { .prompt = 10, .cached = 4, .generated = 3 };
	json_t *o;

	json_is(reply1(&chat, &m, "Hi", NULL, "stop", &u, NULL),
	    "{\"choices\":[{\"finish_reason\":\"stop\",\"index\":0,\"logprobs\":null,\"message\":{\"content\":\"Hi\","
	    "\"role\":\"assistant\"}}],\"created\":5,\"id\":\"chatcmpl-1\",\"model\":\"tiny\",\"object\":"
	    "\"chat.completion\",\"usage\":{\"completion_tokens\":3,\"prompt_tokens\":10,\"prompt_tokens_details\":"
	    "{\"cached_tokens\":4},\"total_tokens\":13}}");
	json_is(api_chunk(&chat, &m, 0, "", NULL, 1, NULL, NULL),
	    "{\"choices\":[{\"delta\":{\"content\":\"\",\"role\":\"assistant\"},\"finish_reason\":null,\"index\":0,"
	    "\"logprobs\":null}],\"created\":5,\"id\":\"chatcmpl-1\",\"model\":\"tiny\",\"object\":"
	    "\"chat.completion.chunk\"}");
	json_is(api_chunk(&chat, &m, 0, NULL, "", 0, "length", NULL),
	    "{\"choices\":[{\"delta\":{},\"finish_reason\":\"length\",\"index\":0,\"logprobs\":null}],\"created\":5,"
	    "\"id\":\"chatcmpl-1\",\"model\":\"tiny\",\"object\":\"chat.completion.chunk\"}");
	/* reasoning beside the answer, as llama-server's and vLLM's reasoning_content */
	json_is(reply1(&chat, &m, "Hi", "Greet.", "stop", &u, NULL),
	    "{\"choices\":[{\"finish_reason\":\"stop\",\"index\":0,\"logprobs\":null,\"message\":{\"content\":\"Hi\","
	    "\"reasoning_content\":\"Greet.\",\"role\":\"assistant\"}}],\"created\":5,\"id\":\"chatcmpl-1\",\"model\":"
	    "\"tiny\",\"object\":\"chat.completion\",\"usage\":{\"completion_tokens\":3,\"prompt_tokens\":10,"
	    "\"prompt_tokens_details\":{\"cached_tokens\":4},\"total_tokens\":13}}");
	json_is(api_chunk(&chat, &m, 0, NULL, "Hm", 0, NULL, NULL),
	    "{\"choices\":[{\"delta\":{\"reasoning_content\":\"Hm\"},\"finish_reason\":null,\"index\":0,"
	    "\"logprobs\":null}],\"created\":5,\"id\":\"chatcmpl-1\",\"model\":\"tiny\",\"object\":"
	    "\"chat.completion.chunk\"}");
	m.session = uuid;
	json_is(api_chunk(&cmpl, &m, 0, "x\"y", NULL, 0, NULL, NULL),
	    "{\"choices\":[{\"finish_reason\":null,\"index\":0,\"logprobs\":null,\"text\":\"x\\\"y\"}],\"created\":5,"
	    "\"id\":\"chatcmpl-1\",\"model\":\"tiny\",\"object\":\"text_completion\",\"session\":"
	    "\"0123abcd-4567-89ab-cdef-0123456789ab\",\"usage\":null}");
	m.session = NULL;
	/* several choices: each its index, in a reply and in chunks */
	o = api_reply(&cmpl, &m, &u);
	api_add_choice(&cmpl, o, "a", NULL, "stop");
	api_add_choice(&cmpl, o, "b", NULL, "length");
	json_is(json_incref(json_object_get(o, "choices")),
	    "[{\"finish_reason\":\"stop\",\"index\":0,\"logprobs\":null,\"text\":\"a\"},"
	    "{\"finish_reason\":\"length\",\"index\":1,\"logprobs\":null,\"text\":\"b\"}]");
	json_decref(o);
	json_is(json_incref(json_object_get(o = api_chunk(&chat, &m, 7, "z", NULL, 1, NULL, NULL), "choices")),
	    "[{\"delta\":{\"content\":\"z\",\"role\":\"assistant\"},\"finish_reason\":null,\"index\":7,"
	    "\"logprobs\":null}]");
	json_decref(o);
	json_is(api_usage_chunk(&cmpl, &m, &u),
	    "{\"choices\":[],\"created\":5,\"id\":\"chatcmpl-1\",\"model\":\"tiny\",\"object\":\"text_completion\","
	    "\"usage\":{\"completion_tokens\":3,\"prompt_tokens\":10,\"prompt_tokens_details\":{\"cached_tokens\":4},"
	    "\"total_tokens\":13}}");
	json_is(api_model("tiny"), "{\"created\":0,\"id\":\"tiny\",\"object\":\"model\",\"owned_by\":\"resident\"}");
	assert_string_equal(api_finish_reason("stop"), "stop");
	assert_string_equal(api_finish_reason("context"), "length");
	assert_null(api_finish_reason("cancel"));
}

static void
test_logprobs_requests(void **state)
{
	static const struct {
		enum api_kind kind;
		const char *body, *param, *what;
	} bad[] = {
		{ API_CHAT, CHAT(", \"logprobs\": 1"), "logprobs", "must be a boolean" },
		{ API_CHAT, CHAT(", \"logprobs\": true, \"top_logprobs\": 21"), "top_logprobs", "from 0 to 20" },
		{ API_CHAT, CHAT(", \"logprobs\": true, \"top_logprobs\": -1"), "top_logprobs", "from 0 to 20" },
		{ API_CHAT, CHAT(", \"logprobs\": true, \"top_logprobs\": 2.5"), "top_logprobs", "from 0 to 20" },
		{ API_CHAT, CHAT(", \"top_logprobs\": 3"), "top_logprobs", "needs logprobs: true" },
		{ API_CHAT, CHAT(", \"logprobs\": false, \"top_logprobs\": 3"), "top_logprobs", "needs logprobs" },
		{ API_COMPLETION, "{\"model\": \"m\", \"prompt\": \"x\", \"logprobs\": 6}", "logprobs", "from 0 to 5" },
		{ API_COMPLETION, "{\"model\": \"m\", \"prompt\": \"x\", \"logprobs\": true}", "logprobs", "from 0 to 5" },
		{ API_COMPLETION, "{\"model\": \"m\", \"prompt\": \"x\", \"logprobs\": 2, \"top_logprobs\": 2}",
		  "top_logprobs", "field of chat completions" },
	};
	struct api_req r;
	rs_params *p;
	size_t i;

	/* chat: logprobs true and top_logprobs, no longer refused */
	parse_ok(API_CHAT, CHAT(", \"logprobs\": true, \"top_logprobs\": 20"), NULL, &r);
	assert_true(r.logprobs);
	assert_int_equal(r.top_logprobs, 20);
	assert_non_null(p = api_params(&r));
	rs_params_free(p);
	api_req_free(&r);
	parse_ok(API_CHAT, CHAT(", \"logprobs\": true"), NULL, &r);
	assert_true(r.logprobs);
	assert_int_equal(r.top_logprobs, 0);
	api_req_free(&r);
	parse_ok(API_CHAT, CHAT(", \"logprobs\": false, \"top_logprobs\": 0"), NULL, &r);
	assert_false(r.logprobs);
	api_req_free(&r);
	parse_ok(API_CHAT, CHAT(", \"logprobs\": null, \"top_logprobs\": null"), NULL, &r);
	assert_false(r.logprobs);
	api_req_free(&r);
	/* completions: logprobs N is the number of top tokens, 0 included */
	parse_ok(API_COMPLETION, "{\"model\": \"m\", \"prompt\": \"x\", \"logprobs\": 5}", NULL, &r);
	assert_true(r.logprobs);
	assert_int_equal(r.top_logprobs, 5);
	api_req_free(&r);
	parse_ok(API_COMPLETION, "{\"model\": \"m\", \"prompt\": \"x\", \"logprobs\": 0}", NULL, &r);
	assert_true(r.logprobs);
	assert_int_equal(r.top_logprobs, 0);
	api_req_free(&r);
	parse_ok(API_COMPLETION, "{\"model\": \"m\", \"prompt\": \"x\"}", NULL, &r);
	assert_false(r.logprobs);
	api_req_free(&r);
	for (i = 0; i < sizeof bad / sizeof bad[0]; i++)
		parse_bad(bad[i].kind, bad[i].body, NULL, bad[i].param, bad[i].what);
	/* several choices, with logprobs too */
	parse_ok(API_CHAT, CHAT(", \"logprobs\": true, \"n\": 8"), NULL, &r);
	assert_int_equal(r.n, 8);
	api_req_free(&r);
	parse_ok(API_COMPLETION, "{\"model\": \"m\", \"prompt\": \"x\"}", NULL, &r);
	assert_int_equal(r.n, 1);
	api_req_free(&r);
	parse_bad(API_COMPLETION, "{\"model\": \"m\", \"prompt\": \"x\", \"logprobs\": 1, \"echo\": true}", NULL,
	    "echo", "not supported");
}

#define TOK(s, lp) { s, sizeof s - 1, lp }

static void
test_logprobs_chat(void **state)
{
	struct api_req r = { .kind = API_CHAT, .logprobs = 1, .top_logprobs = 2 };
	struct api_meta m = { .id = "chatcmpl-1", .created = 5, .model = "tiny" };
	struct api_usage u = { .prompt = 10, .generated = 3 };
	struct api_logprobs lp = { 0 };
	/* the first half of a character, then its end: each U+FFFD, bytes exact */
	const struct api_lp_token t1 = TOK("\xe4\xbd", -0.5), top1[] = { TOK("\xe4\xbd", -0.5), TOK("A", -1.25),
	    TOK("B", -2.0) };
	const struct api_lp_token t2 = TOK("\xa0", -INFINITY), top2[] = { TOK("\xc3\xa9", -0.25) };
	json_t *o, *ch;

	/* a reply that is not streamed: every token */
	assert_int_equal(api_logprobs_add(&r, &lp, &t1, top1, 3), 0);  /* 3 given, 2 asked for */
	assert_int_equal(api_logprobs_add(&r, &lp, &t2, top2, 1), 0);
	o = reply1(&r, &m, "\xe4\xbd\xa0", NULL, "stop", &u, &ch);
	api_set_logprobs(ch, api_logprobs_take(&r, &lp));
	json_is(json_incref(json_object_get(json_array_get(json_object_get(o, "choices"), 0), "logprobs")),
	    "{\"content\":["
	    "{\"bytes\":[228,189],\"logprob\":-0.5,\"token\":\"\xef\xbf\xbd\",\"top_logprobs\":["
	    "{\"bytes\":[228,189],\"logprob\":-0.5,\"token\":\"\xef\xbf\xbd\"},"
	    "{\"bytes\":[65],\"logprob\":-1.25,\"token\":\"A\"}]},"
	    "{\"bytes\":[160],\"logprob\":-9999.0,\"token\":\"\xef\xbf\xbd\",\"top_logprobs\":["
	    "{\"bytes\":[195,169],\"logprob\":-0.25,\"token\":\"\xc3\xa9\"}]}]}");
	assert_string_equal(json_string_value(json_object_get(json_object_get(json_array_get(json_object_get(o,
	    "choices"), 0), "message"), "content")), "\xe4\xbd\xa0");
	json_decref(o);
	/* streamed: a chunk has the tokens added since the last */
	r.top_logprobs = 0;
	assert_int_equal(api_logprobs_add(&r, &lp, &t1, top1, 0), 0);
	o = api_chunk(&r, &m, 0, "", NULL, 0, NULL, api_logprobs_take(&r, &lp));
	json_is(o, "{\"choices\":[{\"delta\":{\"content\":\"\"},\"finish_reason\":null,\"index\":0,\"logprobs\":"
	    "{\"content\":[{\"bytes\":[228,189],\"logprob\":-0.5,\"token\":\"\xef\xbf\xbd\",\"top_logprobs\":[]}]}}],"
	    "\"created\":5,\"id\":\"chatcmpl-1\",\"model\":\"tiny\",\"object\":\"chat.completion.chunk\"}");
	json_is(api_logprobs_take(&r, &lp), "{\"content\":[]}");
	/* NULL sets nothing */
	o = reply1(&r, &m, "x", NULL, "stop", &u, &ch);
	api_set_logprobs(ch, NULL);
	assert_true(json_is_null(json_object_get(ch, "logprobs")));
	json_decref(o);
	api_logprobs_free(&lp);
}

/* The token string of bytes, by the completions' shape. */
static void
token_string_is(const char *bytes, size_t len, const char *want, size_t chars)
{
	struct api_req r = { .kind = API_COMPLETION, .logprobs = 1 };
	struct api_logprobs lp = { 0 };
	const struct api_lp_token t = { bytes, len, -1.0 }, next = TOK("x", -1.0);
	json_t *o;

	assert_int_equal(api_logprobs_add(&r, &lp, &t, NULL, 0), 0);
	assert_int_equal(api_logprobs_add(&r, &lp, &next, NULL, 0), 0);
	o = api_logprobs_take(&r, &lp);
	if (strcmp(json_string_value(json_array_get(json_object_get(o, "tokens"), 0)), want) != 0)
		fail_msg("%zu bytes: got '%s' want '%s'", len, json_string_value(json_array_get(json_object_get(o,
		    "tokens"), 0)), want);
	/* text_offset counts the token string's characters */
	assert_int_equal(json_integer_value(json_array_get(json_object_get(o, "text_offset"), 1)), chars);
	json_decref(o);
	api_logprobs_free(&lp);
}

#define FFFD "\xef\xbf\xbd"

static void
test_logprobs_utf8(void **state)
{
	/* as Python's bytes.decode("utf-8", "replace") */
	token_string_is("\xe4\xbd", 2, FFFD, 1);
	token_string_is("\xa0", 1, FFFD, 1);
	token_string_is("A\xff" "B", 3, "A" FFFD "B", 3);
	token_string_is("\xf0\x9f\x98", 3, FFFD, 1);
	token_string_is("\xf0\x9f\x98\x80", 4, "\xf0\x9f\x98\x80", 1);
	token_string_is("\xed\xa0\x80", 3, FFFD FFFD FFFD, 3);         /* a surrogate */
	token_string_is("\xe0\x80\xaf", 3, FFFD FFFD FFFD, 3);         /* overlong */
	token_string_is("\xf4\x90\x80\x80", 4, FFFD FFFD FFFD FFFD, 4); /* past U+10FFFF */
	token_string_is("\xc3", 1, FFFD, 1);
	token_string_is("\xe4\xbd" "A", 3, FFFD "A", 2);
	token_string_is("\xc3\xa9t\xc3\xa9", 5, "\xc3\xa9t\xc3\xa9", 3);
	token_string_is("", 0, "", 0);
}

static void
test_logprobs_completion(void **state)
{
	struct api_req r = { .kind = API_COMPLETION, .logprobs = 1, .top_logprobs = 3 };
	struct api_meta m = { .id = "cmpl-1", .created = 5, .model = "tiny" };
	struct api_usage u = { .prompt = 10, .generated = 3 };
	struct api_logprobs lp = { 0 };
	/* two top tokens with one string (two U+FFFD): the better one stays */
	const struct api_lp_token t1 = TOK(" caf", -0.5), top1[] = { TOK(" caf", -0.5), TOK("\xe4\xbd", -1.5),
	    TOK("\xe5", -2.5), TOK("z", -3.0) };
	const struct api_lp_token t2 = TOK("\xc3\xa9", -INFINITY), top2[] = { TOK("\xc3\xa9", -NAN) };
	json_t *o, *ch;

	assert_int_equal(api_logprobs_add(&r, &lp, &t1, top1, 4), 0);
	assert_int_equal(api_logprobs_add(&r, &lp, &t2, top2, 1), 0);
	o = reply1(&r, &m, " caf\xc3\xa9", NULL, "length", &u, &ch);
	api_set_logprobs(ch, api_logprobs_take(&r, &lp));
	json_is(o, "{\"choices\":[{\"finish_reason\":\"length\",\"index\":0,\"logprobs\":{"
	    "\"text_offset\":[0,4],\"token_logprobs\":[-0.5,-9999.0],\"tokens\":[\" caf\",\"\xc3\xa9\"],"
	    "\"top_logprobs\":[{\" caf\":-0.5,\"\xef\xbf\xbd\":-1.5},{\"\xc3\xa9\":-9999.0}]},\"text\":\" caf\xc3\xa9\"}],"
	    "\"created\":5,\"id\":\"cmpl-1\",\"model\":\"tiny\",\"object\":\"text_completion\",\"usage\":"
	    "{\"completion_tokens\":3,\"prompt_tokens\":10,\"prompt_tokens_details\":{\"cached_tokens\":0},"
	    "\"total_tokens\":13}}");
	/* streamed: text_offset goes on from the last chunk's; logprobs 0: no top tokens */
	r.top_logprobs = 0;
	assert_int_equal(api_logprobs_add(&r, &lp, &t1, top1, 4), 0);
	o = api_chunk(&r, &m, 0, " caf", NULL, 0, NULL, api_logprobs_take(&r, &lp));
	json_is(json_incref(json_object_get(json_array_get(json_object_get(o, "choices"), 0), "logprobs")),
	    "{\"text_offset\":[5],\"token_logprobs\":[-0.5],\"tokens\":[\" caf\"],\"top_logprobs\":[{}]}");
	json_decref(o);
	api_logprobs_free(&lp);
}

static void
test_meta_ids(void **state)
{
	struct api_meta a, b;

	api_meta_init(&a, API_CHAT, "m");
	api_meta_init(&b, API_COMPLETION, "m");
	assert_int_equal(strncmp(a.id, "chatcmpl-", 9), 0);
	assert_int_equal(strlen(a.id), 9 + 24);
	assert_int_equal(strncmp(b.id, "cmpl-", 5), 0);
	assert_string_not_equal(a.id + 9, b.id + 5);
	assert_true(a.created > 1700000000);
}

static void
test_errors(void **state)
{
	static const struct { rs_status st; int status; const char *code; } map[] = {
		{ RS_ERR_INVALID_PARAM, 400, "invalid_param" }, { RS_ERR_CONTEXT_EXCEEDED, 400, "context_length_exceeded" },
		{ RS_ERR_NOT_FOUND, 404, "not_found" }, { RS_ERR_FRAME_TOO_LARGE, 413, "request_too_large" },
		{ RS_ERR_OVERLOADED, 429, "overloaded" }, { RS_ERR_SHUTTING_DOWN, 503, "shutting_down" },
		{ RS_ERR_CONNECT, 503, "daemon_unavailable" }, { RS_ERR_IO, 502, "daemon_connection_lost" },
		{ RS_ERR_MODEL_ERROR, 500, "model_error" }, { RS_ERR_INTERNAL, 500, "internal" },
		/* not 500s, which clients retry as the server's fault */
		{ RS_ERR_SESSION_BUSY, 409, "session_busy" }, { RS_ERR_QUOTA_EXCEEDED, 429, "quota_exceeded" },
		{ RS_ERR_STORAGE_FULL, 507, "storage_full" }, { RS_ERR_FRAME_TIMEOUT, 503, "frame_timeout" },
	};
	struct api_error e;
	size_t i;

	for (i = 0; i < sizeof map / sizeof map[0]; i++) {
		api_error_from_status(map[i].st, "why", &e);
		assert_int_equal(e.status, map[i].status);
		assert_string_equal(e.code, map[i].code);
		assert_string_equal(e.message, "why");
	}
	api_error_set(&e, 404, "invalid_request_error", "model", "model_not_found", "no %s", "x");
	json_is(api_error_json(&e), "{\"error\":{\"code\":\"model_not_found\",\"message\":\"no x\",\"param\":\"model\","
	    "\"type\":\"invalid_request_error\"}}");
	api_error_set(&e, 500, "server_error", NULL, NULL, "bad");
	json_is(api_error_json(&e), "{\"error\":{\"code\":null,\"message\":\"bad\",\"param\":null,\"type\":\"server_error\"}}");
}

/* A message too long for its buffer is cut before a character it would split, in both APIs' shapes. */
static void
test_error_cut_utf8(void **state)
{
	static const char *const chars[] = { "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80" }; /* é € 😀 */
	char text[1300];
	struct api_error e;
	size_t c, lead, n;
	json_t *j;

	for (c = 0; c < 3; c++)
		for (lead = 0; lead < 4; lead++) {       /* every position of the cut within a character */
			memset(text, 'a', lead);
			text[lead] = '\0';
			for (n = 0; n < 300; n++)
				strcat(text, chars[c]);
			api_error_set(&e, 404, "invalid_request_error", NULL, NULL, "%s", text);
			n = strlen(e.message);
			assert_true(n > sizeof e.message - 5 && n < sizeof e.message);
			assert_int_equal((n - lead) % strlen(chars[c]), 0);
			assert_memory_equal(e.message, text, n);
			j = api_error_json(&e);
			assert_int_equal(strlen(json_string_value(json_object_get(json_object_get(j, "error"), "message"))), n);
			json_decref(j);
			j = ollama_error_json(&e);
			assert_int_equal(strlen(json_string_value(json_object_get(j, "error"))), n);
			json_decref(j);
		}
	/* a message that fits is left whole, also one that ends the buffer exactly */
	memset(text, 'b', sizeof e.message - 1);
	text[sizeof e.message - 1] = '\0';
	api_error_set(&e, 400, "invalid_request_error", NULL, NULL, "%s", text);
	assert_string_equal(e.message, text);
	api_error_set(&e, 400, "invalid_request_error", NULL, NULL, "%s", "\xc3\xa9t\xc3\xa9");
	assert_string_equal(e.message, "\xc3\xa9t\xc3\xa9");
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_chat_request),
		cmocka_unit_test(test_completion_request),
		cmocka_unit_test(test_bad_requests),
		cmocka_unit_test(test_constraints),
		cmocka_unit_test(test_tools),
		cmocka_unit_test(test_sessions),
		cmocka_unit_test(test_replies),
		cmocka_unit_test(test_logprobs_requests),
		cmocka_unit_test(test_logprobs_chat),
		cmocka_unit_test(test_logprobs_utf8),
		cmocka_unit_test(test_logprobs_completion),
		cmocka_unit_test(test_meta_ids),
		cmocka_unit_test(test_errors),
		cmocka_unit_test(test_error_cut_utf8),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
