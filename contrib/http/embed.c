/*
 * embed.c: the embeddings routes, each one `embed` of the daemon
 * (call_ops, which resolves the model's name as the route's API
 * names it and answers errors in its shape): OpenAI's POST /v1/embeddings
 * (input a string or an array of strings; encoding_format float or
 * base64; dimensions; usage), Ollama's POST /api/embed (input a string or
 * an array of strings; truncate, true by default; dimensions; keep_alive;
 * its durations in nanoseconds) and its older /api/embeddings (prompt ->
 * embedding). An Ollama request of no input is a model.load, as Ollama's.
 */
#include "config.h"
#include "openai.h"

#include <event2/http.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The shape of a reply: the route's, OpenAI's in two encodings. */
enum embed_shape { EMBED_OPENAI, EMBED_OPENAI_BASE64, EMBED_OLLAMA, EMBED_OLLAMA_OLD };

/* Each shape at its own index: a request's is passed by address (call_ops' arg outlives no call). */
static const enum embed_shape shapes[] = {
	[EMBED_OPENAI] = EMBED_OPENAI, [EMBED_OPENAI_BASE64] = EMBED_OPENAI_BASE64,
	[EMBED_OLLAMA] = EMBED_OLLAMA, [EMBED_OLLAMA_OLD] = EMBED_OLLAMA_OLD,
};

/* ---- requests ---- */

/*
 * input: a string or an array of strings. OpenAI's token id inputs are
 * ids of OpenAI's tokenizer (tiktoken), which mean nothing to another
 * model: refused, saying so.
 */
static int
add_inputs(rs_params *p, const json_t *in, struct api_error *e)
{
	size_t i;

	if (json_is_string(in))
		return rs_params_add_str(p, "input", json_string_value(in)) == RS_OK ? 0 : api_nomem(e);
	if (!json_is_array(in) || json_array_size(in) == 0)
		return api_bad(e, "input", "input must be a string or a non-empty array of strings");
	for (i = 0; i < json_array_size(in); i++) {
		const json_t *v = json_array_get(in, i);

		if (json_is_integer(v) || json_is_array(v))
			return api_bad(e, "input", "input holds token ids, which are another tokenizer's (OpenAI's): send "
			    "the text as strings (LangChain's OpenAIEmbeddings: check_embedding_ctx_length=False)");
		if (!json_is_string(v))
			return api_bad(e, "input", "input[%zu] is not a string", i);
		if (rs_params_add_str(p, "input", json_string_value(v)) != RS_OK)
			return api_nomem(e);
	}
	return 0;
}

/* dimensions: a positive integer, or absent. */
static int
set_dimensions(rs_params *p, const json_t *o, struct api_error *e)
{
	const json_t *d = api_field(o, "dimensions");

	if (d == NULL)
		return 0;
	if (!json_is_integer(d) || json_integer_value(d) < 1 || json_integer_value(d) > (1 << 20))
		return api_bad(e, "dimensions", "dimensions must be a positive integer");
	return rs_params_set_uint(p, "dimensions", (uint64_t)json_integer_value(d)) == RS_OK ? 0 : api_nomem(e);
}

/* Ollama's keep_alive (ollama_keep_alive), if given. */
static int
set_keep_alive(rs_params *p, const json_t *o, struct api_error *e)
{
	const json_t *k = api_field(o, "keep_alive");
	double secs;

	if (k == NULL)
		return 0;
	if (ollama_keep_alive(k, &secs, e) != 0)
		return -1;
	return rs_params_set_float(p, "keep_alive", secs) == RS_OK ? 0 : api_nomem(e);
}

