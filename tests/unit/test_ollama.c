/*
 * test_ollama.c: resident-http's translation between Ollama's JSON and
 * resident's (contrib/http/ollama_api.c): /api/chat and /api/generate
 * parsed into generate fields (options, format, think, keep_alive, tools,
 * a random seed) or refused, empty requests as loads and unloads, model
 * names resolved, durations as Go writes them, and the replies' objects:
 * stream chunks, the last object's counts and nanoseconds, tool calls,
 * /api/tags, /api/ps and /api/show of the daemon's results, errors.
 */
#include "config.h"
#include "openai.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

/* Parses body for d; asserts success and the action. */
static void
parse_ok(enum api_dialect d, const char *body, struct api_req *r, enum ollama_action want)
{
	enum ollama_action action;
	struct api_error e;

	if (ollama_parse(d, body, strlen(body), r, &action, &e) != 0)
		fail_msg("%s: %d %s", body, e.status, e.message);
	assert_int_equal(action, want);
}

/* Parses body; asserts a 400 whose message holds what. */
static void
parse_bad(enum api_dialect d, const char *body, const char *what)
{
	enum ollama_action action;
	struct api_error e;
	struct api_req r;

	if (ollama_parse(d, body, strlen(body), &r, &action, &e) == 0)
		fail_msg("%s: accepted", body);
	assert_int_equal(e.status, 400);
	if (strstr(e.message, what) == NULL)
		fail_msg("%s: message '%s' does not say '%s'", body, e.message, what);
}

static const struct api_num *
num(const struct api_req *r, const char *key)
{
	for (int i = 0; i < r->n_nums; i++)
		if (strcmp(r->nums[i].key, key) == 0)
			return &r->nums[i];
	return NULL;
}

/* A JSON text's object; asserts it parses. */
static json_t *
js(const char *text)
{
	json_error_t je;
	json_t *j = json_loads(text, JSON_DECODE_ANY, &je);

	if (j == NULL)
		fail_msg("%s: %s", text, je.text);
	return j;
}

/* Asserts that o's JSON text (keys sorted) is want's. */
static void
assert_json(json_t *o, const char *want)
{
	json_t *w = js(want);
	char *a = json_dumps(o, JSON_SORT_KEYS | JSON_COMPACT), *b = json_dumps(w, JSON_SORT_KEYS | JSON_COMPACT);

	if (!json_equal(o, w))
		fail_msg("got %s, want %s", a, b);
	free(a), free(b);
	json_decref(w);
}

