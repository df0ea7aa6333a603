/*
 * internal.h: what the files of libresident share. Nothing here is
 * exported from libresident.so (only rs_* names are).
 */
#ifndef RESIDENT_LIBCLIENT_INTERNAL_H
#define RESIDENT_LIBCLIENT_INTERNAL_H

#include <msgpack.h>
#include <stddef.h>
#include <stdint.h>

#include "resident.h"

#define ERRMSG_LEN 256

/* The largest reply frame this side accepts (a long session.get can be big). */
#define FRAME_MAX_REPLY (256u << 20)

/* ---- frame.c: framing and decoding ---- */

enum frame_state { FRAME_MORE, FRAME_OK, FRAME_BAD };

/*
 * Looks at the bytes at p: FRAME_OK when a whole frame is there (*body_len
 * is its payload's length; the frame takes 4 + *body_len bytes), FRAME_MORE
 * when more bytes are needed, FRAME_BAD when the announced length is 0 or
 * over max.
 */
enum frame_state frame_check(const unsigned char *p, size_t len, size_t max, size_t *body_len);

/*
 * Starts a frame in sb (4 bytes reserved for the length) whose map will
 * hold id, op and n_more other fields; frame_end writes the length.
 */
void frame_begin(msgpack_sbuffer *sb, msgpack_packer *pk, uint64_t id, const char *op, size_t n_more);
void frame_end(msgpack_sbuffer *sb);
void frame_pack_str(msgpack_packer *pk, const char *s);

/*
 * Decodes one frame's payload, which must be exactly one msgpack map, into
 * a tree (*out, freed with rs_value_free). Returns RS_OK, or
 * RS_ERR_PROTOCOL / RS_ERR_NOMEM with a message in err.
 */
rs_status frame_decode(const char *body, size_t len, rs_value **out, char *err);

/* ---- value.c: rs_value trees ---- */

/* A tree copied from a msgpack object (strings NUL-terminated); NULL when out of memory. */
rs_value *value_from_msgpack(const msgpack_object *o);
/* Removes key from a map (first occurrence); the rest keeps its order. */
void value_map_remove(rs_value *map, const char *key);

/* ---- params.c: request fields ---- */

size_t params_count(const rs_params *p);
int params_has(const rs_params *p, const char *key);
/* Packs every field as key, value pairs (the caller packed the map header). */
void params_pack(const rs_params *p, msgpack_packer *pk);
/* An array of token ids as a field (detokenize). */
rs_status params_set_uints(rs_params *p, const char *key, const uint32_t *v, size_t n);
/* A nested map as a field (session.new's defaults); sub is copied. */
rs_status params_set_params(rs_params *p, const char *key, const rs_params *sub);

/* ---- error.c ---- */

/* Formats a message into err (ERRMSG_LEN bytes) and returns st. */
rs_status err_fmt(char *err, rs_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- connect.c: finding and reaching the socket ---- */

/*
 * Connects a stream socket to path; with RS_START_DAEMON starts residentd
 * when nobody listens; with RS_NONBLOCK does not wait. Returns the fd
 * (close-on-exec; non-blocking with RS_NONBLOCK) or -1 with err filled.
 */
int connect_socket(const char *path, int flags, rs_error *err);

#endif
