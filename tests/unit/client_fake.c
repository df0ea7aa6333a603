/*
 * client_fake.c: the fake daemon of client_fake.h.
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
#include "client_fake.h"

/* ---- building frames by hand ---- */


void
open_frame(struct frame *f, size_t n_fields)
{
	static const char len[4];

	msgpack_sbuffer_init(&f->sb);
	msgpack_sbuffer_write(&f->sb, len, 4);
	msgpack_packer_init(&f->pk, &f->sb, msgpack_sbuffer_write);
	msgpack_pack_map(&f->pk, n_fields);
}

void
kv_str(struct frame *f, const char *k, const char *v)
{
	frame_pack_str(&f->pk, k);
	frame_pack_str(&f->pk, v);
}

void
kv_uint(struct frame *f, const char *k, uint64_t v)
{
	frame_pack_str(&f->pk, k);
	msgpack_pack_uint64(&f->pk, v);
}


/* ---- a client and a fake daemon ---- */


/* Listens on a socket in a temporary directory and connects a client to it with flags. */
int
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

int
fake_setup(void **state)
{
	return fake_open(state, 0);
}

/* A client that never waits for the daemon (RS_NONBLOCK). */
int
fake_setup_nonblock(void **state)
{
	return fake_open(state, RS_NONBLOCK);
}

int
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
void
fake_send(struct fake *f, struct frame *fr)
{
	size_t n = fr->sb.size - 4;

	fr->sb.data[0] = (char)(n >> 24), fr->sb.data[1] = (char)(n >> 16);
	fr->sb.data[2] = (char)(n >> 8), fr->sb.data[3] = (char)n;
	assert_int_equal(write(f->fd, fr->sb.data, fr->sb.size), (ssize_t)fr->sb.size);
	msgpack_sbuffer_destroy(&fr->sb);
}

/* Sends {id, type: "token", text, token}, reasoning and tool where not NULL, choice where >= 0. */
void
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

void
send_token(struct fake *f, uint64_t id, const char *text)
{
	send_piece(f, id, text, NULL, NULL, -1);
}

/* Sends {id, type: "done", finish, usage: {generated_tokens}}. */
void
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

void
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
void
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
rs_value *
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


int
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

void
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

void
on_error(uint64_t id, rs_status code, const char *message, void *user)
{
	struct seen *s = user;

	s->errors++;
	s->last_id = id;
	s->error = code;
	snprintf(s->message, sizeof s->message, "%s", message);
}
