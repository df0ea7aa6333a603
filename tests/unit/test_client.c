/*
 * test_client.c: libresident without a daemon. Framing, reply decoding,
 * values, params and error codes; then a client talking to a fake daemon
 * (a socket this test listens on and writes replies into by hand):
 * request frames, interleaved replies, callbacks, cancellation, a lost
 * connection.
 */
#include "config.h"
#include "internal.h"

#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

/* ---- building frames by hand ---- */

/* A msgpack buffer with a reserved length, packed by the caller, finished by seal(). */
struct frame {
	msgpack_sbuffer sb;
	msgpack_packer pk;
};

static void
open_frame(struct frame *f, size_t n_fields)
{
	static const char len[4];

	msgpack_sbuffer_init(&f->sb);
	msgpack_sbuffer_write(&f->sb, len, 4);
	msgpack_packer_init(&f->pk, &f->sb, msgpack_sbuffer_write);
	msgpack_pack_map(&f->pk, n_fields);
}

static void
kv_str(struct frame *f, const char *k, const char *v)
{
	frame_pack_str(&f->pk, k);
	frame_pack_str(&f->pk, v);
}

static void
kv_uint(struct frame *f, const char *k, uint64_t v)
{
	frame_pack_str(&f->pk, k);
	msgpack_pack_uint64(&f->pk, v);
}

/* ---- framing ---- */

static void
test_frame_check(void **state)
{
	unsigned char b[16] = { 0, 0, 0, 5, 0x80 };
	size_t n = 0;

	assert_int_equal(frame_check(b, 0, 100, &n), FRAME_MORE);
	assert_int_equal(frame_check(b, 3, 100, &n), FRAME_MORE);
	assert_int_equal(frame_check(b, 5, 100, &n), FRAME_MORE);
	assert_int_equal(n, 5);
	assert_int_equal(frame_check(b, 9, 100, &n), FRAME_OK);
	assert_int_equal(frame_check(b, 16, 100, &n), FRAME_OK);
	assert_int_equal(n, 5);
	assert_int_equal(frame_check(b, 9, 4, &n), FRAME_BAD);      /* over the limit */
	memset(b, 0, 4);
	assert_int_equal(frame_check(b, 9, 100, &n), FRAME_BAD);    /* empty frame */
	b[0] = 0xff;                                                /* 4 GiB announced */
	assert_int_equal(frame_check(b, 4, FRAME_MAX_REPLY, &n), FRAME_BAD);
}

/* A request frame carries id, op and every kind of field; the length prefix is right. */
static void
test_frame_encode(void **state)
{
	static const uint32_t ids[] = { 7, 8, 4000000000u };
	rs_params *p = rs_params_new(), *d = rs_params_new();
	char err[ERRMSG_LEN];
	msgpack_sbuffer sb;
	msgpack_packer pk;
	const rs_value *m, *s;
	rs_value *v;
	size_t n;

	assert_int_equal(rs_params_set_str(p, "prompt", "héllo"), RS_OK);
	assert_int_equal(rs_params_set_uint(p, "max_tokens", 12), RS_OK);
	assert_int_equal(rs_params_set_float(p, "temperature", 0.25), RS_OK);
	assert_int_equal(rs_params_set_bool(p, "stream", 0), RS_OK);
	assert_int_equal(rs_params_add_message(p, "system", "be brief"), RS_OK);
	assert_int_equal(rs_params_add_message(p, "user", "hi"), RS_OK);
	assert_int_equal(rs_params_add_stop(p, "\n\n"), RS_OK);
	assert_int_equal(rs_params_add_stop(p, "END"), RS_OK);
	assert_int_equal(params_set_uints(p, "tokens", ids, 3), RS_OK);
	assert_int_equal(rs_params_set_uint(d, "top_k", 5), RS_OK);
	assert_int_equal(params_set_params(p, "defaults", d), RS_OK);
	rs_params_free(d);      /* copied */
	assert_int_equal(params_count(p), 8);

	frame_begin(&sb, &pk, 42, "generate", params_count(p));
	params_pack(p, &pk);
	frame_end(&sb);
	assert_int_equal(frame_check((unsigned char *)sb.data, sb.size, 1000, &n), FRAME_OK);
	assert_int_equal(n + 4, sb.size);
	assert_int_equal(frame_decode(sb.data + 4, n, &v, err), RS_OK);

	assert_int_equal(rs_value_type(v), RS_TYPE_MAP);
	assert_int_equal(rs_len(v), 10);
	assert_string_equal(rs_key(v, 0), "id");
	assert_int_equal(rs_uint(rs_get(v, "id")), 42);
	assert_string_equal(rs_str(rs_get(v, "op")), "generate");
	assert_string_equal(rs_str(rs_get(v, "prompt")), "héllo");
	assert_int_equal(rs_len(rs_get(v, "prompt")), 6);
	assert_int_equal(rs_uint(rs_get(v, "max_tokens")), 12);
	assert_true(rs_float(rs_get(v, "temperature")) == 0.25);
	assert_int_equal(rs_value_type(rs_get(v, "stream")), RS_TYPE_BOOL);
	assert_false(rs_bool(rs_get(v, "stream")));
	m = rs_get(v, "messages");
	assert_int_equal(rs_len(m), 2);
	assert_string_equal(rs_str(rs_get(rs_at(m, 1), "role")), "user");
	assert_string_equal(rs_str(rs_get(rs_at(m, 1), "content")), "hi");
	s = rs_get(v, "stop");
	assert_int_equal(rs_len(s), 2);
	assert_string_equal(rs_str(rs_at(s, 0)), "\n\n");
	assert_int_equal(rs_uint(rs_at(rs_get(v, "tokens"), 2)), 4000000000u);
	assert_int_equal(rs_uint(rs_get(rs_get(v, "defaults"), "top_k")), 5);
	rs_value_free(v);
	msgpack_sbuffer_destroy(&sb);
	rs_params_free(p);
}

/* Frames that are not exactly one map are protocol errors. */
static void
test_frame_decode_errors(void **state)
{
	static const char array[] = { (char)0x91, 0x01 };           /* [1] */
	static const char trailing[] = { (char)0x80, 0x01 };        /* {} then 1 */
	static const char truncated[] = { (char)0x81, (char)0xa1 }; /* {"... */
	static const char never[] = { (char)0xc1 };
	static const char empty_map[] = { (char)0x80 };
	char err[ERRMSG_LEN];
	rs_value *v;

	assert_int_equal(frame_decode(array, sizeof array, &v, err), RS_ERR_PROTOCOL);
	assert_null(v);
	assert_int_equal(frame_decode(trailing, sizeof trailing, &v, err), RS_ERR_PROTOCOL);
	assert_non_null(strstr(err, "after"));
	assert_int_equal(frame_decode(truncated, sizeof truncated, &v, err), RS_ERR_PROTOCOL);
	assert_int_equal(frame_decode(never, sizeof never, &v, err), RS_ERR_PROTOCOL);
	assert_int_equal(frame_decode(empty_map, sizeof empty_map, &v, err), RS_OK);
	assert_int_equal(rs_len(v), 0);
	rs_value_free(v);
}

/* ---- values ---- */

