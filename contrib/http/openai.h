/*
 * openai.h: what the files of resident-http share. The bridge serves
 * OpenAI's HTTP API (under /v1/) and Ollama's (under /api/) with libevent's
 * evhttp and talks to residentd only through libresident (resident.h), one
 * daemon connection per HTTP request.
 *
 *   main.c        flags, listening, signals
 *   http.c        routes, authentication, JSON, event-stream and NDJSON
 *                 replies
 *   conn.c        connections: accepting them, their deadlines, bounding
 *                 their input, noticing a client that left
 *   call.c        one request's life against the daemon (a state machine)
 *   api.c         OpenAI's JSON <-> resident's generate fields; no I/O
 *   tools.c       the tools parts of it: tools, tool_choice, tool messages and
 *                 calls, tool_calls in replies and chunks; no I/O
 *   ollama.c      Ollama's routes: the replies of its model routes
 *   ollama_api.c  Ollama's JSON <-> resident's: its requests parsed into an
 *                 api_req, its model names, replies and errors; no I/O
 *   embed.c       the embeddings routes, OpenAI's and Ollama's: their JSON <-> embed
 *   metrics.c     GET /metrics: status in Prometheus' text format; no I/O
 *   guard.c       which requests are answered at all: Host, Origin and CORS,
 *                 a POST body's Content-Type (web pages kept out)
 */
#ifndef RESIDENT_OPENAI_H
#define RESIDENT_OPENAI_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "listener.h"
#include "resident.h"

struct event;
struct event_base;
struct evconnlistener;
struct evhttp;
struct evhttp_bound_socket;
struct evhttp_request;
struct call;
struct conn;
struct oa;

/* ---- api.c ---- */

/* What the daemon is asked for: a reply to messages, or a continuation of a raw prompt. */
enum api_kind { API_CHAT, API_COMPLETION };
/* The API a request came in, which its replies are written in. */
enum api_dialect { API_OPENAI, API_OLLAMA_CHAT, API_OLLAMA_GENERATE };

#define API_MAX_NUMS 16
#define API_MAX_CHOICES 8               /* n: the daemon's limit */

/* An error reply: HTTP status and OpenAI's {"error": {message, type, param, code}}. */
struct api_error {
	int status;
	const char *type;           /* "invalid_request_error", "server_error", ... */
	const char *param;          /* the request field at fault, or NULL */
	const char *code;           /* a stable code string, or NULL */
	char message[512];
};

/*
 * A numeric field of a request's JSON and the generate field it sets.
 * API_NUM_SEED: any int64 (OpenAI's seed), a negative one sent as the uint
 * of the same 64 bits.
 */
enum api_num_kind { API_NUM_FLOAT, API_NUM_UINT, API_NUM_POSITIVE, API_NUM_SEED };
struct api_num_field {
	const char *field, *key;
	enum api_num_kind kind;
};

/* A numeric generate field the request gave. */
struct api_num {
	const char *key;            /* the protocol's name */
	int is_uint;
	uint64_t u;
	double f;
};

/* A call of an assistant message of the history. */
struct api_call {
	char *id;                   /* NULL: none given */
	char *name;
	char *arguments;            /* JSON text */
};

struct api_msg {
	const char *role;           /* "system", "user", "assistant" or "tool" (static) */
	char *content;
	struct api_call *calls;     /* an assistant message's tool_calls */
	size_t n_calls;
	char *tool_call_id;         /* a tool message's: the call it answers; NULL: none */
	char *name;                 /* a tool message's: the tool; NULL: none */
};