static void
test_chat_request(void **state)
{
	struct api_req r;

	parse_ok(API_OLLAMA_CHAT, "{\"model\": \"tiny:latest\", \"messages\": ["
	    "{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Weather?\", \"images\": []},"
	    "{\"role\": \"assistant\", \"content\": \"\", \"thinking\": \"hmm\", \"tool_calls\": [{\"function\": "
	    "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}}]},"
	    "{\"role\": \"tool\", \"content\": \"21 C\", \"tool_name\": \"get_weather\"}],"
	    "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": "
	    "{\"type\": \"object\"}}}], \"format\": {\"type\": \"object\"}, \"think\": false, \"keep_alive\": \"1h30m\","
	    "\"options\": {\"num_predict\": 7, \"temperature\": 0, \"top_k\": 3, \"top_p\": 0.5, \"min_p\": 0.1,"
	    "\"seed\": 42, \"repeat_penalty\": 1.1, \"stop\": [\"END\"], \"num_ctx\": 8192, \"typical_p\": 1,"
	    "\"mirostat\": 0, \"num_gpu\": 99}, \"logprobs\": true, \"top_logprobs\": 2}", &r, OLLAMA_GENERATE);
	assert_int_equal(r.dialect, API_OLLAMA_CHAT);
	assert_int_equal(r.kind, API_CHAT);
	assert_string_equal(r.asked, "tiny:latest");
	assert_string_equal(r.model, "tiny:latest");        /* resolved by call.c */
	assert_true(r.stream);                               /* Ollama's default */
	assert_int_equal(r.n, 1);
	assert_int_equal(r.n_msgs, 4);
	assert_string_equal(r.msgs[0].role, "system");
	assert_int_equal(r.msgs[2].n_calls, 1);
	assert_string_equal(r.msgs[2].calls[0].name, "get_weather");
	assert_string_equal(r.msgs[2].calls[0].arguments, "{\"city\":\"Paris\"}");
	assert_string_equal(r.msgs[3].role, "tool");
	assert_string_equal(r.msgs[3].name, "get_weather");
	assert_non_null(strstr(r.tools, "get_weather"));
	assert_string_equal(r.constraint, "json_schema");
	assert_string_equal(r.constraint_text, "{\"type\":\"object\"}");
	assert_true(r.hide_reasoning);
	assert_string_equal(r.think, "off");
	assert_int_equal(num(&r, "max_tokens")->u, 7);
	assert_true(num(&r, "temperature")->f == 0);
	assert_int_equal(num(&r, "top_k")->u, 3);
	assert_true(num(&r, "top_p")->f == 0.5);
	assert_true(num(&r, "min_p")->f == 0.1);
	assert_int_equal(num(&r, "seed")->u, 42);
	assert_true(num(&r, "repeat_penalty")->f == 1.1);
	assert_true(num(&r, "keep_alive")->f == 5400);
	assert_null(num(&r, "num_ctx"));
	assert_int_equal(r.n_stop, 1);
	assert_string_equal(r.stop[0], "END");
	assert_true(r.logprobs);
	assert_int_equal(r.top_logprobs, 2);
	api_req_free(&r);

	/* format "json", think true and a level; stream false; no options */
	parse_ok(API_OLLAMA_CHAT, "{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": \"a\"}],"
	    "\"format\": \"json\", \"think\": \"high\", \"stream\": false, \"tool_choice\": \"required\", "
	    "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]}", &r, OLLAMA_GENERATE);
	assert_string_equal(r.constraint, "json");
	assert_null(r.constraint_text);
	assert_false(r.hide_reasoning);
	assert_string_equal(r.think, "high");
	assert_false(r.stream);
	assert_string_equal(r.tool_choice, "required");
	assert_null(num(&r, "max_tokens"));
	assert_null(num(&r, "keep_alive"));
	api_req_free(&r);
}

static void
test_generate_request(void **state)
{
	struct api_req r;

	/* the prompt goes through the template, after the system prompt */
	parse_ok(API_OLLAMA_GENERATE, "{\"model\": \"tiny\", \"prompt\": \"Why?\", \"system\": \"Be brief.\","
	    "\"stream\": false, \"format\": \"\", \"context\": [], \"images\": null, \"suffix\": \"\"}", &r, OLLAMA_GENERATE);
	assert_int_equal(r.dialect, API_OLLAMA_GENERATE);
	assert_int_equal(r.kind, API_CHAT);
	assert_int_equal(r.n_msgs, 2);
	assert_string_equal(r.msgs[0].role, "system");
	assert_string_equal(r.msgs[0].content, "Be brief.");
	assert_string_equal(r.msgs[1].role, "user");
	assert_string_equal(r.msgs[1].content, "Why?");
	assert_null(r.prompt);
	assert_null(r.constraint);
	api_req_free(&r);

	/* raw: the prompt as it is */
	parse_ok(API_OLLAMA_GENERATE, "{\"model\": \"tiny\", \"prompt\": \"Once\", \"raw\": true}", &r, OLLAMA_GENERATE);
	assert_int_equal(r.kind, API_COMPLETION);
	assert_string_equal(r.prompt, "Once");
	assert_int_equal(r.n_msgs, 0);
	api_req_free(&r);
}