static void
test_values(void **state)
{
	struct frame f;
	char err[ERRMSG_LEN];
	rs_value *v;
	const rs_value *a;

	open_frame(&f, 7);
	kv_uint(&f, "u", UINT64_MAX);
	frame_pack_str(&f.pk, "i");
	msgpack_pack_int64(&f.pk, -5);
	frame_pack_str(&f.pk, "f");
	msgpack_pack_float(&f.pk, 1.5f);
	frame_pack_str(&f.pk, "bin");
	msgpack_pack_bin(&f.pk, 3);
	msgpack_pack_bin_body(&f.pk, "a\0b", 3);
	frame_pack_str(&f.pk, "nil");
	msgpack_pack_nil(&f.pk);
	msgpack_pack_uint8(&f.pk, 9);       /* a non-string key: dropped */
	msgpack_pack_true(&f.pk);
	frame_pack_str(&f.pk, "a");
	msgpack_pack_array(&f.pk, 2);
	msgpack_pack_true(&f.pk);
	frame_pack_str(&f.pk, "x");
	assert_int_equal(frame_decode(f.sb.data + 4, f.sb.size - 4, &v, err), RS_OK);
	msgpack_sbuffer_destroy(&f.sb);

	assert_int_equal(rs_len(v), 6);
	assert_int_equal(rs_uint(rs_get(v, "u")), UINT64_MAX);
	assert_int_equal(rs_int(rs_get(v, "u")), INT64_MAX);
	assert_int_equal(rs_value_type(rs_get(v, "i")), RS_TYPE_INT);
	assert_int_equal(rs_int(rs_get(v, "i")), -5);
	assert_int_equal(rs_uint(rs_get(v, "i")), 0);
	assert_true(rs_float(rs_get(v, "i")) == -5.0);
	assert_true(rs_float(rs_get(v, "f")) == 1.5);
	assert_int_equal(rs_value_type(rs_get(v, "bin")), RS_TYPE_STR);
	assert_int_equal(rs_len(rs_get(v, "bin")), 3);
	assert_memory_equal(rs_str(rs_get(v, "bin")), "a\0b", 4);
	assert_int_equal(rs_value_type(rs_get(v, "nil")), RS_TYPE_NIL);
	a = rs_get(v, "a");
	assert_int_equal(rs_value_type(a), RS_TYPE_ARRAY);
	assert_true(rs_bool(rs_at(a, 0)));
	assert_string_equal(rs_str(rs_at(a, 1)), "x");
	/* out of range, missing, mistyped, NULL: all chain to "nothing" */
	assert_null(rs_at(a, 2));
	assert_null(rs_get(a, "x"));
	assert_null(rs_get(v, "missing"));
	assert_int_equal(rs_value_type(rs_get(v, "missing")), RS_TYPE_NONE);
	assert_null(rs_str(rs_get(rs_get(v, "missing"), "deeper")));
	assert_null(rs_str(rs_get(v, "u")));
	assert_int_equal(rs_uint(NULL), 0);
	assert_int_equal(rs_len(rs_get(v, "u")), 0);
	assert_null(rs_key(a, 0));
	assert_string_equal(rs_key(v, 5), "a");
	/* a map value by index, removing a key */
	assert_int_equal(rs_uint(rs_at(v, 0)), UINT64_MAX);
	value_map_remove(v, "u");
	value_map_remove(v, "nothing");
	assert_int_equal(rs_len(v), 5);
	assert_string_equal(rs_key(v, 0), "i");
	assert_null(rs_get(v, "u"));
	/* freeing a borrowed value does nothing (ASan would see a double free) */
	rs_value_free((rs_value *)a);
	rs_value_free(v);
	rs_value_free(NULL);
}

/* ---- params ---- */

static void
test_params(void **state)
{
	rs_params *p = rs_params_new();

	assert_int_equal(rs_params_set_uint(p, "seed", 1), RS_OK);
	assert_int_equal(rs_params_set_float(p, "seed", 2.5), RS_OK);  /* replaces */
	assert_int_equal(params_count(p), 1);
	assert_true(params_has(p, "seed"));
	assert_false(params_has(p, "prompt"));
	assert_int_equal(rs_params_set_str(p, "id", "x"), RS_ERR_INVAL);
	assert_int_equal(rs_params_set_uint(p, "op", 1), RS_ERR_INVAL);
	assert_int_equal(rs_params_set_str(p, "prompt", NULL), RS_ERR_INVAL);
	assert_int_equal(rs_params_set_str(p, NULL, "x"), RS_ERR_INVAL);
	assert_int_equal(rs_params_set_str(NULL, "prompt", "x"), RS_ERR_INVAL);
	assert_int_equal(rs_params_add_message(p, "user", NULL), RS_ERR_INVAL);
	assert_int_equal(rs_params_add_message(p, "user", "a"), RS_OK);
	assert_int_equal(rs_params_add_message(p, "assistant", "b"), RS_OK);
	assert_int_equal(rs_params_add_stop(p, "s"), RS_OK);
	assert_int_equal(params_count(p), 3);
	rs_params_free(p);
	rs_params_free(NULL);
}

/* Messages with fields of their own: a call in an assistant message's tool_calls, a tool result. */
static void
test_params_maps(void **state)
{
	rs_params *p = rs_params_new(), *msg = rs_params_new(), *call = rs_params_new();
	char err[ERRMSG_LEN];
	msgpack_sbuffer sb;
	msgpack_packer pk;
	const rs_value *m, *c;
	rs_value *v;
	size_t n;

	(void)state;
	assert_int_equal(rs_params_add_message(p, "user", "weather?"), RS_OK);
	assert_int_equal(rs_params_set_str(call, "id", "call_1"), RS_ERR_INVAL);  /* a request's id */
	assert_int_equal(rs_params_set_str(msg, "role", "assistant"), RS_OK);
	assert_int_equal(rs_params_add_call(msg, "call_1", "get_weather", "{}"), RS_OK);
	assert_int_equal(rs_params_add_call(msg, NULL, "now", NULL), RS_ERR_INVAL);
	assert_int_equal(rs_params_add_map(p, "messages", msg), RS_OK);
	rs_params_free(msg), rs_params_free(call);   /* copied */
	msg = rs_params_new();
	assert_int_equal(rs_params_set_str(msg, "role", "tool"), RS_OK);
	assert_int_equal(rs_params_set_str(msg, "content", "21 C"), RS_OK);
	assert_int_equal(rs_params_set_str(msg, "tool_call_id", "call_1"), RS_OK);
	assert_int_equal(rs_params_add_map(p, "messages", msg), RS_OK);
	assert_int_equal(rs_params_add_map(p, "id", msg), RS_ERR_INVAL);
	assert_int_equal(rs_params_add_map(p, "messages", NULL), RS_ERR_INVAL);
	rs_params_free(msg);
	assert_int_equal(params_count(p), 1);

	frame_begin(&sb, &pk, 7, "generate", params_count(p));
	params_pack(p, &pk);
	frame_end(&sb);
	assert_int_equal(frame_check((unsigned char *)sb.data, sb.size, 1000, &n), FRAME_OK);
	assert_int_equal(frame_decode(sb.data + 4, n, &v, err), RS_OK);
	m = rs_get(v, "messages");
	assert_int_equal(rs_len(m), 3);
	assert_string_equal(rs_str(rs_get(rs_at(m, 0), "content")), "weather?");
	c = rs_at(rs_get(rs_at(m, 1), "tool_calls"), 0);
	assert_string_equal(rs_str(rs_get(c, "id")), "call_1");
	assert_string_equal(rs_str(rs_get(c, "name")), "get_weather");
	assert_string_equal(rs_str(rs_get(c, "arguments")), "{}");
	assert_null(rs_get(rs_at(m, 1), "content"));
	assert_string_equal(rs_str(rs_get(rs_at(m, 2), "tool_call_id")), "call_1");
	rs_value_free(v);
	msgpack_sbuffer_destroy(&sb);
	rs_params_free(p);
}

/* ---- error codes ---- */

static void
test_error_codes(void **state)
{
	static const char *const codes[] = {
		"bad_frame", "frame_too_large", "bad_request", "unknown_op", "invalid_param",
		"invalid_utf8", "context_exceeded", "not_found", "duplicate_id", "overloaded",
		"model_error", "shutting_down", "internal", "quota_exceeded", "storage_full",
		"session_busy", "frame_timeout",
	};
	size_t i;
	int st;

	for (i = 0; i < sizeof codes / sizeof codes[0]; i++) {
		rs_status s = rs_status_from_code(codes[i]);

		assert_int_equal(s, (rs_status)(i + 1));
		assert_string_equal(rs_status_code(s), codes[i]);
	}
	assert_int_equal(rs_status_from_code("not_found"), RS_ERR_NOT_FOUND);
	assert_int_equal(rs_status_from_code("a_newer_code"), RS_ERR_OTHER);
	assert_int_equal(rs_status_from_code(NULL), RS_ERR_OTHER);
	assert_null(rs_status_code(RS_OK));
	assert_null(rs_status_code(RS_ERR_OTHER));
	assert_null(rs_status_code(RS_ERR_IO));
	for (st = RS_OK; st <= RS_ERR_NOMEM; st++)
		assert_non_null(rs_strerror((rs_status)st));
	assert_string_equal(rs_strerror(RS_ERR_NOT_FOUND), "no such session, model or request");
}

