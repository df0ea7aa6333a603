/*
 * resident.h: libresident, the client library of residentd.
 *
 * One connection to the daemon is an rs_client. Requests are made either
 * with blocking calls (rs_generate, rs_session_list, ...) or started
 * without waiting (rs_generate_start, rs_call_start) and driven from the
 * application's own event loop (rs_fd, rs_process). Both may be mixed
 * on one connection and many requests may be in flight: while a blocking
 * call waits for its reply it dispatches the replies of the others to their
 * callbacks.
 *
 * Results are rs_value trees: the daemon's reply as a read-only map, read
 * with rs_get / rs_str / rs_uint / ... Their keys are those of the protocol
 * (libclient/PROTOCOL.md), less `id` and `type`. A tree returned through an
 * `rs_value **out` belongs to the caller, who frees it with rs_value_free;
 * every value reached from it is borrowed and lives as long as the tree.
 * Values passed to callbacks are borrowed for the duration of the call.
 *
 * Calls on a client return an rs_status: RS_OK, an error the daemon
 * answered (RS_ERR_NOT_FOUND, ...) or a local one (RS_ERR_IO, ...). The
 * message of the last failure is rs_last_error(client), its status
 * rs_last_status(client).
 *
 * Callbacks run inside rs_process or inside any blocking call that waits
 * (also one made from a callback), in the order the replies arrive. An
 * rs_client is not thread-safe: use it from one thread at a time, and do
 * not close it (rs_close) from inside one of its callbacks. The library
 * never raises SIGPIPE and installs no signal handlers.
 */
#ifndef RESIDENT_H
#define RESIDENT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The protocol version this library speaks (hello's `version`). */
#define RS_PROTOCOL_VERSION 1

typedef struct rs_client rs_client;   /* one connection to residentd */
typedef struct rs_value rs_value;     /* a read-only msgpack value: a reply or a part of one */
typedef struct rs_params rs_params;   /* the fields of a request, built by the caller */

/*
 * Outcomes. 1..99 are the daemon's stable error codes (PROTOCOL.md,
 * "Errors"); 100 and up happen on this side of the socket.
 */
typedef enum rs_status {
	RS_OK = 0,
	RS_ERR_BAD_FRAME = 1,         /* bad_frame */
	RS_ERR_FRAME_TOO_LARGE,       /* frame_too_large */
	RS_ERR_BAD_REQUEST,           /* bad_request */
	RS_ERR_UNKNOWN_OP,            /* unknown_op */
	RS_ERR_INVALID_PARAM,         /* invalid_param */
	RS_ERR_INVALID_UTF8,          /* invalid_utf8 */
	RS_ERR_CONTEXT_EXCEEDED,      /* context_exceeded */
	RS_ERR_NOT_FOUND,             /* not_found */
	RS_ERR_DUPLICATE_ID,          /* duplicate_id */
	RS_ERR_OVERLOADED,            /* overloaded */
	RS_ERR_MODEL_ERROR,           /* model_error */
	RS_ERR_SHUTTING_DOWN,         /* shutting_down */
	RS_ERR_INTERNAL,              /* internal */
	RS_ERR_QUOTA_EXCEEDED,        /* quota_exceeded */
	RS_ERR_STORAGE_FULL,          /* storage_full */
	RS_ERR_SESSION_BUSY,          /* session_busy */
	RS_ERR_FRAME_TIMEOUT,         /* frame_timeout */
	RS_ERR_CANCELLED,             /* cancelled (an embed) */
	RS_ERR_OTHER = 99,            /* a code this library does not know (a newer daemon) */
	RS_ERR_CONNECT = 100,         /* cannot connect: residentd is not running, or no permission */
	RS_ERR_IO,                    /* the connection failed or was closed */
	RS_ERR_PROTOCOL,              /* the daemon sent something this library cannot read */
	RS_ERR_INVAL,                 /* a bad argument to a library function */
	RS_ERR_NOMEM                  /* out of memory */
} rs_status;

/* An error with its message, for calls that have no client to keep it (rs_connect). */
typedef struct rs_error {
	rs_status code;
	char message[256];            /* English, for people; "" when code is RS_OK */
} rs_error;

