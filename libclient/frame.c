/*
 * frame.c: the protocol's framing. A frame is a 4-byte big-endian length N
 * (1..limit), then N bytes holding exactly one msgpack map.
 */
#include "internal.h"

#include <string.h>

enum frame_state
frame_check(const unsigned char *p, size_t len, size_t max, size_t *body_len)
{
	uint32_t n;

	if (len < 4)
		return FRAME_MORE;
	n = (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
	if (n == 0 || n > max)
		return FRAME_BAD;
	*body_len = n;
	return len - 4 >= n ? FRAME_OK : FRAME_MORE;
}

void
frame_pack_str(msgpack_packer *pk, const char *s)
{
	size_t n = strlen(s);

	msgpack_pack_str(pk, n);
	msgpack_pack_str_body(pk, s, n);
}

void
frame_begin(msgpack_sbuffer *sb, msgpack_packer *pk, uint64_t id, const char *op, size_t n_more)
{
	static const char len_placeholder[4];

	msgpack_sbuffer_init(sb);
	msgpack_sbuffer_write(sb, len_placeholder, 4);
	msgpack_packer_init(pk, sb, msgpack_sbuffer_write);
	msgpack_pack_map(pk, 2 + n_more);
	frame_pack_str(pk, "id");
	msgpack_pack_uint64(pk, id);
	frame_pack_str(pk, "op");
	frame_pack_str(pk, op);
}

void
frame_end(msgpack_sbuffer *sb)
{
	uint32_t n = (uint32_t)(sb->size - 4);

	sb->data[0] = (char)(n >> 24);
	sb->data[1] = (char)(n >> 16);
	sb->data[2] = (char)(n >> 8);
	sb->data[3] = (char)n;
}

rs_status
frame_decode(const char *body, size_t len, rs_value **out, char *err)
{
	msgpack_unpacked u;
	size_t off = 0;
	rs_status st = RS_OK;

	*out = NULL;
	msgpack_unpacked_init(&u);
	switch (msgpack_unpack_next(&u, body, len, &off)) {
	case MSGPACK_UNPACK_SUCCESS:
		break;
	case MSGPACK_UNPACK_NOMEM_ERROR:
		st = err_fmt(err, RS_ERR_NOMEM, "out of memory decoding a reply of %zu bytes", len);
		goto out;
	default:
		st = err_fmt(err, RS_ERR_PROTOCOL, "a reply frame is not valid msgpack");
		goto out;
	}
	if (off != len)
		st = err_fmt(err, RS_ERR_PROTOCOL, "a reply frame has %zu bytes after its map", len - off);
	else if (u.data.type != MSGPACK_OBJECT_MAP)
		st = err_fmt(err, RS_ERR_PROTOCOL, "a reply frame is not a msgpack map");
	else if ((*out = value_from_msgpack(&u.data)) == NULL)
		st = err_fmt(err, RS_ERR_NOMEM, "out of memory decoding a reply of %zu bytes", len);
out:
	msgpack_unpacked_destroy(&u);
	return st;
}