/* ---- a client and a fake daemon ---- */

struct fake {
	char dir[64], path[96];
	int listen_fd, fd;          /* our end of the client's connection */
	rs_client *c;
};

/* Listens on a socket in a temporary directory and connects a client to it with flags. */
static int
fake_open(void **state, int flags)
{
	struct fake *f = calloc(1, sizeof *f);
	struct sockaddr_un sa;
	rs_error err;

	snprintf(f->dir, sizeof f->dir, "/tmp/test_client.XXXXXX");
	assert_non_null(mkdtemp(f->dir));
	snprintf(f->path, sizeof f->path, "%s/socket", f->dir);
	memset(&sa, 0, sizeof sa);
	sa.sun_family = AF_UNIX;
	snprintf(sa.sun_path, sizeof sa.sun_path, "%s", f->path);
	f->listen_fd = socket(AF_UNIX, SOCK_STREAM, 0);
	assert_int_equal(bind(f->listen_fd, (struct sockaddr *)&sa, sizeof sa), 0);
	assert_int_equal(listen(f->listen_fd, 4), 0);
	f->c = rs_connect(f->path, flags, &err);
	assert_non_null(f->c);
	assert_int_equal(err.code, RS_OK);
	f->fd = accept(f->listen_fd, NULL, NULL);
	assert_true(f->fd >= 0);
	*state = f;
	return 0;
}

static int
fake_setup(void **state)
{
	return fake_open(state, 0);
}

/* A client that never waits for the daemon (RS_NONBLOCK). */
static int
fake_setup_nonblock(void **state)
{
	return fake_open(state, RS_NONBLOCK);
}

static int
fake_teardown(void **state)
{
	struct fake *f = *state;

	rs_close(f->c);
	if (f->fd >= 0)
		close(f->fd);
	close(f->listen_fd);
	unlink(f->path);
	rmdir(f->dir);
	free(f);
	return 0;
}

/* Writes a finished frame to the client. */
static void
fake_send(struct fake *f, struct frame *fr)
{
	size_t n = fr->sb.size - 4;

	fr->sb.data[0] = (char)(n >> 24), fr->sb.data[1] = (char)(n >> 16);
	fr->sb.data[2] = (char)(n >> 8), fr->sb.data[3] = (char)n;
	assert_int_equal(write(f->fd, fr->sb.data, fr->sb.size), (ssize_t)fr->sb.size);
	msgpack_sbuffer_destroy(&fr->sb);
}

/* Sends {id, type: "token", text, token}, reasoning and tool where not NULL, choice where >= 0. */
static void
send_piece(struct fake *f, uint64_t id, const char *text, const char *reasoning, const char *tool, int choice)
{
	struct frame fr;

	open_frame(&fr, 4 + (reasoning != NULL) + (tool != NULL) + (choice >= 0));
	kv_uint(&fr, "id", id);
	kv_str(&fr, "type", "token");
	kv_str(&fr, "text", text);
	if (reasoning != NULL)
		kv_str(&fr, "reasoning", reasoning);
	if (tool != NULL)
		kv_str(&fr, "tool", tool);
	if (choice >= 0)
		kv_uint(&fr, "choice", (uint64_t)choice);
	kv_uint(&fr, "token", 1);
	fake_send(f, &fr);
}

static void
send_token(struct fake *f, uint64_t id, const char *text)
{
	send_piece(f, id, text, NULL, NULL, -1);
}

/* Sends {id, type: "done", finish, usage: {generated_tokens}}. */
static void
send_done(struct fake *f, uint64_t id, const char *finish)
{
	struct frame fr;

	open_frame(&fr, 4);
	kv_uint(&fr, "id", id);
	kv_str(&fr, "type", "done");
	kv_str(&fr, "finish", finish);
	frame_pack_str(&fr.pk, "usage");
	msgpack_pack_map(&fr.pk, 1);
	kv_uint(&fr, "generated_tokens", 2);
	fake_send(f, &fr);
}

static void
send_error(struct fake *f, uint64_t id, const char *code, const char *msg)
{
	struct frame fr;

	open_frame(&fr, 4);
	frame_pack_str(&fr.pk, "id");
	if (id == 0)
		msgpack_pack_nil(&fr.pk);
	else
		msgpack_pack_uint64(&fr.pk, id);
	kv_str(&fr, "type", "error");
	kv_str(&fr, "code", code);
	kv_str(&fr, "message", msg);
	fake_send(f, &fr);
}

/* Sends {id, type: "result"} plus one string field. */
static void
send_result(struct fake *f, uint64_t id, const char *k, const char *v)
{
	struct frame fr;

	open_frame(&fr, k ? 3 : 2);
	kv_uint(&fr, "id", id);
	kv_str(&fr, "type", "result");
	if (k != NULL)
		kv_str(&fr, k, v);
	fake_send(f, &fr);
}

/* Reads the next request frame the client wrote. */
static rs_value *
recv_request(struct fake *f)
{
	unsigned char hdr[4];
	char *body, err[ERRMSG_LEN];
	size_t n;
	rs_value *v;

	assert_int_equal(read(f->fd, hdr, 4), 4);
	n = (size_t)hdr[0] << 24 | (size_t)hdr[1] << 16 | (size_t)hdr[2] << 8 | hdr[3];
	body = malloc(n);
	assert_int_equal(read(f->fd, body, n), (ssize_t)n);
	assert_int_equal(frame_decode(body, n, &v, err), RS_OK);
	free(body);
	return v;
}

/* What the callbacks saw. */
struct seen {
	char text[256], reasoning[256], tool[64];
	int tokens, dones, errors, stop_after;
	char finish[32];
	rs_status error;
	char message[128];
	uint64_t last_id;
};

static int
on_token(uint64_t id, const char *text, const rs_value *reply, void *user)
{
	struct seen *s = user;

	strncat(s->text, text, sizeof s->text - strlen(s->text) - 1);
	strncat(s->reasoning, rs_reply_reasoning(reply), sizeof s->reasoning - strlen(s->reasoning) - 1);
	strncat(s->tool, rs_reply_tool(reply), sizeof s->tool - strlen(s->tool) - 1);
	s->last_id = id;
	assert_int_equal(rs_uint(rs_get(reply, "token")), 1);
	return ++s->tokens == s->stop_after;
}

static void
on_done(uint64_t id, const rs_value *done, void *user)
{
	struct seen *s = user;

	s->dones++;
	s->last_id = id;
	snprintf(s->finish, sizeof s->finish, "%s", rs_str(rs_get(done, "finish")));
	assert_null(rs_get(done, "id"));        /* id and type are the library's business */
	assert_null(rs_get(done, "type"));
	assert_int_equal(rs_uint(rs_get(rs_get(done, "usage"), "generated_tokens")), 2);
}

static void
on_error(uint64_t id, rs_status code, const char *message, void *user)
{
	struct seen *s = user;

	s->errors++;
	s->last_id = id;
	s->error = code;
	snprintf(s->message, sizeof s->message, "%s", message);
}

