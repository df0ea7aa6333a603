/*
 * http.c: the HTTP side of the bridge. Routes requests (after guard.c's
 * checks of Host, Origin and a body's type), checks the API key, sends
 * JSON bodies, streams and the text of GET /metrics (metrics.c). A URL
 * under /api/ is Ollama's API (ollama.c routes it): its errors and streams
 * are written in Ollama's shapes, the others' in OpenAI's. Connections,
 * their deadlines and a client that leaves are conn.c's.
 */
#include "config.h"
#include "openai.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/http.h>
#include <event2/http_struct.h>
#include <event2/keyvalq_struct.h>
#include <stdlib.h>
#include <string.h>

/* ---- replies ---- */

static const char *
reason(int status)
{
	switch (status) {
	case 200: return "OK";
	case 400: return "Bad Request";
	case 401: return "Unauthorized";
	case 403: return "Forbidden";
	case 404: return "Not Found";
	case 405: return "Method Not Allowed";
	case 409: return "Conflict";
	case 413: return "Payload Too Large";
	case 415: return "Unsupported Media Type";
	case 429: return "Too Many Requests";
	case 501: return "Not Implemented";
	case 502: return "Bad Gateway";
	case 503: return "Service Unavailable";
	case 507: return "Insufficient Storage";
	default: return "Internal Server Error";
	}
}

void
http_add_header(struct evhttp_request *req, const char *name, const char *value)
{
	evhttp_add_header(evhttp_request_get_output_headers(req), name, value);
}

/* Appends JSON text to buf, dumped with flags (jansson's); takes the reference. */
static void
add_json(struct evbuffer *buf, json_t *j, size_t flags)
{
	char *s = j ? json_dumps(j, flags) : NULL;

	evbuffer_add_printf(buf, "%s", s ? s : "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
	    "\"param\":null,\"code\":null}}");
	free(s);
	json_decref(j);
}

static void
send_json(struct evhttp_request *req, int status, json_t *body, size_t flags)
{
	struct evbuffer *buf = evbuffer_new();

	add_json(buf, body, flags);
	evbuffer_add(buf, "\n", 1);
	http_add_header(req, "Content-Type", "application/json");
	evhttp_send_reply(req, status, reason(status), buf);
	evbuffer_free(buf);
}

void
http_send_json(struct evhttp_request *req, int status, json_t *body)
{
	send_json(req, status, body, JSON_COMPACT);
}

void
http_send_vectors(struct evhttp_request *req, json_t *body)
{
	/* 9 significant digits give any float32 back; a double's 17 would add only the float32's noise */
	send_json(req, 200, body, JSON_COMPACT | JSON_REAL_PRECISION(9));
}

/* Whether req's URL is one of Ollama's API. */
static int
ollama_url(struct evhttp_request *req)
{
	const char *path = evhttp_uri_get_path(evhttp_request_get_evhttp_uri(req));

	return path != NULL && strncmp(path, "/api/", 5) == 0;
}

json_t *
http_error_json(struct evhttp_request *req, const struct api_error *e)
{
	return ollama_url(req) ? ollama_error_json(e) : api_error_json(e);
}

void
http_send_error(struct evhttp_request *req, const struct api_error *e)
{
	http_send_json(req, e->status, http_error_json(req, e));
}

void
http_stream_start(struct evhttp_request *req)
{
	/* HTTP/1.0 has no chunks (2.1's evhttp has no accessor of the version): the close ends the stream,
	 * and without the client's keep-alive evhttp gives it no Content-Length and closes at the end */
	if (req->major == 1 && req->minor == 0) {
		evhttp_remove_header(evhttp_request_get_input_headers(req), "Connection");
		http_add_header(req, "Connection", "close");
	}
	http_add_header(req, "Content-Type", ollama_url(req) ? "application/x-ndjson" : "text/event-stream");
	http_add_header(req, "Cache-Control", "no-cache");
	evhttp_send_reply_start(req, 200, "OK");
}