/* No messages or prompt: the model loaded, or with keep_alive 0 unloaded. */
static void
test_load_unload(void **state)
{
	struct api_req r;

	parse_ok(API_OLLAMA_CHAT, "{\"model\": \"tiny\", \"messages\": []}", &r, OLLAMA_LOAD);
	assert_string_equal(r.asked, "tiny");
	api_req_free(&r);
	parse_ok(API_OLLAMA_CHAT, "{\"model\": \"tiny\"}", &r, OLLAMA_LOAD);
	api_req_free(&r);
	parse_ok(API_OLLAMA_CHAT, "{\"model\": \"tiny\", \"messages\": [], \"keep_alive\": 0}", &r, OLLAMA_UNLOAD);
	api_req_free(&r);
	parse_ok(API_OLLAMA_GENERATE, "{\"model\": \"tiny\"}", &r, OLLAMA_LOAD);
	api_req_free(&r);
	parse_ok(API_OLLAMA_GENERATE, "{\"model\": \"tiny\", \"prompt\": \"\", \"keep_alive\": \"0s\"}", &r,
	    OLLAMA_UNLOAD);
	api_req_free(&r);
	parse_ok(API_OLLAMA_GENERATE, "{\"model\": \"tiny\", \"keep_alive\": \"5m\"}", &r, OLLAMA_LOAD);
	api_req_free(&r);
}

static void
test_refusals(void **state)
{
	static const char *const user = "\"messages\": [{\"role\": \"user\", \"content\": \"a\"}]";
	char body[512];

	parse_bad(API_OLLAMA_CHAT, "{\"model\": ", "not valid JSON");
	parse_bad(API_OLLAMA_CHAT, "[]", "JSON object");
	parse_bad(API_OLLAMA_CHAT, "{\"messages\": []}", "model is required");
	parse_bad(API_OLLAMA_CHAT, "{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": \"a\","
	    "\"images\": [\"iVBORw0KGgo=\"]}]}", "messages[0]: images are not supported");
	parse_bad(API_OLLAMA_GENERATE, "{\"model\": \"tiny\", \"prompt\": \"a\", \"images\": [\"iVBORw0KGgo=\"]}",
	    "images are not supported");
	parse_bad(API_OLLAMA_GENERATE, "{\"model\": \"tiny\", \"prompt\": \"a\", \"suffix\": \"b\"}", "fill in the middle");
	parse_bad(API_OLLAMA_GENERATE, "{\"model\": \"tiny\", \"prompt\": \"a\", \"template\": \"{{ .Prompt }}\"}",
	    "own chat template");
	parse_bad(API_OLLAMA_GENERATE, "{\"model\": \"tiny\", \"prompt\": \"a\", \"context\": [1, 2]}",
	    "context is not supported");
	parse_bad(API_OLLAMA_GENERATE, "{\"model\": \"tiny\", \"prompt\": \"a\", \"raw\": true, \"system\": \"s\"}",
	    "raw mode does not support system");
	parse_bad(API_OLLAMA_GENERATE, "{\"model\": \"tiny\", \"prompt\": 3}", "prompt must be a string");
#define WITH(extra) (snprintf(body, sizeof body, "{\"model\": \"tiny\", %s, %s}", user, extra), body)
	parse_bad(API_OLLAMA_CHAT, WITH("\"options\": {\"typical_p\": 0.5}"), "options.typical_p is not supported");
	parse_bad(API_OLLAMA_CHAT, WITH("\"options\": {\"mirostat\": 2}"), "options.mirostat is not supported");
	parse_bad(API_OLLAMA_CHAT, WITH("\"options\": {\"temperature\": \"hot\"}"), "temperature must be a number");
	parse_bad(API_OLLAMA_CHAT, WITH("\"options\": {\"num_predict\": 1.5}"), "num_predict must be an integer");
	parse_bad(API_OLLAMA_CHAT, WITH("\"options\": {\"stop\": 3}"), "stop must be a string");
	parse_bad(API_OLLAMA_CHAT, WITH("\"options\": []"), "options must be an object");
	parse_bad(API_OLLAMA_CHAT, WITH("\"think\": \"hard\""), "think must be");
	parse_bad(API_OLLAMA_CHAT, WITH("\"format\": \"yaml\""), "format must be \"json\" or a JSON Schema");
	parse_bad(API_OLLAMA_CHAT, WITH("\"format\": [1]"), "format must be");
	parse_bad(API_OLLAMA_CHAT, WITH("\"keep_alive\": \"5 minutes\""), "keep_alive must be");
	parse_bad(API_OLLAMA_CHAT, WITH("\"keep_alive\": true"), "keep_alive must be");
	parse_bad(API_OLLAMA_CHAT, WITH("\"stream\": \"yes\""), "stream must be a boolean");
	parse_bad(API_OLLAMA_CHAT, WITH("\"top_logprobs\": 21, \"logprobs\": true"), "top_logprobs must be");
	parse_bad(API_OLLAMA_CHAT, WITH("\"tools\": {}"), "tools must be an array");
	parse_bad(API_OLLAMA_CHAT, "{\"model\": \"tiny\", \"messages\": [{\"role\": \"robot\", \"content\": \"a\"}]}",
	    "role 'robot' is not supported");
#undef WITH
}