/* Two generations in flight: replies interleave, each reaches its own callbacks. */
static void
test_async_interleaved(void **state)
{
	struct fake *f = *state;
	struct seen a = { 0 }, b = { 0 };
	rs_params *p = rs_params_new();
	uint64_t ia, ib;
	rs_value *req;

	rs_params_add_message(p, "user", "hi");
	ia = rs_generate_start(f->c, p, on_token, on_done, on_error, &a);
	ib = rs_generate_start(f->c, p, on_token, on_done, on_error, &b);
	rs_params_free(p);
	assert_true(ia > 0 && ib > 0 && ia != ib);
	assert_int_equal(rs_pending(f->c), 2);
	req = recv_request(f);
	assert_int_equal(rs_uint(rs_get(req, "id")), ia);
	assert_string_equal(rs_str(rs_get(req, "op")), "generate");
	assert_true(rs_bool(rs_get(req, "stream")));     /* a token callback: streamed */
	assert_string_equal(rs_str(rs_get(rs_at(rs_get(req, "messages"), 0), "content")), "hi");
	rs_value_free(req);
	rs_value_free(recv_request(f));

	send_token(f, ia, "Hel");
	send_token(f, ib, "Wor");
	send_token(f, ia, "lo");
	send_error(f, ib, "context_exceeded", "too long");
	send_token(f, 999, "stray");        /* an id nobody waits for is ignored */
	send_done(f, ia, "stop");
	assert_int_equal(rs_process(f->c), RS_OK);
	assert_string_equal(a.text, "Hello");
	assert_int_equal(a.dones, 1);
	assert_string_equal(a.finish, "stop");
	assert_int_equal(a.errors, 0);
	assert_string_equal(b.text, "Wor");
	assert_int_equal(b.dones, 0);
	assert_int_equal(b.errors, 1);
	assert_int_equal(b.error, RS_ERR_CONTEXT_EXCEEDED);
	assert_string_equal(b.message, "too long");
	assert_int_equal(rs_pending(f->c), 0);
	/* nothing more to read: processing again is harmless */
	assert_int_equal(rs_process(f->c), RS_OK);
}

/* What rs_call_start's callbacks saw. */
struct call_seen {
	int results, errors;
	char title[32];
	rs_status error;
};

static void
on_call_result(uint64_t id, const rs_value *result, void *user)
{
	struct call_seen *s = user;

	s->results++;
	assert_null(rs_get(result, "id"));
	assert_null(rs_get(result, "type"));
	snprintf(s->title, sizeof s->title, "%s", rs_str(rs_get(result, "title")));
}

static void
on_call_error(uint64_t id, rs_status code, const char *message, void *user)
{
	struct call_seen *s = user;

	s->errors++;
	s->error = code;
}

/* Any op started without waiting: its result or error reaches its callbacks, progress does not. */
static void
test_call_start(void **state)
{
	struct fake *f = *state;
	struct call_seen a = { 0 }, b = { 0 };
	struct frame fr;
	rs_params *p = rs_params_new();
	uint64_t ia, ib;
	rs_value *req;

	rs_params_set_str(p, "model", "m");
	ia = rs_call_start(f->c, "model.load", p, on_call_result, on_call_error, &a);
	ib = rs_call_start(f->c, "session.list", NULL, on_call_result, on_call_error, &b);
	rs_params_free(p);
	assert_true(ia > 0 && ib > 0 && ia != ib);
	assert_int_equal(rs_pending(f->c), 2);
	req = recv_request(f);
	assert_string_equal(rs_str(rs_get(req, "op")), "model.load");
	assert_string_equal(rs_str(rs_get(req, "model")), "m");
	assert_null(rs_get(req, "stream"));
	rs_value_free(req);
	req = recv_request(f);
	assert_string_equal(rs_str(rs_get(req, "op")), "session.list");
	assert_int_equal(rs_len(req), 2);                  /* id and op only */
	rs_value_free(req);

	open_frame(&fr, 4);
	kv_uint(&fr, "id", ia);
	kv_str(&fr, "type", "progress");
	kv_uint(&fr, "done", 1);
	kv_uint(&fr, "total", 2);
	fake_send(f, &fr);
	send_error(f, ib, "internal", "broken");
	send_result(f, ia, "title", "loaded");
	assert_int_equal(rs_process(f->c), RS_OK);
	assert_int_equal(a.results, 1);
	assert_int_equal(a.errors, 0);
	assert_string_equal(a.title, "loaded");
	assert_int_equal(b.results, 0);
	assert_int_equal(b.errors, 1);
	assert_int_equal(b.error, RS_ERR_INTERNAL);
	assert_int_equal(rs_pending(f->c), 0);
	assert_int_equal(rs_call_start(f->c, NULL, NULL, NULL, NULL, NULL), 0);
	assert_int_equal(rs_call_start(NULL, "status", NULL, NULL, NULL, NULL), 0);
}

/* A reply that arrives a byte at a time is assembled before dispatch. */
static void
test_split_frames(void **state)
{
	struct fake *f = *state;
	struct seen a = { 0 };
	rs_params *p = rs_params_new();
	struct frame fr;
	uint64_t id;
	size_t i;

	rs_params_set_str(p, "prompt", "x");
	id = rs_generate_start(f->c, p, on_token, on_done, on_error, &a);
	rs_params_free(p);
	rs_value_free(recv_request(f));
	open_frame(&fr, 4);
	kv_uint(&fr, "id", id);
	kv_str(&fr, "type", "token");
	kv_str(&fr, "text", "ab\xc3\xa9");
	kv_uint(&fr, "token", 1);
	fr.sb.data[3] = (char)(fr.sb.size - 4);
	for (i = 0; i < fr.sb.size; i++) {
		assert_int_equal(write(f->fd, fr.sb.data + i, 1), 1);
		assert_int_equal(rs_process(f->c), RS_OK);
		assert_int_equal(a.tokens, i + 1 == fr.sb.size);
	}
	msgpack_sbuffer_destroy(&fr.sb);
	assert_string_equal(a.text, "ab\xc3\xa9");
}

/* A blocking call dispatches the other requests' replies while it waits. */
static void
test_blocking_dispatches_others(void **state)
{
	struct fake *f = *state;
	struct seen a = { 0 };
	rs_params *p = rs_params_new();
	uint64_t id;
	rs_value *out, *req;

	rs_params_set_str(p, "prompt", "x");
	id = rs_generate_start(f->c, p, on_token, on_done, on_error, &a);
	rs_params_free(p);
	/* the replies to both are in the socket before the blocking call is made */
	send_token(f, id, "t");
	send_result(f, id + 1, "session", "ignored-by-the-test");
	send_done(f, id, "length");
	assert_int_equal(rs_session_get(f->c, "11111111-2222-3333-4444-555555555555", &out), RS_OK);
	assert_string_equal(rs_str(rs_get(out, "session")), "ignored-by-the-test");
	rs_value_free(out);
	assert_int_equal(a.tokens, 1);      /* dispatched during the wait */
	rs_value_free(recv_request(f));
	req = recv_request(f);
	assert_string_equal(rs_str(rs_get(req, "op")), "session.get");
	assert_string_equal(rs_str(rs_get(req, "session")), "11111111-2222-3333-4444-555555555555");
	rs_value_free(req);
	/* the done came in the same read as the result: delivered too */
	assert_int_equal(a.dones, 1);
	assert_string_equal(a.finish, "length");
	assert_int_equal(rs_process(f->c), RS_OK);
	assert_int_equal(a.dones, 1);
}

/* A daemon error is the call's status, its message the client's last error. */
static void
test_blocking_error(void **state)
{
	struct fake *f = *state;
	rs_value *out = (rs_value *)1;

	send_error(f, 1, "not_found", "no such session");
	assert_int_equal(rs_session_delete(f->c, "x"), RS_ERR_NOT_FOUND);
	assert_string_equal(rs_last_error(f->c), "no such session");
	send_error(f, 2, "a_code_from_the_future", "new");
	assert_int_equal(rs_model_list(f->c, &out), RS_ERR_OTHER);
	assert_null(out);
	assert_int_equal(rs_session_get(f->c, NULL, &out), RS_ERR_INVAL);
}

