/*
 * ollama.c: Ollama's routes under /api/ (ollama_api.c writes their JSON).
 *
 *   GET /api/version         the version of Ollama's API served
 *   GET /api/tags            model.list
 *   GET /api/ps              status, model.list
 *   POST /api/show           model.show
 *   POST /api/chat           a generate as call.c runs OpenAI's chat (or, without
 *   POST /api/generate       messages or prompt, model.load or model.unload)
 *   pull, push, create, copy, delete, blobs: 501, saying how resident finds models
 *
 * Errors are Ollama's {"error": message}, and streams NDJSON: http.c
 * writes both so for every URL under /api/.
 */
#include "config.h"
#include "openai.h"

#include <event2/buffer.h>
#include <event2/http.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* What an empty /api/chat or /api/generate asks for, and the API its reply is in. */
struct load {
	enum api_dialect d;
	enum ollama_action action;
};

/* The mtime (Unix time; 0: unknown) and size (a file's; 0: a directory, unknown) of a model's path. */
static void
path_info(const json_t *model, double *mtime, uint64_t *size)
{
	const char *path = json_string_value(json_object_get(model, "path"));
	struct stat st;

	*mtime = 0;
	*size = 0;
	/* the daemon's path, which this process may not see (another mount namespace, no permission) */
	if (path == NULL || stat(path, &st) != 0)
		return;
	*mtime = (double)st.st_mtim.tv_sec + st.st_mtim.tv_nsec / 1e9;
	if (S_ISREG(st.st_mode))
		*size = (uint64_t)st.st_size;
}

static void
tags_reply(struct evhttp_request *req, const char *model, json_t *const *results, void *arg)
{
	json_t *models = json_array(), *m;
	uint64_t size;
	double mtime;
	size_t i;

	json_array_foreach(json_object_get(results[0], "models"), i, m) {
		path_info(m, &mtime, &size);
		json_array_append_new(models, ollama_tag(m, mtime, size));
	}
	http_send_json(req, 200, json_pack("{so}", "models", models));
}

static void
ps_reply(struct evhttp_request *req, const char *model, json_t *const *results, void *arg)
{
	http_send_json(req, 200, ollama_ps(results[0], results[1], ollama_now()));
}

static void
show_reply(struct evhttp_request *req, const char *model, json_t *const *results, void *arg)
{
	json_t *m = json_object_get(results[0], "model");
	uint64_t size;
	double mtime;

	path_info(m, &mtime, &size);
	http_send_json(req, 200, ollama_show(m, mtime));
}

static void
load_reply(struct evhttp_request *req, const char *model, json_t *const *results, void *arg)
{
	const struct load *l = arg;

	http_send_json(req, 200, ollama_loaded(l->d, model, l->action));
}

/* POST /api/chat and /api/generate. */
static void
route_generate(struct oa *oa, struct evhttp_request *req, enum api_dialect d)
{
	static const struct load loads[2][2] = {
		{ { API_OLLAMA_CHAT, OLLAMA_LOAD }, { API_OLLAMA_CHAT, OLLAMA_UNLOAD } },
		{ { API_OLLAMA_GENERATE, OLLAMA_LOAD }, { API_OLLAMA_GENERATE, OLLAMA_UNLOAD } },
	};
	static const char *const load[] = { "model.load", NULL }, *const unload[] = { "model.unload", NULL };
	const struct load *l;
	enum ollama_action action;
	struct api_error e;
	struct api_req r;
	size_t len;
	const char *body = http_body(req, &len);

	if (ollama_parse(d, body, len, &r, &action, &e) != 0) {
		http_send_error(req, &e);
		return;
	}
	if (action == OLLAMA_GENERATE) {
		call_generate(oa, req, &r);
		return;
	}
	l = &loads[d == API_OLLAMA_GENERATE][action == OLLAMA_UNLOAD];
	call_ops(oa, req, d == API_OLLAMA_CHAT ? "POST /api/chat" : "POST /api/generate", d, r.asked,
	    action == OLLAMA_UNLOAD ? unload : load, NULL, load_reply, (void *)l);
	api_req_free(&r);
}

/* POST /api/show. */
static void
route_show(struct oa *oa, struct evhttp_request *req)
{
	static const char *const ops[] = { "model.show", NULL };
	struct api_error e;
	size_t len;
	const char *body = http_body(req, &len);
	char *model = ollama_parse_model(body, len, &e);

	if (model == NULL) {
		http_send_error(req, &e);
		return;
	}
	call_ops(oa, req, "POST /api/show", API_OLLAMA_CHAT, model, ops, NULL, show_reply, NULL);
	free(model);
}

/* The routes of Ollama's model store: resident has none. */
static void
route_store(struct evhttp_request *req, const char *path)
{
	struct api_error e;

	api_error_set(&e, 501, "invalid_request_error", NULL, "not_supported", "%s is not supported: resident does "
	    "not download, create, copy or delete models. It serves GGUF files and Hugging Face safetensors "
	    "directories on this machine: load one with `resident models load PATH` (or start residentd with -m PATH); "
	    "GET /api/tags lists the models residentd knows (man resident, man residentd)", path);
	http_send_error(req, &e);
}

void
ollama_route(struct oa *oa, struct evhttp_request *req, const char *path)
{
	static const char *const store[] = { "/api/pull", "/api/push", "/api/create", "/api/copy", "/api/delete" };
	static const char *const tags[] = { "model.list", NULL }, *const ps[] = { "status", "model.list", NULL };
	enum evhttp_cmd_type cmd = evhttp_request_get_command(req);
	int get = cmd == EVHTTP_REQ_GET || cmd == EVHTTP_REQ_HEAD, post = cmd == EVHTTP_REQ_POST;
	size_t i;

	for (i = 0; i < sizeof store / sizeof store[0] && strcmp(path, store[i]) != 0; i++)
		;
	if (i < sizeof store / sizeof store[0] || strncmp(path, "/api/blobs/", 11) == 0)
		route_store(req, path);
	else if (strcmp(path, "/api/version") == 0 && get)
		http_send_json(req, 200, json_pack("{ss}", "version", OLLAMA_VERSION));
	else if (strcmp(path, "/api/tags") == 0 && get)
		call_ops(oa, req, "GET /api/tags", API_OLLAMA_CHAT, NULL, tags, NULL, tags_reply, NULL);
	else if (strcmp(path, "/api/ps") == 0 && get)
		call_ops(oa, req, "GET /api/ps", API_OLLAMA_CHAT, NULL, ps, NULL, ps_reply, NULL);
	else if (strcmp(path, "/api/show") == 0 && post)
		route_show(oa, req);
	else if (strcmp(path, "/api/chat") == 0 && post)
		route_generate(oa, req, API_OLLAMA_CHAT);
	else if (strcmp(path, "/api/generate") == 0 && post)
		route_generate(oa, req, API_OLLAMA_GENERATE);
	else if (strcmp(path, "/api/version") == 0 || strcmp(path, "/api/tags") == 0 || strcmp(path, "/api/ps") == 0)
		http_route_none(req, path, "GET, HEAD");
	else if (strcmp(path, "/api/show") == 0 || strcmp(path, "/api/chat") == 0 || strcmp(path, "/api/generate") == 0)
		http_route_none(req, path, "POST");
	else
		http_route_none(req, path, NULL);
}