/* A short English description of st. Never NULL. */
const char *rs_strerror(rs_status st);
/* The protocol's code string of st ("not_found"), or NULL for RS_OK and local errors. */
const char *rs_status_code(rs_status st);
/* The status of a protocol code string; RS_ERR_OTHER for one this library does not know. */
rs_status rs_status_from_code(const char *code);

/* ---- connecting ---- */

/* rs_connect flags */
#define RS_START_DAEMON 0x1   /* nobody listens: start residentd and wait for its socket */
/*
 * Never wait for the daemon outside a blocking call: the connect does not
 * wait (a daemon whose queue of connections is full is RS_ERR_CONNECT), and
 * rs_generate_start, rs_call_start and rs_cancel_start queue what the
 * socket does not take at once instead of waiting for it to drain. While
 * rs_unsent is not 0 the application also polls rs_fd for writability
 * (POLLOUT) and calls rs_process when it is writable, which sends more.
 * A start then fails only for reasons of this side (no memory, a request
 * over max_frame, a connection already over); a write that fails ends the
 * connection at the next rs_process, as a lost connection does. Blocking
 * calls work as without the flag (they send their request while waiting
 * for its reply). Not with RS_START_DAEMON, which waits for the daemon.
 */
#define RS_NONBLOCK 0x2

/*
 * Writes the socket path used when none is given: $RESIDENT_SOCKET, else
 * $XDG_RUNTIME_DIR/resident/socket, else /tmp/resident-UID/socket (as
 * residentd does). Returns 0, or -1 if it does not fit in size bytes.
 */
int rs_default_socket(char *buf, size_t size);

/*
 * Connects to residentd at socket_path (NULL: rs_default_socket). With
 * RS_START_DAEMON, if nobody listens there, runs `residentd -s PATH`
 * (the program is $RESIDENT_DAEMON, else residentd from PATH) detached in
 * its own session, and waits up to 10 seconds for the socket to accept.
 * With RS_NONBLOCK, the client never waits for the daemon (above).
 * Returns the client, to be closed with rs_close, or NULL with *err filled
 * (err may be NULL): RS_ERR_CONNECT when nobody listens (the message names
 * the socket), RS_ERR_INVAL for a path too long or RS_START_DAEMON with
 * RS_NONBLOCK, RS_ERR_NOMEM.
 */
rs_client *rs_connect(const char *socket_path, int flags, rs_error *err);

/* Closes the connection and frees the client. Requests in flight, and bytes
 * of theirs not sent yet (RS_NONBLOCK), are dropped without calling their
 * callbacks. NULL is allowed. */
void rs_close(rs_client *c);

/* The message of the client's last failed call ("" if none failed). Valid until the next call. */
const char *rs_last_error(const rs_client *c);
/* The status of the client's last failed call (RS_OK if none failed): what a start that
 * returned 0 failed with. */
rs_status rs_last_status(const rs_client *c);

/* ---- request fields ---- */

/*
 * An rs_params holds request fields by their protocol names (PROTOCOL.md):
 * for rs_generate, `prompt` or messages, `session`, `model`, `max_tokens`,
 * `temperature`, `top_k`, `top_p`, `min_p`, `repeat_penalty`,
 * `presence_penalty`, `frequency_penalty`, `seed`, `priority`, `stream`,
 * `logprobs`, `keep_alive`, `n` (several choices: rs_reply_choice), stop
 * strings, at most one of `grammar`,
 * `json_schema` (strings: grammar text, a JSON Schema as JSON text) and
 * `json` (bool) to constrain the output, and `tools` (JSON text),
 * `tool_choice` and `tool_name` for tool calls. The library does not check names
 * or values (the daemon does, and ignores names it does not know); setting
 * a field twice replaces it. The setters return RS_OK, RS_ERR_INVAL (a NULL
 * argument, or the key "id" or "op", which the library sets) or
 * RS_ERR_NOMEM. The caller frees the params with rs_params_free; a call
 * that takes params only reads them.
 */
