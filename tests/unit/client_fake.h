/*
 * client_fake.h: a fake daemon for libresident's unit tests (test_client,
 * test_client_conn): a socket the test listens on, frames written into it
 * by hand, the client's requests read back, and callbacks that record
 * what they saw.
 */
#ifndef RESIDENT_CLIENT_FAKE_H
#define RESIDENT_CLIENT_FAKE_H

#include "internal.h"

#include <stdint.h>

/* A msgpack buffer with a reserved length, packed by the caller, finished by seal(). */
struct frame {
	msgpack_sbuffer sb;
	msgpack_packer pk;
};

struct fake {
	char dir[64], path[96];
	int listen_fd, fd;          /* our end of the client's connection */
	rs_client *c;
};

/* What the callbacks saw. */
struct seen {
	char text[256], reasoning[256], tool[64];
	int tokens, dones, errors, stop_after;
	char finish[32];
	rs_status error;
	char message[128];
	uint64_t last_id;
};

void open_frame(struct frame *f, size_t n_fields);
void kv_str(struct frame *f, const char *k, const char *v);
void kv_uint(struct frame *f, const char *k, uint64_t v);
/* Listens on a socket in a temporary directory and connects a client to it with flags. */
int fake_open(void **state, int flags);
int fake_setup(void **state);
/* A client that never waits for the daemon (RS_NONBLOCK). */
int fake_setup_nonblock(void **state);
int fake_teardown(void **state);
/* Writes a finished frame to the client. */
void fake_send(struct fake *f, struct frame *fr);
/* Sends {id, type: "token", text, token}, reasoning and tool where not NULL, choice where >= 0. */
void send_piece(struct fake *f, uint64_t id, const char *text, const char *reasoning, const char *tool, int choice);
void send_token(struct fake *f, uint64_t id, const char *text);
/* Sends {id, type: "done", finish, usage: {generated_tokens}}. */
void send_done(struct fake *f, uint64_t id, const char *finish);
void send_error(struct fake *f, uint64_t id, const char *code, const char *msg);
/* Sends {id, type: "result"} plus one string field. */
void send_result(struct fake *f, uint64_t id, const char *k, const char *v);
/* Reads the next request frame the client wrote. */
rs_value *recv_request(struct fake *f);
int on_token(uint64_t id, const char *text, const rs_value *reply, void *user);
void on_done(uint64_t id, const rs_value *done, void *user);
void on_error(uint64_t id, rs_status code, const char *message, void *user);

#endif