/* A checked request of /v1/chat/completions, /v1/completions, /api/chat or /api/generate. */
struct api_req {
	enum api_kind kind;
	enum api_dialect dialect;
	char *model;                /* the daemon's name (Ollama's: resolved from asked) */
	char *asked;                /* Ollama's: the name as the client gave it, which replies echo */
	int hide_reasoning;         /* Ollama's think: false: replies leave the reasoning out */
	const char *think;          /* the daemon's think: "off" (false), "low", "medium", "high"; NULL: its default */
	char *session;              /* "new", a session's uuid, or NULL */
	char *system;               /* session "new": the leading system message, for session.new */
	char *prompt;               /* completions */
	struct api_msg *msgs;       /* chat */
	size_t n_msgs;
	char **stop;
	size_t n_stop;
	struct api_num nums[API_MAX_NUMS];
	int n_nums;
	int stream, include_usage;
	/*
	 * The output's constraint: the generate field "grammar" (resident's own
	 * grammar field), "json_schema" (response_format json_schema) or "json"
	 * (json_object); NULL for none. constraint_text is the grammar, or the
	 * schema as JSON text; NULL for json.
	 */
	const char *constraint;
	char *constraint_text;
	/*
	 * logprobs: each token's log-probability, and top_logprobs (0..20) of
	 * the step's most likely tokens (chat: logprobs true and top_logprobs;
	 * completions: logprobs N, 0..5).
	 */
	int logprobs, top_logprobs;
	int n;                      /* choices to make, 1..API_MAX_CHOICES */
	/*
	 * Tools (chat): the tools as the daemon's `tools` JSON text, its
	 * tool_choice ("auto", "none", "required"; NULL: the default) and the
	 * named tool of a tool_choice {"type": "function", "function": {name}}.
	 */
	char *tools;
	const char *tool_choice;
	char *tool_name;
};

/* What identifies one reply: its id ("chatcmpl-..."), creation time, model and session. */
struct api_meta {
	char id[48];
	long long created;
	const char *model;
	const char *session;        /* NULL when the request named none */
};

/* Token counts and times of a finished generation (the done's usage). */
struct api_usage {
	uint64_t prompt, cached, generated;
	double ttft_ms, tokens_per_s;
};

/*
 * Parses and checks a request body. session_header is the X-Resident-Session
 * header (NULL if absent). Returns 0 with *r filled (free it with
 * api_req_free), or -1 with *e filled (a 400).
 */
int api_parse(enum api_kind kind, const char *body, size_t len, const char *session_header,
    struct api_req *r, struct api_error *e);
void api_req_free(struct api_req *r);
/* The JSON object of a request body, or NULL with *e (a 400). */
json_t *api_body(const char *body, size_t len, struct api_error *e);
/* The numeric fields of o that fields names, checked for type (ranges are the daemon's). 0, or -1 with *e. */
int api_parse_nums(const json_t *o, const struct api_num_field *fields, size_t n, struct api_req *r,
    struct api_error *e);
/* o's stop: a string or an array of strings. 0, or -1 with *e. */
int api_parse_stop(const json_t *o, struct api_req *r, struct api_error *e);
/* o's messages (chat's), with their tool fields. 0, or -1 with *e. */
int api_parse_messages(const json_t *o, struct api_req *r, struct api_error *e);
/* o's logprobs and top_logprobs: chat's (completions': logprobs N). 0, or -1 with *e. */
int api_parse_logprobs(const json_t *o, struct api_req *r, struct api_error *e);
/* A daemon's reply (or a part of one) as JSON: bin as a string, a map's keys as they are. NULL: no memory. */
json_t *api_value_json(const rs_value *v);
/* The generate fields of r, less session and stream. NULL when out of memory. */
rs_params *api_params(const struct api_req *r);
/* A new reply id for kind ("chatcmpl-" or "cmpl-" and 24 random hex digits) and the time. */
void api_meta_init(struct api_meta *m, enum api_kind kind, const char *model);

/* OpenAI's finish_reason for a daemon's finish, or NULL for "cancel" (and unknown ones). */
const char *api_finish_reason(const char *finish);
/* A whole, non-streamed reply, without its choices yet (api_add_choice). */
json_t *api_reply(const struct api_req *r, const struct api_meta *m, const struct api_usage *u);
/*
 * Appends the next choice (its index: how many reply has) to a reply and
 * returns it (borrowed), for api_set_logprobs and api_set_tool_calls. A
 * chat choice's reasoning (the daemon's `reasoning`; NULL or "": none) is
 * its message's reasoning_content, as llama-server and vLLM name it.
 */
json_t *api_add_choice(const struct api_req *r, json_t *reply, const char *text, const char *reasoning,
    const char *finish_reason);
/*
 * A stream chunk of choice index: text (NULL: none), reasoning (chat: the
 * delta's reasoning_content; NULL or "": none), the assistant role (a
 * choice's first chat chunk), finish_reason (NULL: none), logprobs (taken;
 * NULL: none).
 */
json_t *api_chunk(const struct api_req *r, const struct api_meta *m, int index, const char *text,
    const char *reasoning, int role, const char *finish_reason, json_t *logprobs);