void
http_stream_send(struct evhttp_request *req, json_t *data)
{
	struct evbuffer *buf = evbuffer_new();
	int ndjson = ollama_url(req);

	if (!ndjson)
		evbuffer_add(buf, "data: ", 6);
	add_json(buf, data, JSON_COMPACT);
	evbuffer_add(buf, "\n\n", ndjson ? 1 : 2);
	evhttp_send_reply_chunk(req, buf);
	evbuffer_free(buf);
}

void
http_stream_end(struct evhttp_request *req)
{
	struct evbuffer *buf;

	if (!ollama_url(req) && (buf = evbuffer_new()) != NULL) {
		evbuffer_add_printf(buf, "data: [DONE]\n\n");
		evhttp_send_reply_chunk(req, buf);
		evbuffer_free(buf);
	}
	evhttp_send_reply_end(req);
}

size_t
http_unsent(struct evhttp_request *req)
{
	struct evhttp_connection *conn = evhttp_request_get_connection(req);

	return conn ? evbuffer_get_length(bufferevent_get_output(evhttp_connection_get_bufferevent(conn))) : 0;
}

/* ---- routing ---- */

/* Compares without stopping at the first difference, so the time taken says nothing of the key. */
static int
key_equal(const char *given, const char *key)
{
	size_t i, ng = strlen(given), nk = strlen(key);
	unsigned char d = ng != nk;

	for (i = 0; i < nk; i++)
		d |= (unsigned char)(key[i] ^ (i < ng ? given[i] : 0));
	return d == 0;
}

/* With --api-key-file, the request must carry "Authorization: Bearer KEY". */
static int
authorized(const struct oa *oa, struct evhttp_request *req)
{
	const char *h;

	if (oa->api_key == NULL)
		return 1;
	h = evhttp_find_header(evhttp_request_get_input_headers(req), "Authorization");
	return h != NULL && strncmp(h, "Bearer ", 7) == 0 && key_equal(h + 7, oa->api_key);
}

const char *
http_body(struct evhttp_request *req, size_t *len)
{
	struct evbuffer *in = evhttp_request_get_input_buffer(req);

	*len = evbuffer_get_length(in);
	return *len ? (const char *)evbuffer_pullup(in, -1) : "";
}

/* POST /v1/chat/completions and /v1/completions. */
static void
route_completion(struct oa *oa, struct evhttp_request *req, enum api_kind kind)
{
	size_t len;
	const char *body = http_body(req, &len);
	const char *session = evhttp_find_header(evhttp_request_get_input_headers(req), "X-Resident-Session");
	struct api_error e;
	struct api_req r;

	if (api_parse(kind, body, len, session, &r, &e) != 0) {
		http_send_error(req, &e);
		return;
	}
	call_generate(oa, req, &r);
}

/* GET /v1/models (results: model.list's) and /v1/models/NAME (model: its name; no results). */
static void
models_reply(struct evhttp_request *req, const char *model, json_t *const *results, void *arg)
{
	http_send_json(req, 200, model != NULL ? api_model(model) : api_models(results[0]));
}

/* GET /v1/models, and /v1/models/NAME (encoded: NAME as it came, percent-encoded; NULL: the list). */
static void
route_models(struct oa *oa, struct evhttp_request *req, const char *encoded)
{
	static const char *const list[] = { "model.list", NULL }, *const none[] = { NULL };
	char *name = encoded ? evhttp_uridecode(encoded, 0, NULL) : NULL;
	struct api_error e;

	if (encoded != NULL && name == NULL) {
		api_nomem(&e);
		http_send_error(req, &e);
		return;
	}
	call_ops(oa, req, name ? "GET /v1/models/NAME" : "GET /v1/models", API_OPENAI, name, name ? none : list,
	    NULL, models_reply, NULL);
	free(name);
}

/* A 200 of len bytes of text (NULL: out of memory, answered as such) as content type ctype. */
static void
send_text(struct evhttp_request *req, const char *ctype, const char *text, size_t len)
{
	struct evbuffer *buf = text != NULL ? evbuffer_new() : NULL;
	struct api_error e;

	if (buf == NULL) {
		api_nomem(&e);
		http_send_error(req, &e);
		return;
	}
	evbuffer_add(buf, text, len);
	http_add_header(req, "Content-Type", ctype);
	evhttp_send_reply(req, 200, "OK", buf);
	evbuffer_free(buf);
}