/* A token callback that returns nonzero makes the library send a cancel. */
static void
test_token_cb_cancels(void **state)
{
	struct fake *f = *state;
	struct seen a = { .stop_after = 1 };
	rs_params *p = rs_params_new();
	rs_value *req, *done = NULL;

	rs_params_set_str(p, "prompt", "x");
	send_token(f, 1, "a");
	send_token(f, 1, "b");          /* after the cancel: not passed on */
	send_result(f, 2, NULL, NULL);  /* the cancel's acknowledgement, ignored */
	send_done(f, 1, "cancel");
	assert_int_equal(rs_generate(f->c, p, on_token, &a, &done), RS_OK);
	rs_params_free(p);
	assert_string_equal(a.text, "a");
	assert_string_equal(rs_str(rs_get(done, "finish")), "cancel");
	rs_value_free(done);
	rs_value_free(recv_request(f));
	req = recv_request(f);
	assert_string_equal(rs_str(rs_get(req, "op")), "cancel");
	assert_int_equal(rs_uint(rs_get(req, "target")), 1);
	assert_int_equal(rs_uint(rs_get(req, "id")), 2);
	rs_value_free(req);
}

/* A token callback that makes a blocking call (cancel) of its own: the
 * request may end inside it, which must not upset the dispatch around it. */
static struct fake *nested_fake;

static int
on_token_cancel(uint64_t id, const char *text, const rs_value *reply, void *user)
{
	struct seen *s = user;

	s->tokens++;
	assert_int_equal(rs_cancel(nested_fake->c, id), RS_OK);
	assert_int_equal(s->dones, 1);      /* the done came during the nested wait */
	return 0;
}

static void
test_nested_blocking_call(void **state)
{
	struct fake *f = nested_fake = *state;
	struct seen a = { 0 };
	rs_params *p = rs_params_new();
	uint64_t id;
	rs_value *req;

	rs_params_set_str(p, "prompt", "x");
	id = rs_generate_start(f->c, p, on_token_cancel, on_done, on_error, &a);
	rs_params_free(p);
	send_token(f, id, "a");
	send_done(f, id, "cancel");
	send_result(f, id + 1, NULL, NULL);
	send_token(f, id, "late");          /* after the done: dropped */
	assert_int_equal(rs_process(f->c), RS_OK);
	assert_int_equal(a.tokens, 1);
	assert_int_equal(a.dones, 1);
	assert_string_equal(a.finish, "cancel");
	assert_int_equal(rs_pending(f->c), 0);
	rs_value_free(recv_request(f));
	req = recv_request(f);
	assert_string_equal(rs_str(rs_get(req, "op")), "cancel");
	rs_value_free(req);
}

/* Without a token callback the text comes whole in done (stream false). */
static void
test_generate_collects(void **state)
{
	struct fake *f = *state;
	rs_params *p = rs_params_new();
	rs_value *req;

	rs_params_set_str(p, "prompt", "x");
	send_done(f, 1, "stop");
	assert_int_equal(rs_generate(f->c, p, NULL, NULL, NULL), RS_OK);
	req = recv_request(f);
	assert_int_equal(rs_value_type(rs_get(req, "stream")), RS_TYPE_BOOL);
	assert_false(rs_bool(rs_get(req, "stream")));
	rs_value_free(req);
	/* the caller's own stream setting wins, and is sent once */
	rs_params_set_bool(p, "stream", 1);
	send_done(f, 2, "stop");
	assert_int_equal(rs_generate(f->c, p, NULL, NULL, NULL), RS_OK);
	req = recv_request(f);
	assert_true(rs_bool(rs_get(req, "stream")));
	assert_int_equal(rs_len(req), 4);
	rs_value_free(req);
	rs_params_free(p);
}

/* A token reply's reasoning and tool text reach the callback apart from its text. */
static void
test_reasoning(void **state)
{
	struct fake *f = *state;
	struct seen s = { 0 };
	rs_params *p = rs_params_new();

	rs_params_add_message(p, "user", "hi");
	send_piece(f, 1, "", "Let me ", NULL, -1);
	send_piece(f, 1, "", "think.", "{}", -1);
	send_piece(f, 1, "Hi", NULL, NULL, -1);
	send_done(f, 1, "stop");
	assert_int_equal(rs_generate(f->c, p, on_token, &s, NULL), RS_OK);
	rs_value_free(recv_request(f));
	assert_string_equal(s.text, "Hi");
	assert_string_equal(s.reasoning, "Let me think.");
	assert_string_equal(s.tool, "{}");
	assert_int_equal(s.tokens, 3);
	assert_string_equal(rs_reply_reasoning(NULL), "");
	assert_string_equal(rs_reply_tool(NULL), "");
	rs_params_free(p);
}

/* Each choice's text, by the choice its token replies name. */
static int
on_choice_token(uint64_t id, const char *text, const rs_value *reply, void *user)
{
	char (*texts)[16] = user;
	unsigned i = rs_reply_choice(reply);

	assert_true(i < 3);
	strncat(texts[i], text, sizeof texts[i] - strlen(texts[i]) - 1);
	return 0;
}

/* Several choices: n reaches the daemon, rs_reply_choice says which choice a token reply is of. */
static void
test_choices(void **state)
{
	struct fake *f = *state;
	char texts[3][16] = { "" };
	rs_params *p = rs_params_new();
	rs_value *req;

	rs_params_set_str(p, "prompt", "hi");
	rs_params_set_uint(p, "n", 3);
	send_piece(f, 1, "a", NULL, NULL, 0);
	send_piece(f, 1, "b", NULL, NULL, 1);
	send_piece(f, 1, "c", NULL, NULL, 2);
	send_piece(f, 1, "d", NULL, NULL, 1);
	send_done(f, 1, "stop");
	assert_int_equal(rs_generate(f->c, p, on_choice_token, texts, NULL), RS_OK);
	req = recv_request(f);
	assert_int_equal(rs_uint(rs_get(req, "n")), 3);
	rs_value_free(req);
	assert_string_equal(texts[0], "a");
	assert_string_equal(texts[1], "bd");
	assert_string_equal(texts[2], "c");
	assert_int_equal(rs_reply_choice(NULL), 0);
	rs_params_free(p);
}

/* model.load's progress replies reach the progress callback. */
static void
on_progress(uint64_t done, uint64_t total, void *user)
{
	uint64_t *last = user;

	assert_int_equal(total, 1000);
	assert_true(done >= *last);
	*last = done;
}

static void
test_progress(void **state)
{
	struct fake *f = *state;
	struct frame fr;
	uint64_t last = 0;
	int i;

	for (i = 1; i <= 2; i++) {
		open_frame(&fr, 4);
		kv_uint(&fr, "id", 1);
		kv_str(&fr, "type", "progress");
		kv_uint(&fr, "done", 500u * (unsigned)i);
		kv_uint(&fr, "total", 1000);
		fake_send(f, &fr);
	}
	send_result(f, 1, "model", "m");
	assert_int_equal(rs_model_load(f->c, "m", on_progress, &last, NULL), RS_OK);
	assert_int_equal(last, 1000);
}