/* The embed fields of a body, by route (its shape); its reply's shape in *shape. 0, or -1 with e. */
static int
embed_params(enum embed_shape route, const json_t *o, rs_params *p, enum embed_shape *shape, struct api_error *e)
{
	const json_t *fmt = api_field(o, "encoding_format"), *tr = api_field(o, "truncate");

	*shape = route;
	switch (route) {
	case EMBED_OPENAI:
	case EMBED_OPENAI_BASE64:
		if (fmt != NULL && (!json_is_string(fmt) || (strcmp(json_string_value(fmt), "float") != 0 &&
		    strcmp(json_string_value(fmt), "base64") != 0)))
			return api_bad(e, "encoding_format", "encoding_format must be \"float\" or \"base64\"");
		if (fmt != NULL && strcmp(json_string_value(fmt), "base64") == 0)
			*shape = EMBED_OPENAI_BASE64;
		return add_inputs(p, api_field(o, "input"), e) != 0 || set_dimensions(p, o, e) != 0 ? -1 : 0;
	case EMBED_OLLAMA:
		if (tr != NULL && !json_is_boolean(tr))
			return api_bad(e, "truncate", "truncate must be true or false");
		if (add_inputs(p, api_field(o, "input"), e) != 0 || set_dimensions(p, o, e) != 0 ||
		    set_keep_alive(p, o, e) != 0)
			return -1;
		/* Ollama cuts inputs to the context unless told not to */
		return rs_params_set_bool(p, "truncate", tr == NULL || json_is_true(tr)) == RS_OK ? 0 : api_nomem(e);
	case EMBED_OLLAMA_OLD:
		if (!json_is_string(api_field(o, "prompt")))
			return api_bad(e, "prompt", "prompt (a string) is required");
		if (rs_params_add_str(p, "input", json_string_value(api_field(o, "prompt"))) != RS_OK)
			return api_nomem(e);
		return set_keep_alive(p, o, e) != 0 || rs_params_set_bool(p, "truncate", 1) != RS_OK ? -1 : 0;
	}
	return -1;
}

/* ---- replies ---- */

/* A vector as base64 of its little-endian float32 bytes (OpenAI's encoding_format base64). */
static json_t *
vector_base64(const json_t *v)
{
	static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	size_t n = json_array_size(v) * 4, i, o = 0;
	unsigned char *bytes = malloc(n ? n : 1);
	char *text = malloc(4 * ((n + 2) / 3) + 1);
	json_t *j = NULL;

	for (i = 0; bytes != NULL && i < json_array_size(v); i++) {
		float f = (float)json_number_value(json_array_get(v, i));
		uint32_t u;

		memcpy(&u, &f, 4);
		for (int k = 0; k < 4; k++)
			bytes[4 * i + k] = (unsigned char)(u >> (8 * k));
	}
	for (i = 0; bytes != NULL && text != NULL && i < n; i += 3) {
		uint32_t w = (uint32_t)bytes[i] << 16 | (i + 1 < n ? (uint32_t)bytes[i + 1] << 8 : 0) |
		    (i + 2 < n ? bytes[i + 2] : 0);

		text[o++] = b64[w >> 18 & 63];
		text[o++] = b64[w >> 12 & 63];
		text[o++] = i + 1 < n ? b64[w >> 6 & 63] : '=';
		text[o++] = i + 2 < n ? b64[w & 63] : '=';
	}
	if (bytes != NULL && text != NULL) {
		text[o] = '\0';
		j = json_string(text);
	}
	free(bytes), free(text);
	return j;
}

/*
 * The reply of an embed's result (results[0]), in the route's shape; model:
 * the name as the request gave it. The vectors are the result's own arrays,
 * referenced, not copied: call_ops converted them once, each float32 as the
 * double that holds it exactly, and http_send_vectors prints each in the
 * 9 digits that give that float32 back.
 */