/* The last chunk of a stream with include_usage: no choices, the usage. */
json_t *api_usage_chunk(const struct api_req *r, const struct api_meta *m, const struct api_usage *u);
/* One entry of /v1/models. */
json_t *api_model(const char *name);
/* GET /v1/models's list of a model.list result (api_value_json's). */
json_t *api_models(const json_t *list);

/* ---- api.c: logprobs ---- */

#define API_MAX_TOP_LOGPROBS 20         /* chat's top_logprobs; the daemon's limit */
#define API_MAX_CMPL_LOGPROBS 5         /* completions' logprobs */

/* A token with its log-probability, as a token reply gives it (bytes: maybe not whole UTF-8). */
struct api_lp_token {
	const void *bytes;
	size_t len;
	double logprob;
};

/*
 * The logprobs of a reply, or of the chunks of a stream, gathered token by
 * token: chat's content entries, or completions' four arrays (text_offset
 * counts characters of the token strings from the completion's start).
 */
struct api_logprobs {
	json_t *content;
	json_t *tokens, *token_logprobs, *top_logprobs, *text_offset;
	uint64_t offset;
};

/*
 * Adds a token and the step's most likely tokens (best first; at most
 * r->top_logprobs of them are shown). A token string is its bytes decoded
 * as UTF-8, an invalid sequence U+FFFD; a logprob that is not finite
 * (-inf: a token a grammar forbids) is -9999.0, as OpenAI has it.
 * Returns -1 when out of memory.
 */
int api_logprobs_add(const struct api_req *r, struct api_logprobs *lp, const struct api_lp_token *tok,
    const struct api_lp_token *top, size_t n_top);
/* The tokens added since the last take as OpenAI's choices[i].logprobs (a new reference); NULL: no memory. */
json_t *api_logprobs_take(const struct api_req *r, struct api_logprobs *lp);
void api_logprobs_free(struct api_logprobs *lp);
/* Sets a reply's choice's logprobs (api_add_choice); takes the reference of logprobs. */
void api_set_logprobs(json_t *choice, json_t *logprobs);

