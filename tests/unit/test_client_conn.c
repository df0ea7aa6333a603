/*
 * test_client_conn.c: libresident's connection against a fake daemon
 * (client_fake.h): the frame limit learned from hello, a lost connection,
 * frame_too_large however it comes, RS_NONBLOCK (queued sends, a blocking
 * call on a non-blocking client, a failed write, a connect that does not
 * wait), a garbage reply, and connect's errors.
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
		cmocka_unit_test(test_connect_errors),
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