rs_params *rs_params_new(void);
void rs_params_free(rs_params *p);
rs_status rs_params_set_str(rs_params *p, const char *key, const char *value);
rs_status rs_params_set_uint(rs_params *p, const char *key, uint64_t value);
rs_status rs_params_set_float(rs_params *p, const char *key, double value);
rs_status rs_params_set_bool(rs_params *p, const char *key, int value);
/* Appends {role, content} to `messages` (role: "system", "user", "assistant" or "tool"). */
rs_status rs_params_add_message(rs_params *p, const char *role, const char *content);
/*
 * Appends a copy of map to the array of maps key: a message with more
 * fields than role and content to `messages` (a tool result's tool_call_id
 * and name, an assistant message's tool_calls: rs_params_add_call).
 */
rs_status rs_params_add_map(rs_params *p, const char *key, const rs_params *map);
/* Appends a call {id (NULL: none), name, arguments (JSON text)} to a message's `tool_calls`. */
rs_status rs_params_add_call(rs_params *msg, const char *id, const char *name, const char *arguments);
/* Appends a string to `stop`. */
rs_status rs_params_add_stop(rs_params *p, const char *stop);
/* Appends a string to the array of strings key (embed's `input`). */
rs_status rs_params_add_str(rs_params *p, const char *key, const char *value);

/* ---- reading values ---- */

typedef enum rs_type {
	RS_TYPE_NONE,       /* no value (a NULL pointer: a missing key, an index out of range) */
	RS_TYPE_NIL,
	RS_TYPE_BOOL,
	RS_TYPE_UINT,       /* an integer >= 0 */
	RS_TYPE_INT,        /* an integer < 0 */
	RS_TYPE_FLOAT,
	RS_TYPE_STR,        /* also msgpack bin: bytes, maybe not UTF-8 */
	RS_TYPE_ARRAY,
	RS_TYPE_MAP
} rs_type;

/*
 * Every accessor accepts NULL, so calls chain: rs_str(rs_get(s, "title")).
 * rs_get: the value of key in a map, or NULL (not a map, no such key).
 * rs_at: the i-th element of an array or the i-th value of a map, or NULL.
 * rs_key: the i-th key of a map, or NULL.
 * rs_len: elements of an array, pairs of a map, bytes of a string; else 0.
 * rs_str: a string's bytes, NUL-terminated, or NULL if v is not a string.
 * rs_uint, rs_int: an integer's value (rs_uint: 0 for a negative one), else 0.
 * rs_float: a number's value (integers converted), else 0.
 * rs_bool: 1 for true, else 0.
 */
rs_type rs_value_type(const rs_value *v);
const rs_value *rs_get(const rs_value *map, const char *key);
const rs_value *rs_at(const rs_value *v, size_t i);
const char *rs_key(const rs_value *map, size_t i);
size_t rs_len(const rs_value *v);
const char *rs_str(const rs_value *v);
uint64_t rs_uint(const rs_value *v);
int64_t rs_int(const rs_value *v);
double rs_float(const rs_value *v);
int rs_bool(const rs_value *v);
/* Frees a tree returned through an `rs_value **out`; a no-op for NULL and for borrowed values. */
void rs_value_free(rs_value *v);

/* ---- callbacks ---- */

/*
 * A generated piece: text is its answer text, whole UTF-8 characters,
 * NUL-terminated (maybe ""); reply is the whole `token` reply (`token` id,
 * `logprob`, and its reasoning and tool text: rs_reply_reasoning,
 * rs_reply_tool). Return 0 to go on, nonzero to cancel the generation (it
 * then ends with finish "cancel").
 */
typedef int (*rs_token_cb)(uint64_t id, const char *text, const rs_value *reply, void *user);
/* The generation ended: done holds `finish`, `usage`, `session`, and without streaming `text`
 * and its reasoning and tool text; with `n` > 1, `usage` and `choices` instead: an array of
 * maps, one a choice, each with those fields of its own (PROTOCOL.md, "Several choices").
 * Also rs_call_start's result: then done is the op's result. */
typedef void (*rs_done_cb)(uint64_t id, const rs_value *done, void *user);

/*
 * The reasoning text of a `token` reply (rs_token_cb's reply), or of a
 * generation's done without streaming: what the model thought before its
 * answer, apart from it (PROTOCOL.md, "Reasoning"; Qwen3's <think> block,
 * gpt-oss's analysis channel). NUL-terminated, "" when it has none (and for
 * NULL); never NULL, and borrowed from reply.
 */