static void
embed_reply(struct evhttp_request *req, const char *model, json_t *const *results, void *arg)
{
	enum embed_shape shape = *(const enum embed_shape *)arg;
	json_t *all = json_object_get(results[0], "embeddings"), *usage = json_object_get(results[0], "usage");
	json_int_t tokens = json_integer_value(json_object_get(usage, "prompt_tokens"));
	json_t *data, *v, *body;
	size_t i;

	if (model == NULL) /* the daemon's default model */
		model = json_string_value(json_object_get(results[0], "model"));
	if (shape == EMBED_OLLAMA_OLD) {
		body = json_pack("{sO}", "embedding", json_array_get(all, 0));
	} else if (shape == EMBED_OLLAMA) {
		body = json_pack("{ss sO sI sI sI}", "model", model, "embeddings", all,
		    "total_duration", (json_int_t)(json_number_value(json_object_get(usage, "total_ms")) * 1e6),
		    "load_duration", (json_int_t)(json_number_value(json_object_get(usage, "load_ms")) * 1e6),
		    "prompt_eval_count", tokens);
	} else {
		data = json_array();
		json_array_foreach(all, i, v)
			json_array_append_new(data, json_pack("{ss sI so}", "object", "embedding", "index", (json_int_t)i,
			    "embedding", shape == EMBED_OPENAI_BASE64 ? vector_base64(v) : json_incref(v)));
		body = json_pack("{ss sO ss s{sI sI}}", "object", "list", "data", data, "model", model,
		    "usage", "prompt_tokens", tokens, "total_tokens", tokens);
		json_decref(data);
	}
	http_send_vectors(req, body);
}

/*
 * Whether an Ollama body that names a model asks for no vectors (input
 * absent, "" or [], prompt absent or ""): Ollama then loads the model and
 * answers none, which its clients send to load an embedding model ahead.
 */
static int
embed_empty(enum embed_shape route, const json_t *o)
{
	const json_t *in = api_field(o, route == EMBED_OLLAMA_OLD ? "prompt" : "input");

	if (route == EMBED_OPENAI || !json_is_string(api_field(o, "model")))
		return 0;
	return in == NULL || (json_is_string(in) && json_string_length(in) == 0) ||
	    (json_is_array(in) && json_array_size(in) == 0);
}

/* The reply of an empty request once model.load answered: Ollama's, with no vectors. */
static void
loaded_reply(struct evhttp_request *req, const char *model, json_t *const *results, void *arg)
{
	if (*(const enum embed_shape *)arg == EMBED_OLLAMA_OLD)
		http_send_json(req, 200, json_pack("{s[]}", "embedding"));
	else
		http_send_json(req, 200, json_pack("{ss s[]}", "model", model, "embeddings"));
}

int
embed_route(struct oa *oa, struct evhttp_request *req, const char *path)
{
	static const struct { const char *path; enum embed_shape shape; } routes[] = {
		{ "/v1/embeddings", EMBED_OPENAI }, { "/api/embed", EMBED_OLLAMA }, { "/api/embeddings", EMBED_OLLAMA_OLD },
	};
	static const char *const ops[] = { "embed", NULL }, *const load[] = { "model.load", NULL };
	enum embed_shape shape;
	struct api_error e;
	const json_t *model;
	const char *body;
	json_t *o = NULL;
	rs_params *p;
	size_t len, i;

	for (i = 0; i < sizeof routes / sizeof routes[0] && strcmp(path, routes[i].path) != 0; i++)
		;
	if (i == sizeof routes / sizeof routes[0])
		return 0;
	if (evhttp_request_get_command(req) != EVHTTP_REQ_POST) {
		http_route_none(req, path, "POST");
		return 1;
	}
	body = http_body(req, &len);
	if ((p = rs_params_new()) == NULL) {
		api_nomem(&e);
	} else if ((o = api_body(body, len, &e)) == NULL) {
		/* e says why */
	} else if ((model = api_field(o, "model")) != NULL && !json_is_string(model)) {
		api_bad(&e, "model", "model must be a string");
	} else if (embed_empty(routes[i].shape, o)) {
		call_ops(oa, req, routes[i].path, API_OLLAMA_CHAT, json_string_value(model), load, NULL, loaded_reply,
		    (void *)&shapes[routes[i].shape]);
		json_decref(o);
		rs_params_free(p);
		return 1;
	} else if (embed_params(routes[i].shape, o, p, &shape, &e) != 0) {
		/* e says why */
	} else {
		call_ops(oa, req, routes[i].path, routes[i].shape == EMBED_OPENAI ? API_OPENAI : API_OLLAMA_CHAT,
		    model ? json_string_value(model) : NULL, ops, p, embed_reply, (void *)&shapes[shape]);
		json_decref(o);
		return 1;
	}
	http_send_error(req, &e);
	json_decref(o);
	rs_params_free(p);
	return 1;
}
