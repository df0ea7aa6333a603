/*
 * error.c: status codes, their protocol names and descriptions.
 */
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* The daemon's codes, in the order of rs_status 1..RS_ERR_CANCELLED. */
static const char *const codes[] = {
	[RS_ERR_BAD_FRAME] = "bad_frame",
	[RS_ERR_FRAME_TOO_LARGE] = "frame_too_large",
	[RS_ERR_BAD_REQUEST] = "bad_request",
	[RS_ERR_UNKNOWN_OP] = "unknown_op",
	[RS_ERR_INVALID_PARAM] = "invalid_param",
	[RS_ERR_INVALID_UTF8] = "invalid_utf8",
	[RS_ERR_CONTEXT_EXCEEDED] = "context_exceeded",
	[RS_ERR_NOT_FOUND] = "not_found",
	[RS_ERR_DUPLICATE_ID] = "duplicate_id",
	[RS_ERR_OVERLOADED] = "overloaded",
	[RS_ERR_MODEL_ERROR] = "model_error",
	[RS_ERR_SHUTTING_DOWN] = "shutting_down",
	[RS_ERR_INTERNAL] = "internal",
	[RS_ERR_QUOTA_EXCEEDED] = "quota_exceeded",
	[RS_ERR_STORAGE_FULL] = "storage_full",
	[RS_ERR_SESSION_BUSY] = "session_busy",
	[RS_ERR_FRAME_TIMEOUT] = "frame_timeout",
	[RS_ERR_CANCELLED] = "cancelled",
};

#define N_CODES (sizeof codes / sizeof codes[0])

const char *
rs_status_code(rs_status st)
{
	if (st > RS_OK && (size_t)st < N_CODES)
		return codes[st];
	return NULL;
}

rs_status
rs_status_from_code(const char *code)
{
	size_t i;

	for (i = 1; code != NULL && i < N_CODES; i++)
		if (strcmp(codes[i], code) == 0)
			return (rs_status)i;
	return RS_ERR_OTHER;
}

const char *
rs_strerror(rs_status st)
{
	switch (st) {
	case RS_OK: return "success";
	case RS_ERR_BAD_FRAME: return "the daemon could not read a frame";
	case RS_ERR_FRAME_TOO_LARGE: return "a request was larger than the daemon accepts";
	case RS_ERR_BAD_REQUEST: return "a required field is missing or has the wrong type";
	case RS_ERR_UNKNOWN_OP: return "the daemon does not know this operation";
	case RS_ERR_INVALID_PARAM: return "a field's value is not allowed";
	case RS_ERR_INVALID_UTF8: return "a string is not valid UTF-8";
	case RS_ERR_CONTEXT_EXCEEDED: return "the prompt does not fit the model's context";
	case RS_ERR_NOT_FOUND: return "no such session, model or request";
	case RS_ERR_DUPLICATE_ID: return "a request with this id is still in flight";
	case RS_ERR_OVERLOADED: return "the daemon is overloaded; try again later";
	case RS_ERR_MODEL_ERROR: return "the model could not be loaded or run";
	case RS_ERR_SHUTTING_DOWN: return "the daemon is stopping";
	case RS_ERR_INTERNAL: return "internal error in the daemon";
	case RS_ERR_QUOTA_EXCEEDED: return "a per-user limit of the daemon is reached (sessions)";
	case RS_ERR_STORAGE_FULL: return "the daemon's database could not be written: no space left";
	case RS_ERR_SESSION_BUSY: return "the session has another turn generating";
	case RS_ERR_FRAME_TIMEOUT: return "a request stopped arriving midway and the daemon gave it up";
	case RS_ERR_CANCELLED: return "the request was cancelled";
	case RS_ERR_OTHER: return "an error this library does not know";
	case RS_ERR_CONNECT: return "cannot connect to residentd";
	case RS_ERR_IO: return "the connection to residentd failed";
	case RS_ERR_PROTOCOL: return "residentd sent a malformed reply";
	case RS_ERR_INVAL: return "invalid argument";
	case RS_ERR_NOMEM: return "out of memory";
	}
	return "unknown status";
}

rs_status
err_fmt(char *err, rs_status st, const char *fmt, ...)
{
	va_list ap;

	if (err != NULL) {
		va_start(ap, fmt);
		vsnprintf(err, ERRMSG_LEN, fmt, ap);
		va_end(ap);
	}
	return st;
}
