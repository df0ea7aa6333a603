/*
 * proto.h: the wire protocol (libclient/PROTOCOL.md) as C: frames in,
 * validated requests out; replies built with msgpack-c. Bump
 * PROTO_VERSION when a change would break an existing client.
 */
#ifndef RESIDENT_PROTO_H
#define RESIDENT_PROTO_H

#include <msgpack.h>
#include <stddef.h>
#include <stdint.h>

#include "chat.h"
#include "draft.h"
#include "sample.h"

#define PROTO_VERSION 1
#define PROTO_MAX_FRAME_DEFAULT (16u << 20)

/*
 * Limits of what a request may carry (PROTOCOL.md, Limits), each refused
 * with invalid_param and a message naming the field. Lengths are bytes of
 * UTF-8. Titles and system prompts are the store's to bound (store.h).
 */
#define PROTO_MAX_STOP 16            /* stop strings of a generate */
#define PROTO_MAX_STOP_LEN 256       /* bytes of one stop string */
#define PROTO_MAX_MSGS 4096          /* messages of a generate */
/* A prompt, the contents of a generate's messages together, a tokenize
 * text: a whole 128k-token context of prose is about half of it. */
#define PROTO_MAX_TEXT (1u << 20)
#define PROTO_MAX_CLIENT 64          /* hello's client name */
#define PROTO_MAX_MODEL 4096         /* a model name or path (PATH_MAX) */
#define PROTO_MAX_TOKENS (1u << 18)  /* token ids of a detokenize */
#define PROTO_MAX_TOP_LOGPROBS 20    /* likely tokens a token reply lists (SAMPLE_TOP) */
#define PROTO_MAX_CHOICES 8          /* a generate's n: choices of one prompt */
#define PROTO_MAX_LIST 1000          /* session.list's limit */
#define PROTO_MAX_INFLIGHT 1024      /* requests in flight on one connection */
#define PROTO_MAX_INPUTS 2048        /* inputs of an embed */

enum proto_op {
	OP_HELLO, OP_GENERATE, OP_CANCEL,
	OP_SESSION_NEW, OP_SESSION_LIST, OP_SESSION_GET, OP_SESSION_FORK, OP_SESSION_RENAME,
	OP_SESSION_DELETE,
	OP_MODEL_LIST, OP_MODEL_LOAD, OP_MODEL_UNLOAD, OP_MODEL_SHOW,
	OP_TOKENIZE, OP_DETOKENIZE, OP_STATUS, OP_EMBED,
	OP_COUNT_
};

/* Stable error codes; their strings are the protocol's. */
enum proto_err {
	PE_NONE,
	PE_BAD_FRAME, PE_FRAME_TOO_LARGE, PE_BAD_REQUEST, PE_UNKNOWN_OP, PE_INVALID_PARAM,
	PE_INVALID_UTF8, PE_CONTEXT_EXCEEDED, PE_NOT_FOUND, PE_DUPLICATE_ID, PE_OVERLOADED,
	PE_MODEL_ERROR, PE_SHUTTING_DOWN, PE_INTERNAL, PE_QUOTA_EXCEEDED, PE_STORAGE_FULL,
	PE_SESSION_BUSY, PE_FRAME_TIMEOUT, PE_CANCELLED,
	PE_COUNT_
};

enum proto_priority { PRIO_INTERACTIVE, PRIO_BACKGROUND };

struct proto_msg {
	char *role;
	char *content;
	char *reasoning;        /* a session's stored assistant turn's (sched_job.history); NULL: none, and
	                           always in a request */
	struct chat_call *calls; /* an assistant message's tool calls */
	int n_calls;
	char *tool_call_id;     /* a tool message's: the call it answers; NULL: none given */
	char *name;             /* a tool message's: the tool's name; NULL: none given */
};

/* One input of an embed: text, or token ids. */
struct proto_input {
	char *text;             /* NULL: tokens */
	int32_t *tokens;
	size_t n_tokens;
};

/* What a generate's tools may be used for (PROTOCOL.md, Tool calls). */
enum proto_tool_choice {
	TOOLS_AUTO,             /* the model may call a tool or answer */
	TOOLS_NONE,             /* the tools are not shown to the model: it answers, and no call is parsed */
	TOOLS_REQUIRED,         /* the reply is one or more calls, constrained by the tools' parameters */
};

