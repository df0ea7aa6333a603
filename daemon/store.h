/* store.h: the session store, SQLite (sessions, their turns, known models). */
#ifndef RESIDENT_STORE_H
#define RESIDENT_STORE_H

#include <stdint.h>

/*
 * One open database. Used from the daemon's loop thread only: no call is
 * thread-safe, and none may run on an engine thread. Other processes (a
 * second daemon, the sqlite3 CLI) may read or write the same file; a call
 * waits up to STORE_BUSY_MS for their locks before it fails.
 *
 * Every function that can fail returns 0 or a negative ERR_* code (util.h)
 * with a message in err. A session that does not exist and a session that
 * belongs to another uid are the same ERR_NOTFOUND with the same message,
 * so that a uid cannot learn which uuids exist. A malformed uuid (anything
 * but 36 characters of lowercase hex in 8-4-4-4-12 form) is ERR_INVAL.
 */
struct store;

#define STORE_BUSY_MS 5000

/*
 * What a session stores, bounded: a title is for a list on a screen, a
 * system prompt is rendered before every turn. Longer ones are refused
 * with ERR_RANGE; a fork's default title ("parent (fork)") is cut to fit,
 * at a character boundary.
 */
#define STORE_MAX_TITLE 256            /* bytes */
#define STORE_MAX_SYSTEM (64u << 10)   /* bytes: about 16k tokens */
/* Sessions one uid may hold unless store_set_max_sessions says otherwise. */
#define STORE_MAX_SESSIONS_DEFAULT 10000

/* A session's metadata. After a successful call every string is set except
 * defaults, which is NULL when the session has no sampling defaults. */
struct store_session {
	char uuid[37];
	uint32_t uid;        /* the owner */
	char *model;
	char *title;
	char *system;        /* the system prompt */
	char *defaults;      /* JSON text of sampling defaults; opaque here */
	int64_t created;     /* Unix seconds */
	int64_t updated;     /* Unix seconds of the last append, rename or fork */
	int32_t n_tokens;    /* sum of the turns' token counts */
	int32_t n_turns;
};

/* One turn of a session's history. */
struct store_turn {
	char *role;
	char *content;
	char *reasoning;     /* an assistant turn's reasoning, apart from content; "" when none
	                        (NULL is "" for store_append_turns) */
	char *tool_calls;    /* an assistant turn's tool calls, JSON text (chat_calls_json); "" when none */
	char *tool_call_id;  /* a tool result's: the call it answers; "" when none */
	char *tool_name;     /* a tool result's: the tool's name; "" when none
	                        (each NULL is "" for store_append_turns) */
	int32_t *tokens;     /* token ids, NULL when n_tokens is 0 */
	int32_t n_tokens;
};

/*
 * Opens (creating it and its missing parent directories, mode 0700, and the
 * file itself 0600) the database at path and brings its schema up to date.
 * A database whose schema is newer than this code knows is refused with
 * ERR_UNSUPPORTED and left untouched.
 */
int store_open(const char *path, struct store **out, char *err);
/* Closes the database; NULL is allowed. */
void store_close(struct store *s);
/* The schema version this code writes (PRAGMA user_version). */
int store_schema_version(void);
/*
 * Sessions one uid may hold (0: no limit): creating or forking one more is
 * refused with ERR_QUOTA. STORE_MAX_SESSIONS_DEFAULT after store_open.
 */
void store_set_max_sessions(struct store *s, int n);

/* Frees a session's strings and zeroes it; safe on a zeroed struct. */
void store_session_clear(struct store_session *ss);
/* Clears and frees an array of n sessions. */
void store_sessions_free(struct store_session *ss, int n);
/* Frees an array of n turns and their strings. */
void store_turns_free(struct store_turn *t, int n);

/*
 * The session functions below fill *out (when they have one) only on
 * success; on failure it is zeroed, so store_session_clear is always safe.
 */

/* Creates a session with a fresh random (v4) uuid. NULL model, title and
 * system are stored as "", NULL defaults as none. ERR_RANGE for a title or
 * system prompt over its limit, ERR_QUOTA when uid holds the most sessions
 * allowed. */
int store_session_new(struct store *s, uint32_t uid, const char *model,
    const char *title, const char *system, const char *defaults,
    struct store_session *out, char *err);
/* Reads one of uid's sessions. */
int store_session_get(struct store *s, uint32_t uid, const char *uuid,
    struct store_session *out, char *err);
/* Lists uid's sessions, most recently updated first, skipping offset and
 * returning at most limit (both >= 0) into a malloc'd array (NULL when *n
 * is 0) for store_sessions_free. */
int store_session_list(struct store *s, uint32_t uid, int limit, int offset,
    struct store_session **out, int *n, char *err);
/* Sets a session's title (not NULL, at most STORE_MAX_TITLE bytes); counts
 * as an update. */
int store_session_rename(struct store *s, uint32_t uid, const char *uuid,
    const char *title, char *err);
/* Deletes a session and its turns. */
int store_session_delete(struct store *s, uint32_t uid, const char *uuid,
    char *err);
/* Copies a session and all its turns to a new session of the same uid, in
 * one transaction. A NULL title means the parent's + " (fork)", cut to
 * STORE_MAX_TITLE bytes. Refused as store_session_new refuses. */
int store_session_fork(struct store *s, uint32_t uid, const char *uuid,
    const char *title, struct store_session *out, char *err);

/* Reads a session's turns in order into a malloc'd array (NULL when *n is
 * 0) for store_turns_free. */
int store_turns(struct store *s, uint32_t uid, const char *uuid,
    struct store_turn **out, int *n, char *err);
/*
 * Appends n >= 1 turns (role and content not NULL) to a session in one
 * transaction: they take the next indices, and the session's n_turns,
 * n_tokens and updated move with them. All or nothing: after a failure, or
 * a crash at any point, the session is as it was before the call.
 * after >= 0 is the number of turns the new ones follow (the history
 * they were generated from): ERR_BUSY if the session has another number
 * by then (a turn stored meanwhile by another request or process).
 */
int store_append_turns(struct store *s, uint32_t uid, const char *uuid, int32_t after,
    const struct store_turn *t, int n, char *err);

/* Records a model file (path and name not NULL), or updates the record of
 * that path, keeping the time it was first added. */
int store_model_upsert(struct store *s, const char *path, const char *name,
    const char *hash, const char *arch, int64_t size, char *err);

#endif
