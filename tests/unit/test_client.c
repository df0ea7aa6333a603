/*
 * test_client.c: libresident without a daemon. Framing, reply decoding,
 * values, params and error codes; then a client talking to a fake daemon
 * (a socket this test listens on and writes replies into by hand):
 * request frames, interleaved replies, callbacks, cancellation, choices,
 * progress, tokens and embeddings. The connection's own cases (a lost one,
 * frames too large, RS_NONBLOCK, connect's errors) are test_client_conn.c's.
 */
#include "config.h"
#include "internal.h"
#include "client_fake.h"

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
 * into one array of floats, or leaves them in the result when vectors and
 * dims are NULL; a result whose vectors do not match the texts is a
 * protocol error, and no texts a local one.
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

	for (int round = 0; round < 3; round++) {
		/* a reply is read by the call that waits for it: sent before each */
		open_frame(&fr, 4);
		kv_uint(&fr, "id", (uint64_t)round + 1);
		kv_str(&fr, "type", "result");
		kv_uint(&fr, "dimensions", 3);
		frame_pack_str(&fr.pk, "embeddings");
		msgpack_pack_array(&fr.pk, round == 2 ? 1 : 2);
		for (int i = 0; i < (round == 2 ? 1 : 2); i++) {
			msgpack_pack_array(&fr.pk, 3);
			for (int j = 0; j < 3; j++)
				msgpack_pack_float(&fr.pk, (float)(i * 10 + j) + 0.5f);
		}
		fake_send(f, &fr);
		if (round == 2) {
			assert_int_equal(rs_embed(f->c, NULL, texts, 2, 0, &v, &d, NULL), RS_ERR_PROTOCOL);
			assert_null(v);
			break;
		}
		if (round == 1) {           /* the vectors left in the result */
			assert_int_equal(rs_embed(f->c, NULL, texts, 2, 0, NULL, NULL, &out), RS_OK);
			assert_true(rs_float(rs_at(rs_at(rs_get(out, "embeddings"), 1), 2)) == 12.5);
			rs_value_free(out);
			continue;
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
	for (int i = 0; i < 2; i++) {
		req = recv_request(f);
		assert_null(rs_get(req, "dimensions"));
		rs_value_free(req);
	}
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
	};

	/* a client waiting for a reply the fake never sends would hang: fail instead */
	alarm(60);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