/* GET /metrics (results: status's). */
static void
metrics_reply(struct evhttp_request *req, const char *model, json_t *const *results, void *arg)
{
	size_t len = 0;
	char *text = metrics_text(results[0], &len);

	send_text(req, METRICS_CONTENT_TYPE, text, len);
	free(text);
}

/*
 * GET / (and HEAD): what Ollama answers there, since its clients take a 200
 * at the root for a server that is up (its Go client's Heartbeat is a HEAD /,
 * and apps probe with a GET and look for the text).
 */
static void
route_root(struct evhttp_request *req)
{
	static const char text[] = "Ollama is running";

	send_text(req, "text/plain; charset=utf-8", text, sizeof text - 1);
}

void
http_route_none(struct evhttp_request *req, const char *path, const char *allow)
{
	struct api_error e;

	if (allow != NULL) {
		http_add_header(req, "Allow", allow);
		api_error_set(&e, 405, "invalid_request_error", NULL, "method_not_allowed",
		    "%s takes %s requests only", path, allow);
	} else {
		api_error_set(&e, 404, "invalid_request_error", NULL, "unknown_url",
		    "unknown request URL %s: resident-http serves OpenAI's GET /v1/models, "
		    "POST /v1/chat/completions, /v1/completions and /v1/embeddings, Ollama's GET /api/version, "
		    "/api/tags and /api/ps, POST /api/show, /api/chat, /api/generate, /api/embed and /api/embeddings, "
		    "GET / (Ollama's \"Ollama is running\") and GET /metrics", path);
	}
	http_send_error(req, &e);
}

void
http_request_cb(struct evhttp_request *req, void *arg)
{
	struct oa *oa = arg;
	const char *path = evhttp_uri_get_path(evhttp_request_get_evhttp_uri(req));
	int get = evhttp_request_get_command(req) == EVHTTP_REQ_GET;
	int post = evhttp_request_get_command(req) == EVHTTP_REQ_POST;
	int head = evhttp_request_get_command(req) == EVHTTP_REQ_HEAD;
	struct api_error e;

	if (!conn_request(oa, req))
		return;                         /* answered, and the connection closed */
	if (path == NULL || path[0] == '\0')
		path = "/";
	if (!guard_request(oa, req))
		return;                         /* refused, or a preflight answered */
	if (!authorized(oa, req)) {
		api_error_set(&e, 401, "invalid_request_error", NULL, "invalid_api_key",
		    "a valid API key is needed: send \"Authorization: Bearer KEY\" with the key of "
		    "resident-http's --api-key-file");
		http_send_error(req, &e);
	} else if (!guard_body(req)) {
		/* a body not sent as JSON: answered 415 */
	} else if (embed_route(oa, req, path)) {
		/* answered there */
	} else if (strcmp(path, "/v1/chat/completions") == 0) {
		if (post)
			route_completion(oa, req, API_CHAT);
		else
			http_route_none(req, path, "POST");
	} else if (strcmp(path, "/v1/completions") == 0) {
		if (post)
			route_completion(oa, req, API_COMPLETION);
		else
			http_route_none(req, path, "POST");
	} else if (strcmp(path, "/v1/models") == 0 || strncmp(path, "/v1/models/", 11) == 0) {
		if (!get)
			http_route_none(req, path, "GET");
		else
			route_models(oa, req, path[10] == '/' && path[11] != '\0' ? path + 11 : NULL);
	} else if (strncmp(path, "/api/", 5) == 0) {
		ollama_route(oa, req, path);
	} else if (strcmp(path, "/metrics") == 0) {
		static const char *const status[] = { "status", NULL };

		if (get)
			call_ops(oa, req, "GET /metrics", API_OPENAI, NULL, status, NULL, metrics_reply, NULL);
		else
			http_route_none(req, path, "GET");
	} else if (strcmp(path, "/") == 0) {
		if (get || head)
			route_root(req);
		else
			http_route_none(req, path, "GET, HEAD");
	} else {
		http_route_none(req, path, NULL);
	}
}