/* Fills e with the HTTP status and OpenAI error for a libresident status and its message. */
void api_error_from_status(rs_status st, const char *message, struct api_error *e);
/* Fills e, its message cut at a character boundary to fit; returns -1 (for `return api_error_set(...)`). */
int api_error_set(struct api_error *e, int status, const char *type, const char *param,
    const char *code, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* Cuts a UTF-8 string cut short by its last bytes back to its last whole character. */
void api_utf8_cut(char *s);
/* A 400 about the field param; returns -1. */
#define api_bad(e, param, ...) api_error_set(e, 400, "invalid_request_error", param, NULL, __VA_ARGS__)
/* A 500: out of memory; returns -1. */
#define api_nomem(e) api_error_set(e, 500, "server_error", NULL, NULL, "out of memory")
/* A field's value; absent and null are the same: not given (NULL). */
json_t *api_field(const json_t *o, const char *key);
/*
 * The daemon's think for v, a string of an API's levels: names holds n
 * pairs {the API's name, the daemon's think}. NULL when v is none of them.
 */
const char *api_think(const json_t *v, const char *const names[][2], size_t n);
/* A JSON string of daemon text (always UTF-8; NULL: ""); "" if it were not. */
json_t *api_text_json(const char *s);
/* {"error": {...}} */
json_t *api_error_json(const struct api_error *e);

/* ---- tools.c ---- */

/* tools and tool_choice of a chat request (completions: refused). 0, or -1 with *e (a 400). */
int api_tools_parse(const json_t *o, struct api_req *r, struct api_error *e);
/*
 * The tool fields of messages[i]: a tool message's tool_call_id and name,
 * an assistant message's tool_calls. 0, or -1 with *e.
 */
int api_tools_message(const json_t *m, size_t i, struct api_msg *msg, struct api_error *e);
void api_msg_free(struct api_msg *m);
/* Appends a message to p's messages, with its tool fields. */
rs_status api_message_params(rs_params *p, const struct api_msg *m);
/* Sets r's tools, tool_choice and tool_name on p. */
rs_status api_tools_params(const struct api_req *r, rs_params *p);
/*
 * Whether answer text so far (streamed with tools offered) may still turn
 * out to be a call that its family writes as text (a JSON object, Mistral's
 * array, a fenced block): it is held back until the done says.
 */
int api_tools_may_call(const struct api_req *r, const char *text);
/* Whether s is NULL, empty or whitespace: text beside calls that is no answer. */
int api_blank(const char *s);
/*
 * A non-streamed chat reply's choice (api_add_choice's) with the daemon's
 * tool_calls: message.tool_calls, its content null when it was the calls'
 * text or is blank, finish_reason "tool_calls".
 */
void api_set_tool_calls(json_t *choice, const rs_value *calls, int calls_in_text);
/* A stream chunk of choice index with every call as delta.tool_calls (index, id, type, function {...}). */
json_t *api_tool_chunk(const struct api_req *r, const struct api_meta *m, int index, const rs_value *calls);

/* ---- ollama_api.c ---- */

/*
 * What a request of /api/chat or /api/generate asks for: a reply, or, with
 * no messages or prompt, its model loaded (keep_alive 0: unloaded).
 */
enum ollama_action { OLLAMA_GENERATE, OLLAMA_LOAD, OLLAMA_UNLOAD };

/*
 * The version of Ollama's API /api/version gives: clients compare it to
 * turn features on (structured outputs 0.5, thinking 0.9, tool calls
 * streamed 0.8), all of which resident-http serves.
 */
#define OLLAMA_VERSION "0.12.0"

/*
 * Parses and checks a body of /api/chat (d API_OLLAMA_CHAT) or
 * /api/generate (API_OLLAMA_GENERATE) into *r: stream true by default,
 * options as resident's sampling fields, format as the output's
 * constraint, think, keep_alive; a seed drawn at random when none is
 * given, as Ollama's default is. Returns 0 with *r (api_req_free) and
 * *action, or -1 with *e (a 400).
 */
int ollama_parse(enum api_dialect d, const char *body, size_t len, struct api_req *r, enum ollama_action *action,
    struct api_error *e);
/* The model a body names (/api/show's `model`, or its old name `name`): malloc'd, or NULL with *e. */
char *ollama_parse_model(const char *body, size_t len, struct api_error *e);
/* keep_alive: seconds, or a duration as Go writes it ("5m", "1h30m", "-1"); negative: -1. 0, or -1 with *e. */
int ollama_keep_alive(const json_t *v, double *seconds, struct api_error *e);
/*
 * The daemon's name among names (n of them) of the model an Ollama client
 * asked for: the name itself, else, for a name with the tag ":latest", the
 * name without it. NULL: none.
 */
const char *ollama_resolve(char *const *names, size_t n, const char *asked);
/* The current Unix time. */
double ollama_now(void);
/* RFC 3339 in UTC with nanoseconds ("2026-11-22T10:00:00.123456789Z") of a Unix time t; size >= 40. */
void ollama_time(char *buf, size_t size, double t);
/* {"error": message} */
json_t *ollama_error_json(const struct api_error *e);
/* A streamed object with a token's text and reasoning (NULL: none) and its logprobs (api_logprobs_take's; taken). */
json_t *ollama_chunk(const struct api_req *r, const struct api_meta *m, const char *text, const char *reasoning,
    json_t *logprobs);
/* A streamed object with the reply's tool calls (the done's tool_calls, api_value_json's). */
json_t *ollama_calls_chunk(const struct api_req *r, const struct api_meta *m, const json_t *calls);

/* The end of a reply, for its last object. */
struct ollama_end {
	const char *finish;         /* the daemon's */
	int whole;                  /* not streamed: the object carries the reply's text, ... */
	const char *text, *reasoning;
	const json_t *calls;        /* the done's tool_calls (api_value_json's); NULL: none */
	int calls_in_text;
	json_t *logprobs;           /* api_logprobs_take's (taken); NULL: none */
	struct api_usage u;
	double seconds;             /* since the request came */
};
/* The last object: done, done_reason and the timings (nanoseconds) and token counts. */
json_t *ollama_final(const struct api_req *r, const struct api_meta *m, struct ollama_end *end);
/* The object of a model loaded or unloaded for an empty request (done_reason "load" or "unload"). */
json_t *ollama_loaded(enum api_dialect d, const char *asked, enum ollama_action action);
/* The name /api/tags and /api/ps give a daemon's model: with the tag ":latest" when it has none. */
json_t *ollama_name(const char *name);
/* An /api/tags entry of a model.list model, its file's mtime (Unix time; 0: unknown) and size. */
json_t *ollama_tag(const json_t *model, double mtime, uint64_t file_size);
/* /api/ps of a status result and a model.list one, at the Unix time now. */
json_t *ollama_ps(const json_t *status, const json_t *list, double now);
/* /api/show of model.show's model, its file's mtime (0: unknown). */
json_t *ollama_show(const json_t *model, double mtime);

/* ---- metrics.c ---- */

/* The content type of Prometheus' text exposition format, which GET /metrics answers in. */
#define METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"
/* A status result (api_value_json's) in that format: malloc'd, its length in *len; NULL: out of memory. */
char *metrics_text(const json_t *status, size_t *len);

/* ---- ollama.c ---- */

/* A request under /api/ (path, percent-encoded as it came). */
void ollama_route(struct oa *oa, struct evhttp_request *req, const char *path);

/* ---- guard.c ---- */

#define GUARD_MAX_NAMES 32

/*
 * The names and web pages the bridge answers besides its own. The strings
 * are the command line's (and main's), compared without regard to case.
 */
struct guard {
	const char *origins[GUARD_MAX_NAMES];   /* --allow-origin's; "*": any */
	size_t n_origins;
	const char *hosts[GUARD_MAX_NAMES];     /* --allow-host's; "*": any */
	size_t n_hosts;
	const char *listen_name;    /* --listen's ADDR (a name or an address); NULL: none given */
};

/* Adds an --allow-origin (SCHEME://HOST[:PORT], or "*"); kept, not copied. 0, or -1 with msg. */
int guard_allow_origin(struct guard *g, const char *origin, char *msg, size_t size);
/* Adds an --allow-host, a name Host may give ("*": any); kept, not copied. 0, or -1 with msg. */
int guard_allow_host(struct guard *g, const char *name, char *msg, size_t size);
/* Warns at start of settings that open the bridge to every web page. */
void guard_warn(const struct oa *oa);
/*
 * Before the routes: refuses (403) a Host the bridge is not known by and a
 * web page's Origin that is not allowed, answers an allowed origin's
 * preflight (204), and adds CORS' headers for an allowed other origin.
 * Returns 1 if the request goes on to its route, 0 if it was answered.
 */
int guard_request(struct oa *oa, struct evhttp_request *req);
/* A POST whose Content-Type is not application/json is answered 415: returns 0; else 1. */
int guard_body(struct evhttp_request *req);

/* ---- http.c ---- */

/* The largest request line and headers taken. */
#define HTTP_MAX_HEADERS (64u << 10)

/* The bridge's settings and state, one per process. */
struct oa {
	struct event_base *base;
	struct evhttp *http;
	bool unix_listener;         /* it listens on a Unix socket (--listen unix:PATH), not TCP */
	const char *socket;         /* residentd's socket; NULL: rs_default_socket */
	char *api_key;              /* NULL: requests need no key */
	size_t max_unread;          /* bytes of a stream a client may leave unread */
	unsigned idle_timeout;      /* seconds a connection may wait without a request under way */
	unsigned request_timeout;   /* seconds for a request to arrive whole, and for its reply to be taken */
	char **models;              /* the model names residentd listed (a cache) */
	size_t n_models;
	struct call *calls;         /* requests in progress */
	struct guard guard;         /* what guard.c lets in */
	struct conn *conns;         /* HTTP connections (conn.c) */
	struct listener_pause pause;  /* accepting paused after accept() failed (conn.c) */
};

/* The evhttp callback of every request. */
void http_request_cb(struct evhttp_request *req, void *arg);
/* A request's body (not NUL-terminated; "" when empty), its length in *len. */
const char *http_body(struct evhttp_request *req, size_t *len);
/* Sends a JSON body with status; takes the reference. */
void http_send_json(struct evhttp_request *req, int status, json_t *body);
/* Sends a 200 JSON body whose reals are float32s (embeddings), each in the 9 significant digits
 * that give it back; takes the reference. */
void http_send_vectors(struct evhttp_request *req, json_t *body);
/* Sends e with its status, in the shape of the API of req's URL (http_error_json). */
void http_send_error(struct evhttp_request *req, const struct api_error *e);
/* e's body in the API of req's URL: Ollama's {"error": message} under /api/, else OpenAI's. */
json_t *http_error_json(struct evhttp_request *req, const struct api_error *e);
/* Answers a path that exists with other methods (allow: them, a 405) or one that does not (NULL: 404). */
void http_route_none(struct evhttp_request *req, const char *path, const char *allow);
/* Adds a reply header (before the reply is sent). */
void http_add_header(struct evhttp_request *req, const char *name, const char *value);
/*
 * A streamed reply, framed as the API of req's URL has it: OpenAI's
 * server-sent events ("data: JSON" each, "data: [DONE]" last), or under
 * /api/ Ollama's NDJSON (a JSON object a line). HTTP/1.1 sends it chunked;
 * HTTP/1.0 has no chunks: it is sent as it is and ended by closing the
 * connection (also one the client asked to keep alive).
 */
/* Starts the stream: 200, text/event-stream or application/x-ndjson. */
void http_stream_start(struct evhttp_request *req);
/* Sends one object; takes the reference. */
void http_stream_send(struct evhttp_request *req, json_t *data);
/* Ends the stream (after "data: [DONE]" for an event stream). */
void http_stream_end(struct evhttp_request *req);
/* Bytes written to the request's client that it has not read yet. */
size_t http_unsent(struct evhttp_request *req);

/* ---- conn.c ---- */

/*
 * Sets up the connections of the listener bound: evhttp's connections are
 * taken up as they come, accepting pauses while descriptors run out.
 * 0, or -1 when out of memory.
 */
int conn_setup(struct oa *oa, struct evhttp_bound_socket *bound);
/*
 * Listens on a Unix socket at path, created 0600 (a socket file left
 * there by a bridge that is gone is replaced). NULL with err (size bytes)
 * saying why; sets oa->unix_listener.
 */
struct evhttp_bound_socket *conn_listen_unix(struct oa *oa, const char *path, char *err, size_t size);
/* Frees what is left of the connections, after evhttp_free. */
void conn_free_all(struct oa *oa);
/*
 * A request came whole (first thing in http_request_cb): its connection
 * waits for its reply. 1; or 0 when the connection has none of the
 * bridge's state (out of memory when it came): the request is then
 * answered 500 and the connection closed.
 */
int conn_request(struct oa *oa, struct evhttp_request *req);
/*
 * Watches for the client of req leaving while its reply is being made,
 * which has no deadline meanwhile. When it leaves, or when conn_drop gives
 * up on it, req is released and the watch ended, then gone(arg) is called:
 * neither may be used again. Returns the watch (the connection), or NULL
 * when out of memory.
 */
struct conn *conn_watch(struct oa *oa, struct evhttp_request *req, void (*gone)(void *), void *arg);
/* The reply begins to be sent (a stream's start): the client's leaving is seen when a write fails. NULL allowed. */
void conn_reply_begins(struct conn *w);
/* Ends the watch before the reply's end is sent; the client has request_timeout to take it. NULL allowed. */
void conn_unwatch(struct conn *w);
/* Closes the connection of a client that is not reading its stream, as if it had left. */
void conn_drop(struct conn *w);

/* ---- call.c ---- */

/*
 * A request answered from daemon ops (model.list, status, model.show, ...):
 * the model it names, if any, is checked first against residentd's models
 * (in the dialect's way: OpenAI's names as they are, Ollama's as
 * ollama_resolve finds them; 404 for one residentd does not have), then
 * each op of ops (NULL-terminated) is sent in turn, with params' fields
 * (taken; NULL: none) and that model's daemon name as its `model`, and
 * reply(req, model, results, arg) answers
 * with their results (as JSON, one an op; borrowed) and the daemon's name.
 * An error of the daemon is answered as any call's.
 */
typedef void (*call_reply_fn)(struct evhttp_request *req, const char *model, json_t *const *results,
    void *arg);
#define CALL_MAX_OPS 4
void call_ops(struct oa *oa, struct evhttp_request *req, const char *path, enum api_dialect d,
    const char *model, const char *const *ops, rs_params *params, call_reply_fn reply, void *arg);
/* A checked completion request; takes r. */
void call_generate(struct oa *oa, struct evhttp_request *req, struct api_req *r);
/* Ends every call (at exit): daemon connections closed, requests left to evhttp_free. */
void call_free_all(struct oa *oa);

/* ---- embed.c ---- */

/*
 * Routes the embeddings requests: POST /v1/embeddings (OpenAI's),
 * /api/embed and /api/embeddings (Ollama's). Returns 1 if path is one of
 * them (the request is then answered), else 0.
 */
int embed_route(struct oa *oa, struct evhttp_request *req, const char *path);

#endif