/* Which sampling fields a request set (a session's defaults fill the others). */
enum {
	SET_TEMPERATURE = 1 << 0, SET_TOP_K = 1 << 1, SET_TOP_P = 1 << 2, SET_MIN_P = 1 << 3,
	SET_REPEAT = 1 << 4, SET_PRESENCE = 1 << 5, SET_FREQUENCY = 1 << 6, SET_SEED = 1 << 7,
	SET_MAX_TOKENS = 1 << 8, SET_KEEP_ALIVE = 1 << 9,
};

/* A decoded request; strings are malloc'd, NUL-terminated, valid UTF-8. */
struct proto_req {
	uint64_t id;
	enum proto_op op;
	/* hello */
	char *client;
	/* generate */
	char *prompt;
	struct proto_msg *msgs;
	int n_msgs;
	struct sample_params sample;
	int32_t max_tokens;
	float keep_alive;       /* seconds the model stays loaded unused afterwards; < 0: until needed */
	unsigned set;           /* SET_* */
	char *stop[PROTO_MAX_STOP];
	int n_stop;
	enum proto_priority priority;
	int stream;
	int logprobs;
	int32_t top_logprobs;   /* with logprobs: 0..PROTO_MAX_TOP_LOGPROBS likely tokens a token reply lists */
	int n_choices;          /* n: 1..PROTO_MAX_CHOICES outputs of the one prompt (1 with a session) */
	/* at most one of these constrains the output (grammar.h, jschema.h): */
	char *grammar;          /* grammar text */
	char *json_schema;      /* a JSON Schema as JSON text */
	int json;               /* 1: any JSON object */
	char *tools;            /* the tools offered, as chat_tools_check writes them; NULL: none */
	enum proto_tool_choice tool_choice;
	char *tool_name;        /* with TOOLS_REQUIRED: the one tool to call; NULL: any of them */
	enum chat_think think;  /* think: how much a reasoning model reasons first */
	enum spec_mode speculative; /* "auto" (the default), "on" or "off" */
	char *draft;            /* the draft model that guesses (a name or path), or NULL: lookup's guesses */
	/* embed */
	struct proto_input *inputs;
	int n_inputs;
	int32_t dimensions;     /* 0: the model's */
	int truncate;           /* cut inputs longer than the context to it */
	/* shared by several ops */
	char *session;
	char *model;
	char *title;
	char *system;
	char *defaults;         /* session.new: the sampling defaults as JSON text */
	uint64_t target;        /* cancel */
	int limit, offset;      /* session.list */
	char *text;             /* tokenize */
	int special;
	int bos;                /* -1: the model's choice */
	int32_t *tokens;        /* detokenize */
	size_t n_tokens;
};

/*
 * Decodes one frame's payload. Returns 0, or a PE_* code with a message in
 * err; *has_id tells whether req->id could be read (for the error reply).
 */
int proto_decode(const char *buf, size_t len, struct proto_req *req, int *has_id, char *err);
void proto_req_free(struct proto_req *req);
/* Frees a message's fields (a request's, or a session's stored turn's). */
void proto_msg_free(struct proto_msg *m);

const char *proto_err_name(enum proto_err e);
const char *proto_op_name(enum proto_op op);

/* Fills a request's sampling fields with the protocol defaults (generate without a session). */
void proto_sample_defaults(struct proto_req *req);
/* How many of grammar, json_schema and json a request gives (a decoded one: at most one). */
int proto_constraints(const struct proto_req *req);

/*
 * Replies. A reply is built into a msgpack_sbuffer that starts with 4 bytes
 * reserved for the frame length; proto_reply_end fills them in.
 */
void proto_reply_begin(msgpack_sbuffer *sb, msgpack_packer *pk, int has_id, uint64_t id,
    const char *type, size_t n_more_fields);
void proto_reply_end(msgpack_sbuffer *sb);
void proto_pack_str(msgpack_packer *pk, const char *s);
void proto_pack_kv_str(msgpack_packer *pk, const char *k, const char *v);
/* k and the n bytes of v (NULL when n is 0), which need not be NUL-terminated. */
void proto_pack_kv_strn(msgpack_packer *pk, const char *k, const char *v, size_t n);
void proto_pack_kv_uint(msgpack_packer *pk, const char *k, uint64_t v);
void proto_pack_kv_float(msgpack_packer *pk, const char *k, double v);
void proto_pack_kv_bool(msgpack_packer *pk, const char *k, int v);
/* Tool calls: an array of {id, name, arguments}. */
void proto_pack_calls(msgpack_packer *pk, const struct chat_call *calls, size_t n);
/* A whole error reply. */
void proto_error(msgpack_sbuffer *sb, int has_id, uint64_t id, enum proto_err code, const char *msg);

#endif