/* Ollama's "no limit" and "random" options leave the daemon's limit and draw a seed of their own. */
static void
test_options_defaults(void **state)
{
	const char *unseeded = "{\"model\": \"tiny\", \"prompt\": \"a\", \"options\": {\"num_predict\": -1, \"seed\": -1}}";
	uint64_t seeds[4];
	struct api_req r;
	int i, differ = 0;

	for (i = 0; i < 4; i++) {
		parse_ok(API_OLLAMA_GENERATE, i % 2 ? unseeded : "{\"model\": \"tiny\", \"prompt\": \"a\"}", &r,
		    OLLAMA_GENERATE);
		assert_null(num(&r, "max_tokens"));
		assert_non_null(num(&r, "seed"));
		assert_true(num(&r, "seed")->is_uint);
		seeds[i] = num(&r, "seed")->u;
		api_req_free(&r);
	}
	for (i = 1; i < 4; i++)
		differ |= seeds[i] != seeds[0];
	assert_true(differ);
	parse_ok(API_OLLAMA_GENERATE, "{\"model\": \"tiny\", \"prompt\": \"a\", \"options\": {\"num_predict\": -2,"
	    "\"seed\": 0}}", &r, OLLAMA_GENERATE);
	assert_null(num(&r, "max_tokens"));
	assert_int_equal(num(&r, "seed")->u, 0);
	api_req_free(&r);
}

static void
keep_alive_is(const char *text, double want)
{
	json_t *v = js(text);
	struct api_error e;
	double s;

	if (ollama_keep_alive(v, &s, &e) != 0)
		fail_msg("%s: %s", text, e.message);
	if (!(s > want - 1e-9 && s < want + 1e-9))
		fail_msg("%s: %g seconds, want %g", text, s, want);
	json_decref(v);
}

static void
keep_alive_bad(const char *text)
{
	json_t *v = js(text);
	struct api_error e;
	double s;

	if (ollama_keep_alive(v, &s, &e) == 0)
		fail_msg("%s: accepted as %g", text, s);
	assert_int_equal(e.status, 400);
	json_decref(v);
}

static void
test_keep_alive(void **state)
{
	keep_alive_is("300", 300);
	keep_alive_is("2.5", 2.5);
	keep_alive_is("0", 0);
	keep_alive_is("-5", -1);
	keep_alive_is("\"0\"", 0);
	keep_alive_is("\"10\"", 10);
	keep_alive_is("\"-1\"", -1);
	keep_alive_is("\"5m\"", 300);
	keep_alive_is("\"1h30m\"", 5400);
	keep_alive_is("\"1.5h\"", 5400);
	keep_alive_is("\"300ms\"", 0.3);
	keep_alive_is("\"2m3s\"", 123);
	keep_alive_is("\"1500us\"", 0.0015);
	keep_alive_is("\"1500\xc2\xb5s\"", 0.0015);
	keep_alive_is("\"+30s\"", 30);
	keep_alive_is("\"-1m\"", -1);
	keep_alive_bad("\"\"");
	keep_alive_bad("\"m\"");
	keep_alive_bad("\"5 m\"");
	keep_alive_bad("\"5d\"");
	keep_alive_bad("\"-\"");
	keep_alive_bad("\"inf\"");
	keep_alive_bad("\"1e999\"");
	keep_alive_bad("[5]");
}