/* tokenize and detokenize turn their results into plain arrays and strings. */
static void
test_tokens(void **state)
{
	static const uint32_t ids[] = { 5, 300, 70000 };
	struct fake *f = *state;
	struct frame fr;
	uint32_t *tokens;
	size_t n, i;
	char *text;
	rs_value *req;

	open_frame(&fr, 3);
	kv_uint(&fr, "id", 1);
	kv_str(&fr, "type", "result");
	frame_pack_str(&fr.pk, "tokens");
	msgpack_pack_array(&fr.pk, 3);
	for (i = 0; i < 3; i++)
		msgpack_pack_uint32(&fr.pk, ids[i]);
	fake_send(f, &fr);
	assert_int_equal(rs_tokenize(f->c, NULL, "hé", RS_TOK_SPECIAL | RS_TOK_NO_BOS, &tokens, &n), RS_OK);
	assert_int_equal(n, 3);
	assert_memory_equal(tokens, ids, sizeof ids);
	free(tokens);
	send_result(f, 2, "text", "h\xc3\xa9");
	assert_int_equal(rs_detokenize(f->c, "m", ids, 3, 0, &text), RS_OK);
	assert_string_equal(text, "h\xc3\xa9");
	free(text);
	req = recv_request(f);
	assert_string_equal(rs_str(rs_get(req, "op")), "tokenize");
	assert_null(rs_get(req, "model"));          /* NULL: the daemon's default */
	assert_true(rs_bool(rs_get(req, "special")));
	assert_int_equal(rs_value_type(rs_get(req, "bos")), RS_TYPE_BOOL);
	assert_false(rs_bool(rs_get(req, "bos")));
	rs_value_free(req);
	req = recv_request(f);
	assert_string_equal(rs_str(rs_get(req, "model")), "m");
	assert_int_equal(rs_uint(rs_at(rs_get(req, "tokens"), 2)), 70000);
	assert_null(rs_get(req, "special"));
	rs_value_free(req);
}

/*
 * embed sends its texts as `input` and dimensions, and turns the vectors
 * into one array of floats; a result whose vectors do not match the texts
 * is a protocol error, and no texts a local one.
 */
static void
test_embed(void **state)
{
	static const char *const texts[] = { "a", "bé" };
	struct fake *f = *state;
	struct frame fr;
	float *v;
	size_t d;
	rs_value *req, *out;

	for (int round = 0; round < 2; round++) {
		/* a reply is read by the call that waits for it: sent before each */
		open_frame(&fr, 4);
		kv_uint(&fr, "id", (uint64_t)round + 1);
		kv_str(&fr, "type", "result");
		kv_uint(&fr, "dimensions", 3);
		frame_pack_str(&fr.pk, "embeddings");
		msgpack_pack_array(&fr.pk, round == 0 ? 2 : 1);
		for (int i = 0; i < (round == 0 ? 2 : 1); i++) {
			msgpack_pack_array(&fr.pk, 3);
			for (int j = 0; j < 3; j++)
				msgpack_pack_float(&fr.pk, (float)(i * 10 + j) + 0.5f);
		}
		fake_send(f, &fr);
		if (round == 1) {
			assert_int_equal(rs_embed(f->c, NULL, texts, 2, 0, &v, &d, NULL), RS_ERR_PROTOCOL);
			assert_null(v);
			break;
		}
		assert_int_equal(rs_embed(f->c, "m", texts, 2, 3, &v, &d, &out), RS_OK);
		assert_int_equal(d, 3);
		assert_true(v[0] == 0.5f && v[2] == 2.5f && v[3] == 10.5f && v[5] == 12.5f);
		assert_int_equal(rs_uint(rs_get(out, "dimensions")), 3);
		free(v);
		rs_value_free(out);
	}
	assert_int_equal(rs_embed(f->c, NULL, texts, 0, 0, &v, &d, NULL), RS_ERR_INVAL);
	req = recv_request(f);
	assert_string_equal(rs_str(rs_get(req, "op")), "embed");
	assert_string_equal(rs_str(rs_get(req, "model")), "m");
	assert_int_equal(rs_len(rs_get(req, "input")), 2);
	assert_string_equal(rs_str(rs_at(rs_get(req, "input"), 1)), "bé");
	assert_int_equal(rs_uint(rs_get(req, "dimensions")), 3);
	rs_value_free(req);
	req = recv_request(f);
	assert_null(rs_get(req, "dimensions"));
	rs_value_free(req);
}

/* After hello the daemon's frame limit is known: a larger request is refused here. */
static void
test_max_frame(void **state)
{
	struct fake *f = *state;
	struct frame fr;
	rs_params *p = rs_params_new();
	char big[200];
	rs_value *out;

	open_frame(&fr, 4);
	kv_uint(&fr, "id", 1);
	kv_str(&fr, "type", "result");
	kv_uint(&fr, "version", 1);
	kv_uint(&fr, "max_frame", 100);
	fake_send(f, &fr);
	assert_int_equal(rs_hello(f->c, "test", &out), RS_OK);
	assert_int_equal(rs_uint(rs_get(out, "max_frame")), 100);
	rs_value_free(out);
	memset(big, 'x', sizeof big - 1);
	big[sizeof big - 1] = '\0';
	rs_params_set_str(p, "prompt", big);
	assert_int_equal(rs_generate_start(f->c, p, NULL, NULL, NULL, NULL), 0);
	assert_non_null(strstr(rs_last_error(f->c), "at most 100"));
	/* the generic call: any op, any fields */
	send_result(f, 3, "pong", "yes");
	rs_params_set_str(p, "prompt", "small");
	assert_int_equal(rs_call(f->c, "ping", p, &out), RS_OK);
	assert_string_equal(rs_str(rs_get(out, "pong")), "yes");
	rs_value_free(out);
	rs_params_free(p);
	rs_value_free(recv_request(f));     /* hello */
	out = recv_request(f);
	assert_string_equal(rs_str(rs_get(out, "op")), "ping");
	assert_int_equal(rs_uint(rs_get(out, "id")), 3);
	rs_value_free(out);
}

/* The daemon goes away: requests in flight fail with RS_ERR_IO, later calls too. */
static void
test_connection_lost(void **state)
{
	struct fake *f = *state;
	struct seen a = { 0 };
	rs_params *p = rs_params_new();
	uint64_t id;

	rs_params_set_str(p, "prompt", "x");
	id = rs_generate_start(f->c, p, on_token, on_done, on_error, &a);
	assert_true(id > 0);
	rs_value_free(recv_request(f));
	send_token(f, id, "partial");
	close(f->fd);
	f->fd = -1;
	assert_int_equal(rs_process(f->c), RS_ERR_IO);
	assert_string_equal(a.text, "partial");     /* what came before the end is delivered */
	assert_int_equal(a.errors, 1);
	assert_int_equal(a.error, RS_ERR_IO);
	assert_int_equal(a.last_id, id);
	assert_int_equal(rs_pending(f->c), 0);
	assert_int_equal(rs_server_status(f->c, NULL), RS_ERR_IO);
	assert_string_equal(rs_last_error(f->c), "residentd closed the connection");
	assert_int_equal(rs_generate_start(f->c, p, NULL, NULL, NULL, NULL), 0);
	rs_params_free(p);
}

/* frame_too_large (no id) then the close: that is the reason given. */
static void
test_frame_too_large(void **state)
{
	struct fake *f = *state;

	send_error(f, 0, "frame_too_large", "a frame of 99 bytes");
	shutdown(f->fd, SHUT_WR);
	assert_int_equal(rs_server_status(f->c, NULL), RS_ERR_FRAME_TOO_LARGE);
	assert_string_equal(rs_last_error(f->c), "a frame of 99 bytes");
}

/* Read with the end of the connection in one go, frame_too_large is still the reason. */
static void
test_frame_too_large_async(void **state)
{
	struct fake *f = *state;
	struct seen s = { 0 };
	rs_params *p = rs_params_new();

	rs_params_set_str(p, "prompt", "x");
	assert_true(rs_generate_start(f->c, p, on_token, on_done, on_error, &s) > 0);
	rs_params_free(p);
	send_error(f, 0, "frame_too_large", "too big");
	shutdown(f->fd, SHUT_WR);
	assert_int_equal(rs_process(f->c), RS_ERR_FRAME_TOO_LARGE);
	assert_int_equal(s.errors, 1);
	assert_int_equal(s.error, RS_ERR_FRAME_TOO_LARGE);
	assert_string_equal(s.message, "too big");
}

/* The daemon refuses a frame by its length and closes while the rest is being written:
 * its frame_too_large, not the failed write, is the reason. */
