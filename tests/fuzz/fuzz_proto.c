/*
 * fuzz_proto.c: libFuzzer target for the request decoder (daemon/proto.c).
 * Whatever the frame payload, proto_decode either refuses it with one of
 * the protocol's error codes (and a NUL-terminated message that fits
 * ERR_LEN) or hands out a request whose every string is NUL-terminated
 * valid UTF-8 and whose fields are within the ranges and limits
 * PROTOCOL.md gives (Limits), session defaults as a JSON object. The
 * error reply built from the result must itself be one msgpack map.
 *
 * Run (from a build configured with --enable-fuzz CC=clang):
 *   mkdir corpus && python3 -c 'import msgpack; open("corpus/gen", "wb").write(msgpack.packb(
 *       {"id": 1, "op": "generate", "prompt": "hi", "stop": ["x"], "temperature": 0.5}))'
 *   tests/fuzz/fuzz_proto -max_total_time=600 corpus
 * (a few such payloads, one per op, make good seeds: tests/fuzz/corpus/proto).
 */
#include "config.h"
#include "fuzz.h"
#include "proto.h"
#include "util.h"

#include <jansson.h>
#include <math.h>
#include <msgpack.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK FUZZ_CHECK

/* A string field: valid UTF-8 of at most max bytes; returns its length. */
static size_t
check_str(const char *s, size_t max)
{
	size_t n = s ? strlen(s) : 0;

	CHECK(n <= max && (s == NULL || utf8_valid(s, n)));
	return n;
}

/* The sampling fields are finite and within their ranges. */
static void
check_sampling(const struct proto_req *r)
{
	const struct sample_params *p = &r->sample;

	CHECK(isfinite(p->temperature) && isfinite(p->top_p) && isfinite(p->min_p));
	CHECK(isfinite(p->repeat_penalty) && isfinite(p->presence_penalty) && isfinite(p->frequency_penalty));
	CHECK(p->top_k >= 0 && p->top_k <= (1 << 20));
	CHECK(r->max_tokens >= 1 && r->max_tokens <= (1 << 24));
}

/* session.new's defaults: a JSON object of sampling fields. */
static void
check_defaults(const char *d)
{
	json_t *j;

	if (d == NULL)
		return;
	CHECK((j = json_loads(d, 0, NULL)) != NULL && json_is_object(j));
	json_decref(j);
}

/* Every field of a decoded request. */
static void
check_req(const struct proto_req *r)
{
	size_t total = 0;
	int i;

	CHECK(r->op >= 0 && r->op < OP_COUNT_);
	check_str(r->client, PROTO_MAX_CLIENT), check_str(r->prompt, PROTO_MAX_TEXT);
	check_str(r->session, SIZE_MAX), check_str(r->model, PROTO_MAX_MODEL);
	check_str(r->title, SIZE_MAX), check_str(r->system, SIZE_MAX), check_str(r->text, PROTO_MAX_TEXT);
	CHECK(r->n_stop >= 0 && r->n_stop <= PROTO_MAX_STOP);
	for (i = 0; i < r->n_stop; i++)
		CHECK(check_str(r->stop[i], PROTO_MAX_STOP_LEN) >= 1);
	CHECK(r->n_msgs >= 0 && r->n_msgs <= PROTO_MAX_MSGS);
	for (i = 0; i < r->n_msgs; i++) {
		check_str(r->msgs[i].role, SIZE_MAX);
		CHECK(!strcmp(r->msgs[i].role, "system") || !strcmp(r->msgs[i].role, "user") ||
		    !strcmp(r->msgs[i].role, "assistant"));
		total += check_str(r->msgs[i].content, PROTO_MAX_TEXT);
	}
	CHECK(total <= PROTO_MAX_TEXT);
	if (r->op == OP_GENERATE) {
		CHECK((r->prompt != NULL) != (r->n_msgs > 0));
		CHECK(r->session == NULL || r->prompt == NULL);
		check_sampling(r);
	}
	check_defaults(r->defaults);
	CHECK(r->limit >= 0 && r->limit <= PROTO_MAX_LIST && r->offset >= 0);
	CHECK(r->n_tokens <= PROTO_MAX_TOKENS);
	for (size_t j = 0; j < r->n_tokens; j++)
		CHECK(r->tokens[j] >= 0);
	CHECK(r->op != OP_TOKENIZE || r->text != NULL);
	CHECK(r->op != OP_DETOKENIZE || r->tokens != NULL);
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
	int has_id, rc;

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
		check_req(&r);
	}
	proto_req_free(&r);
	return 0;
}