static void
test_resolve(void **state)
{
	char *names[] = { "tiny", "qwen:7b", "gemma-3-270m-q4_k_m", "tiny-qwen3" };
	size_t n = sizeof names / sizeof names[0];

	assert_string_equal(ollama_resolve(names, n, "tiny"), "tiny");
	assert_string_equal(ollama_resolve(names, n, "tiny:latest"), "tiny");
	assert_string_equal(ollama_resolve(names, n, "gemma-3-270m-q4_k_m:latest"), "gemma-3-270m-q4_k_m");
	assert_string_equal(ollama_resolve(names, n, "qwen:7b"), "qwen:7b");
	assert_string_equal(ollama_resolve(names, n, "qwen:7b:latest"), "qwen:7b");
	assert_string_equal(ollama_resolve(names, n, "tiny-qwen3:latest"), "tiny-qwen3");
	assert_null(ollama_resolve(names, n, "tiny:7b"));
	assert_null(ollama_resolve(names, n, "qwen"));
	assert_null(ollama_resolve(names, n, "qwen:latest"));
	assert_null(ollama_resolve(names, n, ":latest"));
	assert_null(ollama_resolve(names, n, "latest"));
	assert_null(ollama_resolve(names, n, "TINY"));
	assert_null(ollama_resolve(names, 0, "tiny"));
}

static void
test_names_and_times(void **state)
{
	char t[48];
	json_t *j;

	assert_json(j = ollama_name("tiny"), "\"tiny:latest\""), json_decref(j);
	assert_json(j = ollama_name("qwen:7b"), "\"qwen:7b\""), json_decref(j);
	ollama_time(t, sizeof t, 0);
	assert_string_equal(t, "1970-01-01T00:00:00.000000000Z");
	ollama_time(t, sizeof t, 1795000000.5);
	assert_string_equal(t, "2026-11-18T11:06:40.500000000Z");
}

/* Fields of o that change from one call to the next (created_at: now), checked and taken out. */
static void
drop_time(json_t *o)
{
	const char *t = json_string_value(json_object_get(o, "created_at"));

	assert_non_null(t);
	assert_int_equal(strlen(t), 30);
	assert_true(t[4] == '-' && t[10] == 'T' && t[19] == '.' && t[29] == 'Z');
	json_object_del(o, "created_at");
}

static void
test_chunks(void **state)
{
	struct api_req chat = { .dialect = API_OLLAMA_CHAT }, gen = { .dialect = API_OLLAMA_GENERATE },
		hidden = { .dialect = API_OLLAMA_CHAT, .hide_reasoning = 1 };
	struct api_meta m = { .model = "tiny:latest" };
	json_t *o, *calls;

	o = ollama_chunk(&chat, &m, "Hel", NULL, NULL);
	drop_time(o);
	assert_json(o, "{\"model\": \"tiny:latest\", \"message\": {\"role\": \"assistant\", \"content\": \"Hel\"},"
	    "\"done\": false}");
	json_decref(o);
	o = ollama_chunk(&chat, &m, NULL, "thinking...", NULL);
	drop_time(o);
	assert_json(o, "{\"model\": \"tiny:latest\", \"message\": {\"role\": \"assistant\", \"content\": \"\","
	    "\"thinking\": \"thinking...\"}, \"done\": false}");
	json_decref(o);
	o = ollama_chunk(&hidden, &m, "a", "thinking...", NULL);
	drop_time(o);
	assert_json(o, "{\"model\": \"tiny:latest\", \"message\": {\"role\": \"assistant\", \"content\": \"a\"},"
	    "\"done\": false}");
	json_decref(o);
	/* logprobs: the entries of OpenAI chat's logprobs.content */
	o = ollama_chunk(&gen, &m, "lo", "hm", js("{\"content\": [{\"token\": \"lo\", \"logprob\": -0.5, "
	    "\"bytes\": [108, 111], \"top_logprobs\": []}]}"));
	drop_time(o);
	assert_json(o, "{\"model\": \"tiny:latest\", \"response\": \"lo\", \"thinking\": \"hm\", \"done\": false,"
	    "\"logprobs\": [{\"token\": \"lo\", \"logprob\": -0.5, \"bytes\": [108, 111], \"top_logprobs\": []}]}");
	json_decref(o);
	calls = js("[{\"id\": \"call_1\", \"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"},"
	    "{\"id\": \"call_2\", \"name\": \"now\", \"arguments\": \"{}\"}]");
	o = ollama_calls_chunk(&chat, &m, calls);
	drop_time(o);
	assert_json(o, "{\"model\": \"tiny:latest\", \"message\": {\"role\": \"assistant\", \"content\": \"\","
	    "\"tool_calls\": [{\"id\": \"call_1\", \"function\": {\"index\": 0, \"name\": \"get_weather\","
	    "\"arguments\": {\"city\": \"Paris\"}}}, {\"id\": \"call_2\", \"function\": {\"index\": 1, \"name\": \"now\","
	    "\"arguments\": {}}}]}, \"done\": false}");
	json_decref(o);
	json_decref(calls);
}