const char *rs_reply_reasoning(const rs_value *reply);
/* Its tool text (gpt-oss's commentary channel, where its tool calls go), the same way. */
const char *rs_reply_tool(const rs_value *reply);
/*
 * The choice a `token` reply is of, 0..n-1, for a generation of `n` > 1
 * choices (each choice's replies come in order, the choices' interleaved);
 * 0 for a reply without one (n = 1) and for NULL.
 */
unsigned rs_reply_choice(const rs_value *reply);
/* The request failed: a daemon error, or RS_ERR_IO when the connection was lost. */
typedef void (*rs_error_cb)(uint64_t id, rs_status code, const char *message, void *user);
/* model.load: bytes done of total. */
typedef void (*rs_progress_cb)(uint64_t done, uint64_t total, void *user);

/* ---- blocking calls ----
 *
 * Each sends one request and waits for its last reply. On RS_OK a result
 * tree is stored in *out if out is not NULL (the caller frees it); on
 * failure *out is set to NULL and rs_last_error says why. Optional string
 * arguments may be NULL (the daemon's default).
 */

/*
 * hello: out gets version, server, max_frame, uid, capabilities. client_name
 * shows in status. From its result on (also that of a hello started with
 * rs_call_start), a request larger than max_frame is refused here with
 * RS_ERR_FRAME_TOO_LARGE instead of being sent.
 */
rs_status rs_hello(rs_client *c, const char *client_name, rs_value **out);

/*
 * generate with the fields in p. With on_token the text streams through it
 * (unless p sets `stream`); without, the whole text is in done's `text`.
 * done gets finish, usage, session, text. A daemon error mid-way returns
 * its code.
 */
rs_status rs_generate(rs_client *c, const rs_params *p, rs_token_cb on_token, void *user,
    rs_value **done);

/* cancel: asks the daemon to end generation `target` (in flight on this client) and waits for
 * the daemon's acknowledgement; the target then ends with finish "cancel". RS_ERR_NOT_FOUND if
 * it is not in flight (also when it ended just before the cancel reached the daemon). */
rs_status rs_cancel(rs_client *c, uint64_t target);

/* session.new: defaults holds sampling fields (may be NULL). out gets `session` (a session map). */
rs_status rs_session_new(rs_client *c, const char *model, const char *title, const char *system,
    const rs_params *defaults, rs_value **out);
/* session.list: most recently updated first; limit 0 means the daemon's default. out gets `sessions`. */
rs_status rs_session_list(rs_client *c, unsigned limit, unsigned offset, rs_value **out);
/* session.get: out gets `session` and `turns` (array of {role, content, reasoning, tokens};
 * reasoning only in an assistant turn that has some: rs_reply_reasoning reads it). */
rs_status rs_session_get(rs_client *c, const char *uuid, rs_value **out);
/* session.fork: title NULL means the parent's + " (fork)". out gets the new `session`. */
rs_status rs_session_fork(rs_client *c, const char *uuid, const char *title, rs_value **out);
/* session.rename: out gets the renamed `session`. */
rs_status rs_session_rename(rs_client *c, const char *uuid, const char *title, rs_value **out);
/* session.delete. */
rs_status rs_session_delete(rs_client *c, const char *uuid);

/* model.list: out gets `models`. */
rs_status rs_model_list(rs_client *c, rs_value **out);
/* model.load of a name or a path; progress (may be NULL) is called with each progress reply.
 * out gets `model`. */
rs_status rs_model_load(rs_client *c, const char *model, rs_progress_cb progress, void *user,
    rs_value **out);
/* model.unload: generations running on it end with finish "cancel". out (may be NULL) gets
 * `model`, `unloaded` (it was loaded) and `cancelled` (how many generations ended). */
rs_status rs_model_unload(rs_client *c, const char *model, rs_value **out);
/* model.show of a name or a path (NULL: the default model), loaded or not: out gets `model`,
 * with its parameters, quantization, tensor types, context, chat template and sizes. */
rs_status rs_model_show(rs_client *c, const char *model, rs_value **out);

/* tokenize / detokenize flags */
#define RS_TOK_SPECIAL 0x1   /* parse (tokenize) or render (detokenize) special tokens */
#define RS_TOK_BOS     0x2   /* tokenize: add BOS */
#define RS_TOK_NO_BOS  0x4   /* tokenize: do not add BOS (neither flag: the model's choice) */

