/*
 * fuzz_proto.c: libFuzzer target for the request decoder (daemon/proto.c).
 * Whatever the frame payload, proto_decode either refuses it with one of
 * the protocol's error codes (and a NUL-terminated message that fits
 * ERR_LEN) or hands out a request whose every string is NUL-terminated
 * valid UTF-8 and whose fields are within the ranges PROTOCOL.md gives.
 * The error reply built from the result must itself be one msgpack map.
 *
 * Run (from a build configured with --enable-fuzz CC=clang):
 *   mkdir corpus && python3 -c 'import msgpack; open("corpus/gen", "wb").write(msgpack.packb(
 *       {"id": 1, "op": "generate", "prompt": "hi", "stop": ["x"], "temperature": 0.5}))'
 *   tests/fuzz/fuzz_proto -max_total_time=600 corpus
 * (a few such payloads, one per op, make good seeds; see libclient/PROTOCOL.md).
 */
#include "config.h"
#include "proto.h"
#include "util.h"

#include <msgpack.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(c) do { if (!(c)) abort(); } while (0)

static void
check_str(const char *s)
{
	if (s != NULL)
		CHECK(utf8_valid(s, strlen(s)));
}

/* The reply must parse back as exactly one map with id, type, code, message. */
static void
check_reply(const msgpack_sbuffer *sb)
{
	msgpack_unpacked u;
	size_t off = 0;
	uint32_t n;

	CHECK(sb->size >= 5);
	n = (uint32_t)(uint8_t)sb->data[0] << 24 | (uint32_t)(uint8_t)sb->data[1] << 16 |
	    (uint32_t)(uint8_t)sb->data[2] << 8 | (uint8_t)sb->data[3];
	CHECK(n == sb->size - 4);
	msgpack_unpacked_init(&u);
	CHECK(msgpack_unpack_next(&u, sb->data + 4, n, &off) == MSGPACK_UNPACK_SUCCESS);
	CHECK(off == n);
	CHECK(u.data.type == MSGPACK_OBJECT_MAP && u.data.via.map.size == 4);
	/* every string of the reply is valid UTF-8 (the client decodes it as text) */
	for (uint32_t i = 0; i < u.data.via.map.size; i++) {
		const msgpack_object *v = &u.data.via.map.ptr[i].val;
		if (v->type == MSGPACK_OBJECT_STR)
			CHECK(utf8_valid(v->via.str.ptr, v->via.str.size));
	}
	msgpack_unpacked_destroy(&u);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct proto_req r;
	char err[ERR_LEN];
	int has_id, rc, i;

	memset(err, 0, sizeof err);
	rc = proto_decode((const char *)data, size, &r, &has_id, err);
	CHECK(rc >= 0 && rc < PE_COUNT_);
	if (rc != 0) {
		msgpack_sbuffer sb;

		CHECK(rc != PE_NONE);
		CHECK(memchr(err, '\0', sizeof err) != NULL);
		proto_error(&sb, has_id, r.id, (enum proto_err)rc, err);
		check_reply(&sb);
		msgpack_sbuffer_destroy(&sb);
	} else {
		CHECK(has_id);
		CHECK(r.op >= 0 && r.op < OP_COUNT_);
		check_str(r.client), check_str(r.prompt), check_str(r.session), check_str(r.model);
		check_str(r.title), check_str(r.system), check_str(r.text);
		CHECK(r.n_stop >= 0 && r.n_stop <= PROTO_MAX_STOP);
		for (i = 0; i < r.n_stop; i++) {
			check_str(r.stop[i]);
			CHECK(strlen(r.stop[i]) >= 1 && strlen(r.stop[i]) <= 256);
		}
		CHECK(r.n_msgs >= 0 && r.n_msgs <= PROTO_MAX_MSGS);
		for (i = 0; i < r.n_msgs; i++)
			check_str(r.msgs[i].role), check_str(r.msgs[i].content);
		if (r.op == OP_GENERATE) {
			CHECK((r.prompt != NULL) != (r.n_msgs > 0));
			CHECK(r.max_tokens >= 1);
		}
		for (size_t j = 0; j < r.n_tokens; j++)
			CHECK(r.tokens[j] >= 0);
	}
	proto_req_free(&r);
	return 0;
}