static void
test_final(void **state)
{
	struct api_req chat = { .dialect = API_OLLAMA_CHAT }, gen = { .dialect = API_OLLAMA_GENERATE };
	struct api_meta m = { .model = "tiny" };
	struct ollama_end end = { .finish = "context", .u = { .prompt = 21, .cached = 16, .generated = 11,
		.ttft_ms = 12.5, .tokens_per_s = 200 }, .seconds = 0.0625 };
	json_t *o, *calls;

	/* streamed: no text, the counts and times (ns: 10 tokens after the first at 200/s are 50 ms) */
	o = ollama_final(&chat, &m, &end);
	drop_time(o);
	assert_json(o, "{\"model\": \"tiny\", \"message\": {\"role\": \"assistant\", \"content\": \"\"}, \"done\": true,"
	    "\"done_reason\": \"length\", \"total_duration\": 62500000, \"load_duration\": 0, \"prompt_eval_count\": 21,"
	    "\"prompt_eval_duration\": 12500000, \"eval_count\": 11, \"eval_duration\": 50000000}");
	json_decref(o);
	/* whole: the text and reasoning; calls written as the text are the calls */
	calls = js("[{\"id\": \"call_1\", \"name\": \"f\", \"arguments\": \"{\\\"x\\\": 1}\"}]");
	end = (struct ollama_end){ .finish = "stop", .whole = 1, .text = "{\"name\": \"f\"}", .reasoning = "r",
		.calls = calls, .calls_in_text = 1, .u = { .prompt = 3, .generated = 1, .ttft_ms = 1 }, .seconds = 1 };
	o = ollama_final(&chat, &m, &end);
	drop_time(o);
	assert_json(o, "{\"model\": \"tiny\", \"message\": {\"role\": \"assistant\", \"content\": \"\", \"thinking\": \"r\","
	    "\"tool_calls\": [{\"id\": \"call_1\", \"function\": {\"index\": 0, \"name\": \"f\", \"arguments\": {\"x\": 1}}}]},"
	    "\"done\": true, \"done_reason\": \"stop\", \"total_duration\": 1000000000, \"load_duration\": 0,"
	    "\"prompt_eval_count\": 3, \"prompt_eval_duration\": 1000000, \"eval_count\": 1, \"eval_duration\": 0}");
	json_decref(o);
	/* blank text beside calls is no content */
	end = (struct ollama_end){ .finish = "stop", .whole = 1, .text = "\n", .calls = calls };
	o = ollama_final(&chat, &m, &end);
	assert_string_equal(json_string_value(json_object_get(json_object_get(o, "message"), "content")), "");
	assert_int_equal(json_array_size(json_object_get(json_object_get(o, "message"), "tool_calls")), 1);
	json_decref(o);
	json_decref(calls);
	end = (struct ollama_end){ .finish = "stop", .whole = 1, .text = "Hi.", .u = { .generated = 2 },
		.logprobs = js("{\"content\": [{\"token\": \"Hi\", \"logprob\": 0}]}") };
	o = ollama_final(&gen, &m, &end);
	drop_time(o);
	assert_null(end.logprobs);
	assert_json(o, "{\"model\": \"tiny\", \"response\": \"Hi.\", \"done\": true, \"done_reason\": \"stop\","
	    "\"total_duration\": 0, \"load_duration\": 0, \"prompt_eval_count\": 0, \"prompt_eval_duration\": 0,"
	    "\"eval_count\": 2, \"eval_duration\": 0, \"logprobs\": [{\"token\": \"Hi\", \"logprob\": 0}]}");
	json_decref(o);
	o = ollama_loaded(API_OLLAMA_GENERATE, "tiny:latest", OLLAMA_UNLOAD);
	drop_time(o);
	assert_json(o, "{\"model\": \"tiny:latest\", \"response\": \"\", \"done\": true, \"done_reason\": \"unload\"}");
	json_decref(o);
	o = ollama_loaded(API_OLLAMA_CHAT, "tiny", OLLAMA_LOAD);
	drop_time(o);
	assert_json(o, "{\"model\": \"tiny\", \"message\": {\"role\": \"assistant\", \"content\": \"\"}, \"done\": true,"
	    "\"done_reason\": \"load\"}");
	json_decref(o);
}