static void
test_frame_too_large_while_writing(void **state)
{
	struct fake *f = *state;
	rs_params *p = rs_params_new();
	size_t n = 4u << 20;
	char *big = malloc(n + 1);

	memset(big, 'x', n);
	big[n] = '\0';
	rs_params_set_str(p, "prompt", big);
	send_error(f, 0, "frame_too_large", "a frame of 4194330 bytes");
	close(f->fd);
	f->fd = -1;
	assert_int_equal(rs_generate_start(f->c, p, NULL, NULL, NULL, NULL), 0);
	assert_int_equal(rs_process(f->c), RS_ERR_FRAME_TOO_LARGE);
	assert_string_equal(rs_last_error(f->c), "a frame of 4194330 bytes");
	rs_params_free(p);
	free(big);
}

/* ---- RS_NONBLOCK ---- */

/* A params with a prompt of n bytes of 'x' (and a mark at its end). */
static rs_params *
big_prompt(size_t n)
{
	rs_params *p = rs_params_new();
	char *big = malloc(n + 1);

	memset(big, 'x', n);
	memcpy(big + n - 3, "END", 3);
	big[n] = '\0';
	rs_params_set_str(p, "prompt", big);
	free(big);
	return p;
}

/* Reads what the client's socket holds into *buf (grown), without waiting. */
static void
fake_drain(struct fake *f, char **buf, size_t *len, size_t *cap)
{
	ssize_t n;

	for (;;) {
		if (*cap - *len < 65536) {
			*cap = *cap * 2 + 65536;
			*buf = realloc(*buf, *cap);
		}
		n = recv(f->fd, *buf + *len, *cap - *len, MSG_DONTWAIT);
		if (n <= 0)
			return;
		*len += (size_t)n;
	}
}

/* How many whole frames buf holds. */
static size_t
whole_frames(const char *buf, size_t len)
{
	size_t n = 0, off = 0, body;

	while (buf != NULL && frame_check((const unsigned char *)buf + off, len - off, 64u << 20, &body) == FRAME_OK) {
		off += 4 + body;
		n++;
	}
	return n;
}

/* The request frame at *off of buf, decoded; *off moves past it. */
static rs_value *
frame_at(const char *buf, size_t len, size_t *off)
{
	char err[ERRMSG_LEN];
	size_t body;
	rs_value *v;

	assert_int_equal(frame_check((const unsigned char *)buf + *off, len - *off, 64u << 20, &body), FRAME_OK);
	assert_int_equal(frame_decode(buf + *off + 4, body, &v, err), RS_OK);
	*off += 4 + body;
	return v;
}

/*
 * A request larger than the socket takes is queued, not waited for: the
 * start returns at once with bytes unsent; rs_process sends more each time
 * the socket has room, and later requests follow it in order.
 */
static void
test_nonblock_queue(void **state)
{
	struct fake *f = *state;
	size_t n = 4u << 20, len = 0, cap = 0, off = 0, rounds = 0;
	rs_params *p = big_prompt(n);
	char *buf = NULL;
	uint64_t a, b;
	rs_value *v;

	a = rs_generate_start(f->c, p, NULL, NULL, NULL, NULL);
	assert_true(a > 0);
	assert_true(rs_unsent(f->c) > 0 && rs_unsent(f->c) < n + 64);
	b = rs_call_start(f->c, "status", NULL, NULL, NULL, NULL);
	assert_true(b > a);
	assert_int_equal(rs_cancel_start(f->c, a), RS_OK);
	while (rs_unsent(f->c) > 0) {
		fake_drain(f, &buf, &len, &cap);
		assert_int_equal(rs_process(f->c), RS_OK);
		assert_true(++rounds < 100000);
	}
	fake_drain(f, &buf, &len, &cap);
	v = frame_at(buf, len, &off);
	assert_int_equal(rs_uint(rs_get(v, "id")), a);
	assert_int_equal(rs_len(rs_get(v, "prompt")), n);
	assert_memory_equal(rs_str(rs_get(v, "prompt")) + n - 3, "END", 3);
	rs_value_free(v);
	v = frame_at(buf, len, &off);
	assert_string_equal(rs_str(rs_get(v, "op")), "status");
	rs_value_free(v);
	v = frame_at(buf, len, &off);
	assert_string_equal(rs_str(rs_get(v, "op")), "cancel");
	assert_int_equal(rs_uint(rs_get(v, "target")), a);
	rs_value_free(v);
	assert_int_equal(off, len);
	assert_int_equal(rs_last_status(f->c), RS_OK);
	free(buf);
	rs_params_free(p);
}

/* A blocking call on such a client sends its queued request while it waits for the reply. */
static void
test_nonblock_blocking_call(void **state)
{
	struct fake *f = *state;
	rs_params *p = big_prompt(2u << 20);
	rs_value *out;
	pid_t pid;

	assert_true(rs_generate_start(f->c, p, NULL, NULL, NULL, NULL) > 0);
	assert_true(rs_unsent(f->c) > 0);
	if ((pid = fork()) == 0) {          /* the daemon: reads both requests, answers the second */
		size_t len = 0, cap = 0, off = 0;
		char *buf = NULL;
		struct frame fr;
		rs_value *v;

		while (whole_frames(buf, len) < 2) {
			fake_drain(f, &buf, &len, &cap);
			usleep(1000);
		}
		rs_value_free(frame_at(buf, len, &off));
		v = frame_at(buf, len, &off);
		open_frame(&fr, 3);
		kv_uint(&fr, "id", rs_uint(rs_get(v, "id")));
		kv_str(&fr, "type", "result");
		kv_str(&fr, "server", "fake");
		fake_send(f, &fr);
		_exit(0);
	}
	close(f->fd);
	f->fd = -1;
	assert_int_equal(rs_server_status(f->c, &out), RS_OK);
	assert_string_equal(rs_str(rs_get(out, "server")), "fake");
	assert_int_equal(rs_unsent(f->c), 0);
	rs_value_free(out);
	waitpid(pid, NULL, 0);
	rs_params_free(p);
}

/* A write that fails ends the connection at the next rs_process, not inside the start. */
static void
test_nonblock_write_fails(void **state)
{
	struct fake *f = *state;
	struct seen a = { 0 }, b = { 0 };
	rs_params *p = rs_params_new();
	uint64_t ia, ib;

	rs_params_set_str(p, "prompt", "x");
	ia = rs_generate_start(f->c, p, on_token, on_done, on_error, &a);
	assert_true(ia > 0);
	send_error(f, 0, "frame_too_large", "a frame of 5 bytes");
	close(f->fd);
	f->fd = -1;
	ib = rs_generate_start(f->c, p, on_token, on_done, on_error, &b);
	assert_true(ib > 0);                /* the failed write is not this start's to report */
	assert_int_equal(a.errors + b.errors, 0);
	assert_int_equal(rs_generate_start(f->c, p, NULL, NULL, NULL, NULL), 0);
	assert_int_equal(rs_last_status(f->c), RS_ERR_FRAME_TOO_LARGE);
	assert_int_equal(rs_process(f->c), RS_ERR_FRAME_TOO_LARGE);
	assert_int_equal(a.errors, 1);
	assert_int_equal(b.errors, 1);
	assert_int_equal(b.error, RS_ERR_FRAME_TOO_LARGE);
	assert_string_equal(b.message, "a frame of 5 bytes");
	assert_int_equal(rs_pending(f->c), 0);
	rs_params_free(p);
}

/* The limit of a hello started without waiting holds from its result on. */
static void
test_async_hello_max_frame(void **state)
{
	struct fake *f = *state;
	rs_params *p = big_prompt(200);
	struct frame fr;
	uint64_t id;

	id = rs_call_start(f->c, "hello", NULL, NULL, NULL, NULL);
	assert_true(id > 0);
	rs_value_free(recv_request(f));
	assert_true(rs_generate_start(f->c, p, NULL, NULL, NULL, NULL) > 0);   /* the limit is not known yet */
	rs_value_free(recv_request(f));
	open_frame(&fr, 3);
	kv_uint(&fr, "id", id);
	kv_str(&fr, "type", "result");
	kv_uint(&fr, "max_frame", 100);
	fake_send(f, &fr);
	assert_int_equal(rs_process(f->c), RS_OK);
	assert_int_equal(rs_generate_start(f->c, p, NULL, NULL, NULL, NULL), 0);
	assert_int_equal(rs_last_status(f->c), RS_ERR_FRAME_TOO_LARGE);
	assert_non_null(strstr(rs_last_error(f->c), "at most 100"));
	assert_int_equal(rs_unsent(f->c), 0);
	rs_params_free(p);
}