/* tokenize: *tokens gets a malloc'd array of *n_tokens ids, which the caller frees with free(). */
rs_status rs_tokenize(rs_client *c, const char *model, const char *text, int flags,
    uint32_t **tokens, size_t *n_tokens);
/* detokenize: *text gets a malloc'd NUL-terminated string, which the caller frees with free(). */
rs_status rs_detokenize(rs_client *c, const char *model, const uint32_t *tokens, size_t n_tokens,
    int flags, char **text);

/*
 * embed: the vectors of n texts (1..2048) by an embedding model (NULL: the
 * default model), each cut to dimensions floats (0: the model's) and
 * normalised as the model is (PROTOCOL.md, `embed`). *vectors gets a
 * malloc'd array of n x *dims floats, text i's from i * *dims on, which
 * the caller frees with free(); out (may be NULL) gets the whole result:
 * `model`, `tokens` (each text's), `usage` (`prompt_tokens`, ...). vectors
 * and dims may be NULL: the floats are then not copied out (out holds
 * them, as `embeddings` and `dimensions`, for a caller that reads them
 * there).
 * RS_ERR_INVALID_PARAM for a model that is not an embedding model or
 * dimensions larger than its vectors, RS_ERR_CONTEXT_EXCEEDED for a text
 * longer than its context. For more fields (`truncate`, token id inputs)
 * use rs_call with "embed".
 */
rs_status rs_embed(rs_client *c, const char *model, const char *const *texts, size_t n, unsigned dimensions,
    float **vectors, size_t *dims, rs_value **out);

/* status: out gets version, uptime_s, models, clients, steps, active, queued. */
rs_status rs_server_status(rs_client *c, rs_value **out);

/* Any op with the fields in p (may be NULL): for ops this library does not wrap. */
rs_status rs_call(rs_client *c, const char *op, const rs_params *p, rs_value **out);

/* ---- in another event loop ---- */

/*
 * Starts a generation with the fields in p and returns at once. Its replies
 * are dispatched by rs_process (or by any blocking call that waits): zero
 * or more on_token (not called for a non-streaming request), then exactly
 * one of on_done and on_error. Any callback may be NULL. The request is
 * written before returning (which can block only for a frame larger than
 * the socket's buffer; with RS_NONBLOCK what the socket does not take is
 * queued: rs_unsent). Returns the request id (> 0), or 0 on failure
 * (rs_last_error, rs_last_status); after a failure no callback is called.
 */
uint64_t rs_generate_start(rs_client *c, const rs_params *p, rs_token_cb on_token,
    rs_done_cb on_done, rs_error_cb on_error, void *user);

/*
 * Any op with the fields in p (may be NULL), started as rs_generate_start
 * starts a generation: returns the request id (> 0) at once, or 0 on
 * failure (rs_last_error); its last reply comes through rs_process to
 * exactly one of on_result (the result, as a blocking call's *out) and
 * on_error. progress replies (model.load) are not delivered. For event
 * loops that must not wait for session, model or status ops.
 */
uint64_t rs_call_start(rs_client *c, const char *op, const rs_params *p, rs_done_cb on_result,
    rs_error_cb on_error, void *user);

/* Sends a cancel for generation `target` without waiting; its done (finish "cancel")
 * arrives through rs_process. Returns RS_OK or an error sending it. */
rs_status rs_cancel_start(rs_client *c, uint64_t target);

/* The socket to poll for readability (POLLIN) in the application's loop; also for
 * writability (POLLOUT) while rs_unsent is not 0. */
int rs_fd(const rs_client *c);

/*
 * Sends what is queued as far as the socket takes it, reads what the
 * socket holds, both without blocking, and calls the callbacks of every
 * complete reply. Returns RS_OK, or once the connection is over the reason
 * (RS_ERR_IO, RS_ERR_PROTOCOL, ...): then every request in flight has had
 * its on_error called, and the client can only be closed.
 */
rs_status rs_process(rs_client *c);

/* Bytes of requests queued and not yet sent (RS_NONBLOCK; always 0 without it). */
size_t rs_unsent(const rs_client *c);

/* Requests started with rs_generate_start or rs_call_start that have not ended yet. */
size_t rs_pending(const rs_client *c);

#ifdef __cplusplus
}
#endif

#endif