static void
test_model_routes(void **state)
{
	json_t *list = js("{\"models\": [{\"name\": \"tiny\", \"path\": \"/m/tiny.gguf\", \"loaded\": true, "
	    "\"default\": true, \"device\": \"cpu\", \"arch\": \"llama\", \"size\": 1815552, \"format\": \"gguf\"},"
	    "{\"name\": \"big\", \"path\": \"/m/big\", \"loaded\": false, \"default\": false, \"device\": \"\"}]}");
	json_t *status = js("{\"models\": [{\"name\": \"tiny\", \"loaded\": true, \"device\": \"cuda\", "
	    "\"memory_bytes\": 25023488, \"keep_alive_s\": 300.0, \"expires_in_s\": 120.5},"
	    "{\"name\": \"kept\", \"loaded\": true, \"device\": \"cpu\", \"memory_bytes\": 7, \"keep_alive_s\": -1.0,"
	    "\"expires_in_s\": -1.0}, {\"name\": \"big\", \"loaded\": false}]}");
	json_t *shown = js("{\"name\": \"q\", \"arch\": \"qwen3\", \"format\": \"gguf\", \"parameters\": 268098176,"
	    "\"quantization\": \"Q4_K_M\", \"context\": 4096, \"context_train\": 32768, \"template\": \"qwen3\","
	    "\"template_error\": \"\", \"vocab\": 151936, \"layers\": 28, \"embedding\": 1024, \"heads\": 16,"
	    "\"kv_heads\": 8, \"head_dim\": 128, \"feed_forward\": 3072, \"sliding_window\": 0}");
	json_t *o, *kept;

	o = ollama_tag(json_array_get(json_object_get(list, "models"), 0), 0, 99);
	assert_json(o, "{\"name\": \"tiny:latest\", \"model\": \"tiny:latest\", \"modified_at\": "
	    "\"1970-01-01T00:00:00.000000000Z\", \"size\": 1815552, \"digest\": \"\", \"details\": {\"parent_model\": \"\","
	    "\"format\": \"gguf\", \"family\": \"llama\", \"families\": [\"llama\"], \"parameter_size\": \"\","
	    "\"quantization_level\": \"\"}}");
	json_decref(o);
	/* not loaded: the file's size, nothing of its family */
	o = ollama_tag(json_array_get(json_object_get(list, "models"), 1), 1795000000, 4096);
	assert_json(o, "{\"name\": \"big:latest\", \"model\": \"big:latest\", \"modified_at\": "
	    "\"2026-11-18T11:06:40.000000000Z\", \"size\": 4096, \"digest\": \"\", \"details\": {\"parent_model\": \"\","
	    "\"format\": \"\", \"family\": \"\", \"families\": null, \"parameter_size\": \"\", \"quantization_level\": \"\"}}");
	json_decref(o);
	/* loaded models only; expires: in 120.5 s, and kept: Ollama's largest duration */
	o = ollama_ps(status, list, 1795000000);
	kept = json_array_get(json_object_get(o, "models"), 1);
	assert_memory_equal(json_string_value(json_object_get(kept, "expires_at")), "2319-02-28T10:53:56.8547", 24);
	json_object_set_new(kept, "expires_at", json_string("later"));
	assert_json(o, "{\"models\": [{\"name\": \"tiny:latest\", \"model\": \"tiny:latest\", \"size\": 25023488,"
	    "\"digest\": \"\", \"details\": {\"parent_model\": \"\", \"format\": \"gguf\", \"family\": \"llama\","
	    "\"families\": [\"llama\"], \"parameter_size\": \"\", \"quantization_level\": \"\"}, \"expires_at\": "
	    "\"2026-11-18T11:08:40.500000000Z\", \"size_vram\": 25023488}, {\"name\": \"kept:latest\", \"model\": "
	    "\"kept:latest\", \"size\": 7, \"digest\": \"\", \"details\": {\"parent_model\": \"\", \"format\": \"\","
	    "\"family\": \"\", \"families\": null, \"parameter_size\": \"\", \"quantization_level\": \"\"}, \"expires_at\": "
	    "\"later\", \"size_vram\": 0}]}");
	json_decref(o);
	o = ollama_show(shown, 0);
	assert_json(o, "{\"details\": {\"parent_model\": \"\", \"format\": \"gguf\", \"family\": \"qwen3\","
	    "\"families\": [\"qwen3\"], \"parameter_size\": \"268.10M\", \"quantization_level\": \"Q4_K_M\"},"
	    "\"model_info\": {\"general.architecture\": \"qwen3\", \"general.parameter_count\": 268098176,"
	    "\"qwen3.context_length\": 32768, \"qwen3.embedding_length\": 1024, \"qwen3.block_count\": 28,"
	    "\"qwen3.feed_forward_length\": 3072, \"qwen3.attention.head_count\": 16, \"qwen3.attention.head_count_kv\": 8,"
	    "\"qwen3.attention.key_length\": 128, \"qwen3.vocab_size\": 151936, \"resident.context_length\": 4096,"
	    "\"resident.template\": \"qwen3\"}, \"capabilities\": [\"completion\", \"tools\", \"thinking\"],"
	    "\"modified_at\": \"1970-01-01T00:00:00.000000000Z\"}");
	json_decref(o);
	/* parameter sizes as Ollama writes them; a template that cannot be used has no tools */
	json_object_set_new(shown, "parameters", json_integer(8030261248));
	json_object_set_new(shown, "template_error", json_string("an unknown template"));
	o = ollama_show(shown, 0);
	assert_string_equal(json_string_value(json_object_get(json_object_get(o, "details"), "parameter_size")), "8.0B");
	assert_json(json_object_get(o, "capabilities"), "[\"completion\"]");
	json_decref(o);
	json_object_set_new(shown, "parameters", json_integer(7000000000));
	json_object_set_new(shown, "template", json_string("gemma"));
	json_object_set_new(shown, "template_error", json_string(""));
	o = ollama_show(shown, 0);
	assert_string_equal(json_string_value(json_object_get(json_object_get(o, "details"), "parameter_size")), "7B");
	assert_json(json_object_get(o, "capabilities"), "[\"completion\", \"tools\"]");
	json_decref(o);
	/* an embedding model (one that pools) is Ollama's "embedding" in place of "completion" */
	json_object_set_new(shown, "pooling", json_string("last"));
	o = ollama_show(shown, 0);
	assert_json(json_object_get(o, "capabilities"), "[\"embedding\", \"tools\"]");
	json_decref(o);
	json_decref(list), json_decref(status), json_decref(shown);
}

static void
test_errors(void **state)
{
	struct api_error e;
	json_t *o;

	api_error_set(&e, 404, "invalid_request_error", "model", "model_not_found", "model '%s' not found", "x");
	o = ollama_error_json(&e);
	assert_json(o, "{\"error\": \"model 'x' not found\"}");
	json_decref(o);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_chat_request),
		cmocka_unit_test(test_generate_request),
		cmocka_unit_test(test_load_unload),
		cmocka_unit_test(test_refusals),
		cmocka_unit_test(test_options_defaults),
		cmocka_unit_test(test_keep_alive),
		cmocka_unit_test(test_resolve),
		cmocka_unit_test(test_names_and_times),
		cmocka_unit_test(test_chunks),
		cmocka_unit_test(test_final),
		cmocka_unit_test(test_model_routes),
		cmocka_unit_test(test_errors),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