/* A daemon whose queue of connections is full fails a non-blocking connect at once. */
static void
test_nonblock_connect(void **state)
{
	char dir[] = "/tmp/test_client.XXXXXX", path[64];
	struct sockaddr_un sa;
	rs_client *a, *b;
	rs_error err;
	int fd;

	assert_non_null(mkdtemp(dir));
	snprintf(path, sizeof path, "%s/socket", dir);
	memset(&sa, 0, sizeof sa);
	sa.sun_family = AF_UNIX;
	snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
	fd = socket(AF_UNIX, SOCK_STREAM, 0);
	assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
	assert_int_equal(listen(fd, 0), 0);     /* one connection waits; the next finds the queue full */
	a = rs_connect(path, RS_NONBLOCK, &err);
	assert_non_null(a);
	b = rs_connect(path, RS_NONBLOCK, &err);
	assert_null(b);
	assert_int_equal(err.code, RS_ERR_CONNECT);
	assert_non_null(strstr(err.message, "takes no more connections"));
	assert_null(rs_connect(path, RS_NONBLOCK | RS_START_DAEMON, &err));
	assert_int_equal(err.code, RS_ERR_INVAL);
	rs_close(a);
	close(fd);
	unlink(path);
	rmdir(dir);
}

/*
 * The daemon's frame_too_large comes while a blocking client still writes
 * the frame, and its close only later: the reply read while waiting to
 * write is the reason, not the end of file that follows it.
 */
static void
test_frame_too_large_then_close(void **state)
{
	struct fake *f = *state;
	rs_params *p = big_prompt(4u << 20);
	pid_t pid;

	if ((pid = fork()) == 0) {
		usleep(100000);
		send_error(f, 0, "frame_too_large", "a frame of 4194330 bytes");
		usleep(300000);
		_exit(0);
	}
	close(f->fd);
	f->fd = -1;
	assert_int_equal(rs_generate_start(f->c, p, NULL, NULL, NULL, NULL), 0);
	assert_int_equal(rs_last_status(f->c), RS_ERR_FRAME_TOO_LARGE);
	assert_string_equal(rs_last_error(f->c), "a frame of 4194330 bytes");
	waitpid(pid, NULL, 0);
	rs_params_free(p);
}

/* A reply that is not msgpack ends the connection as a protocol error. */
static void
test_garbage_reply(void **state)
{
	struct fake *f = *state;
	static const char junk[] = { 0, 0, 0, 2, (char)0xc1, 0x00 };

	assert_int_equal(write(f->fd, junk, sizeof junk), (ssize_t)sizeof junk);
	assert_int_equal(rs_hello(f->c, "t", NULL), RS_ERR_PROTOCOL);
	assert_int_equal(rs_process(f->c), RS_ERR_PROTOCOL);
}

/* Nobody listening: RS_ERR_CONNECT naming the socket; the default path follows the environment. */
static void
test_connect_errors(void **state)
{
	char buf[256], want[256];
	rs_error err;

	assert_null(rs_connect("/nonexistent/dir/socket", 0, &err));
	assert_int_equal(err.code, RS_ERR_CONNECT);
	assert_string_equal(err.message, "residentd is not running (no socket at /nonexistent/dir/socket)");
	setenv("RESIDENT_SOCKET", "/a/b", 1);
	assert_int_equal(rs_default_socket(buf, sizeof buf), 0);
	assert_string_equal(buf, "/a/b");
	unsetenv("RESIDENT_SOCKET");
	setenv("XDG_RUNTIME_DIR", "/run/user/7", 1);
	assert_int_equal(rs_default_socket(buf, sizeof buf), 0);
	assert_string_equal(buf, "/run/user/7/resident/socket");
	unsetenv("XDG_RUNTIME_DIR");
	assert_int_equal(rs_default_socket(buf, sizeof buf), 0);
	snprintf(want, sizeof want, "/tmp/resident-%u/socket", (unsigned)getuid());
	assert_string_equal(buf, want);
	assert_int_equal(rs_default_socket(buf, 4), -1);
	/* starting a daemon that cannot be run says so */
	setenv("RESIDENT_DAEMON", "/nonexistent/residentd", 1);
	assert_null(rs_connect("/nonexistent/dir/socket", RS_START_DAEMON, &err));
	assert_int_equal(err.code, RS_ERR_CONNECT);
	assert_non_null(strstr(err.message, "cannot start /nonexistent/residentd"));
	unsetenv("RESIDENT_DAEMON");
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_frame_check),
		cmocka_unit_test(test_frame_encode),
		cmocka_unit_test(test_frame_decode_errors),
		cmocka_unit_test(test_values),
		cmocka_unit_test(test_params),
		cmocka_unit_test(test_params_maps),
		cmocka_unit_test(test_error_codes),
		cmocka_unit_test(test_connect_errors),
		cmocka_unit_test_setup_teardown(test_async_interleaved, fake_setup, fake_teardown),
		cmocka_unit_test_setup_teardown(test_call_start, fake_setup, fake_teardown),
		cmocka_unit_test_setup_teardown(test_split_frames, fake_setup, fake_teardown),
		cmocka_unit_test_setup_teardown(test_blocking_dispatches_others, fake_setup, fake_teardown),
		cmocka_unit_test_setup_teardown(test_blocking_error, fake_setup, fake_teardown),
		cmocka_unit_test_setup_teardown(test_token_cb_cancels, fake_setup, fake_teardown),
		cmocka_unit_test_setup_teardown(test_nested_blocking_call, fake_setup, fake_teardown),
		cmocka_unit_test_setup_teardown(test_generate_collects, fake_setup, fake_teardown),
		cmocka_unit_test_setup_teardown(test_reasoning, fake_setup, fake_teardown),
		cmocka_unit_test_setup_teardown(test_choices, fake_setup, fake_teardown),
		cmocka_unit_test_setup_teardown(test_progress, fake_setup, fake_teardown),
		cmocka_unit_test_setup_teardown(test_tokens, fake_setup, fake_teardown),
		cmocka_unit_test_setup_teardown(test_embed, fake_setup, fake_teardown),
		cmocka_unit_test_setup_teardown(test_max_frame, fake_setup, fake_teardown),
		cmocka_unit_test_setup_teardown(test_connection_lost, fake_setup, fake_teardown),
		cmocka_unit_test_setup_teardown(test_frame_too_large, fake_setup, fake_teardown),
		cmocka_unit_test_setup_teardown(test_frame_too_large_async, fake_setup, fake_teardown),
		cmocka_unit_test_setup_teardown(test_frame_too_large_while_writing, fake_setup, fake_teardown),
		cmocka_unit_test_setup_teardown(test_garbage_reply, fake_setup, fake_teardown),
		cmocka_unit_test_setup_teardown(test_frame_too_large_then_close, fake_setup, fake_teardown),
		cmocka_unit_test_setup_teardown(test_nonblock_queue, fake_setup_nonblock, fake_teardown),
		cmocka_unit_test_setup_teardown(test_nonblock_blocking_call, fake_setup_nonblock, fake_teardown),
		cmocka_unit_test_setup_teardown(test_nonblock_write_fails, fake_setup_nonblock, fake_teardown),
		cmocka_unit_test_setup_teardown(test_async_hello_max_frame, fake_setup_nonblock, fake_teardown),
		cmocka_unit_test(test_nonblock_connect),
	};

	/* a client waiting for a reply the fake never sends would hang: fail instead */
	alarm(60);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
