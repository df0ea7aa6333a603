/*
 * residentd: flags and configuration, start and orderly stop.
 *
 * Settings come from built-in defaults, then the config file
 * ($XDG_CONFIG_HOME/resident/residentd.json, or --config), then flags.
 * Started by systemd's socket activation, it serves the socket systemd
 * passed instead of its own (server.c).
 * SIGTERM or SIGINT stops it: no new requests, running ones end with
 * finish "cancel" (committed turns are never touched), replies are flushed,
 * the database is closed.
 */
#include "config.h"
#include "engine.h"
#include "log.h"
#include "model.h"
#include "proto.h"
#include "resident.h"
#include "sched.h"
#include "server.h"
#include "store.h"
#include "util.h"

#include <errno.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <getopt.h>
#include <grp.h>
#include <jansson.h>
#include <limits.h>
#include <malloc.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

struct settings {
	char *socket_path, *db_path, *model, *draft, *device, *group, *log_level, *config, *device_fault;
	int threads, ctx, kv_tokens, max_seqs, max_queue, max_step_tokens, exact;
	int max_sessions;     /* per uid; 0: the store's default */
	int kv_share_users;
	char *kv_host, *kv_disk;     /* sizes as given */
	char *kv_type_text;          /* --kv-type as given */
	enum kv_type kv_type;
	uint64_t kv_host_bytes, kv_disk_bytes;
	char *device_memory, *keep_alive;
	uint64_t device_bytes;
	double keep_alive_s;
	char *kv_dir;
	int socket_private;   /* the default path: its directory must be ours alone */
	long max_frame;
	int max_clients, frame_timeout;   /* 0: the server's defaults */
	/* --model-draft or the config's "model_drafts": n_drafts pairs of a model (as requests name it) and its draft */
	char **drafts;
	int n_drafts;
};

/* What the arguments, the config file and finish_settings allocated, on every way out of main. */
static void
settings_free(struct settings *s)
{
	free(s->socket_path), free(s->db_path), free(s->model), free(s->device), free(s->group);
	free(s->log_level), free(s->config), free(s->device_fault), free(s->kv_host), free(s->kv_disk), free(s->kv_dir);
	free(s->kv_type_text);
	free(s->draft);
	for (int i = 0; i < 2 * s->n_drafts; i++)
		free(s->drafts[i]);
	free(s->drafts);
	free(s->device_memory), free(s->keep_alive);
}

static void
usage(FILE *fp)
{
	fprintf(fp,
	    "usage: residentd [options]\n"
	    "  -m, --model PATH        default model (.gguf file or Hugging Face directory)\n"
	    "      --draft PATH        a smaller model of the default model's vocabulary that guesses\n"
	    "                          its next tokens for requests that name no draft (speculative\n"
	    "                          decoding: the same output, faster; it loads beside the model,\n"
	    "                          and requests go on without it where it does not fit)\n"
	    "      --model-draft MODEL=PATH  the same for requests on MODEL (a name or path, as requests\n"
	    "                          give it); repeatable\n"
	    "  -s, --socket PATH       socket (default $RESIDENT_SOCKET, else\n"
	    "                          $XDG_RUNTIME_DIR/resident/socket, else /tmp/resident-UID/socket;\n"
	    "                          started by systemd's socket activation, its socket instead)\n"
	    "      --group NAME        let this group use the socket (0660) for a shared daemon\n"
	    "      --db PATH           database (default $XDG_DATA_HOME/resident/resident.db)\n"
	    "  -c, --config FILE       JSON settings (default $XDG_CONFIG_HOME/resident/residentd.json)\n"
	    "      --device cpu|cuda   backend (default: cuda when built with it and a GPU is present)\n"
	    "  -t, --threads N         CPU threads (default: all cores; all but two for the layers a\n"
	    "                          model larger than the GPU keeps in host memory)\n"
	    "      --exact             float activations in every product (slower; the\n"
	    "                          reference numerics) instead of 8-bit ones (CPU) or\n"
	    "                          fp16 ones and an fp16 KV cache (CUDA: twice the KV memory)\n"
	    "      --device-fault reload|cpu  after a GPU fault, load the model again on the GPU\n"
	    "                          (default) or on the CPU\n"
	    "      --device-memory M   memory the loaded models may take on the device, weights and KV\n"
	    "                          caches together: GPU memory (cuda) or RAM (cpu); a size (12G)\n"
	    "                          or a fraction of what is free at start (default 0.9)\n"
	    "      --keep-alive T      how long a model stays loaded unused: 30s, 5m (default), 2h,\n"
	    "                          0 (unload at once), -1 (until its memory is needed)\n"
	    "      --ctx N             context length (default: the model's, at most 8192)\n"
	    "      --kv-tokens N       KV cache size in tokens (default: 4 x context)\n"
	    "      --kv-type f16|q8_0  how the KV cache holds keys and values: floats (default;\n"
	    "                          fp16 on the GPU, fp32 on the CPU) or 8 bits and a scale\n"
	    "                          for each 32 (q8_0: 1.8 times the context of fp16 in the\n"
	    "                          same memory, 3.6 times fp32's)\n"
	    "      --kv-share-users    one prefix cache for all users (lets a user time\n"
	    "                          another's prompts; default: one per user)\n"
	    "      --kv-host SIZE      host memory for KV blocks the device gives up (default 4G)\n"
	    "      --kv-disk SIZE      disk space for sessions' KV, next to the database in kv/\n"
	    "                          (default 16G; 0: none); it leaves the last 64 MiB\n"
	    "                          of that filesystem to the database; one daemon at\n"
	    "                          a time stores there (kv/lock)\n"
	    "      --max-seqs N        sequences decoding together (default 64)\n"
	    "      --max-queue N       waiting requests before 'overloaded' (default 256)\n"
	    "      --max-sessions N    sessions one user may keep (default 10000)\n"
	    "      --max-frame BYTES   largest request frame (default 16 MiB)\n"
	    "      --max-clients N     connections at once; one more is told 'overloaded' (default 1024)\n"
	    "      --frame-timeout S   seconds a request frame may take from its first bytes to its\n"
	    "                          last before its connection is closed (default 60)\n"
	    "  -l, --log-level LEVEL   error, warn, info (default), debug\n"
	    "  -h, --help\n");
}

/* Descriptors kept for the daemon's own files (database, KV files, model) beside its clients'. */
#define FD_RESERVE 64

/*
 * Raises the soft limit on descriptors to what max_clients connections and
 * the daemon's own files need, so that a client over the limit is told so
 * rather than the daemon running out of descriptors (for its database, too).
 * Returns max_clients, lowered if the hard limit is below that.
 */
static int
fit_fd_limit(int max_clients)
{
	struct rlimit rl;
	rlim_t want = (rlim_t)max_clients + FD_RESERVE;
	int n;

	if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= want)
		return max_clients;
	rl.rlim_cur = rl.rlim_max != RLIM_INFINITY && rl.rlim_max < want ? rl.rlim_max : want;
	if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
		getrlimit(RLIMIT_NOFILE, &rl);
	if (rl.rlim_cur >= want)
		return max_clients;
	n = MIN(max_clients, rl.rlim_cur > FD_RESERVE + 1 ? (int)(rl.rlim_cur - FD_RESERVE) : 1);
	log_warn("%llu descriptors at most: --max-clients %d lowered to %d", (unsigned long long)rl.rlim_cur,
	    max_clients, n);
	return n;
}

/* $VAR/rest, or $HOME/fallback/rest. */
static char *
xdg_path(const char *var, const char *fallback, const char *rest)
{
	const char *base = getenv(var), *home = getenv("HOME");
	char buf[PATH_MAX];

	if (base != NULL && base[0] == '/')
		snprintf(buf, sizeof buf, "%s/%s", base, rest);
	else
		snprintf(buf, sizeof buf, "%s/%s/%s", home ? home : "/tmp", fallback, rest);
	return xstrdup(buf);
}

/*
 * The model named by -m: an existing file or directory, made absolute so
 * that it reads the same whatever directory a client asks from.
 */
static int
resolve_model(char **model, char *err)
{
	char cwd[PATH_MAX], *abs;

	if ((abs = realpath(*model, NULL)) != NULL) {
		free(*model);
		*model = abs;
		return 0;
	}
	if ((*model)[0] == '/' || getcwd(cwd, sizeof cwd) == NULL)
		return err_set(err, ERR_NOTFOUND, "model %s: %s", *model, strerror(errno));
	return err_set(err, ERR_NOTFOUND, "model %s: %s (looked for %s/%s)", *model, strerror(errno), cwd,
	    *model);
}

/*
 * The config file's object, and the keys the cfg_* readers asked it for.
 * What is left over is a key residentd does not know (a typo such as
 * "kv_hosts"): the keys known are the keys read, so there is no second
 * list of them to fall out of step with read_config.
 */
struct config {
	json_t *obj, *read;
};

/* The value of key in the config, or NULL; notes key as known. */
static json_t *
cfg_get(struct config *cfg, const char *key)
{
	json_object_set_new(cfg->read, key, json_true());
	return json_object_get(cfg->obj, key);
}

/*
 * Warns about each key of the config that no cfg_* reader asked for.
 * Only a warning: a config that worked before (with a key of a later
 * version, or a note of the user's) keeps working.
 */
static void
cfg_warn_unknown(const struct config *cfg, const char *path)
{
	const char *key;
	json_t *v;

	json_object_foreach(cfg->obj, key, v)
		if (json_object_get(cfg->read, key) == NULL)
			log_warn("%s: unknown key '%s' ignored", path, key);
}

/* Sets *dst from a string field of the config unless a flag already did. */
static int
cfg_str(struct config *cfg, const char *key, char **dst, char *err)
{
	json_t *v = cfg_get(cfg, key);

	if (v == NULL || *dst != NULL)
		return 0;
	if (!json_is_string(v))
		return err_set(err, ERR_INVAL, "config: %s must be a string", key);
	*dst = xstrdup(json_string_value(v));
	return 0;
}

static int
cfg_bool(struct config *cfg, const char *key, int *dst, char *err)
{
	json_t *v = cfg_get(cfg, key);

	if (v == NULL || *dst != 0)
		return 0;
	if (!json_is_boolean(v))
		return err_set(err, ERR_INVAL, "config: %s must be true or false", key);
	*dst = json_is_true(v);
	return 0;
}

/* Sets *dst from an integer field of the config, 0 .. max, unless a flag already did. */
static int
cfg_long(struct config *cfg, const char *key, long max, long *dst, char *err)
{
	json_t *v = cfg_get(cfg, key);

	if (v == NULL || *dst != 0)
		return 0;
	if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > max)
		return err_set(err, ERR_INVAL, "config: %s must be a non-negative integer", key);
	*dst = (long)json_integer_value(v);
	return 0;
}

static int
cfg_int(struct config *cfg, const char *key, int *dst, char *err)
{
	long v = *dst;
	int rc = cfg_long(cfg, key, INT_MAX, &v, err);

	*dst = (int)v;
	return rc;
}

/* Adds the pair model, draft to s's drafts. */
static void
add_draft(struct settings *s, const char *model, size_t model_len, const char *draft)
{
	s->drafts = xrealloc(s->drafts, (size_t)(s->n_drafts + 1) * 2 * sizeof *s->drafts);
	s->drafts[2 * s->n_drafts] = xstrndup(model, model_len);
	s->drafts[2 * s->n_drafts + 1] = xstrdup(draft);
	s->n_drafts++;
}

/* --model-draft MODEL=PATH. */
static int
parse_model_draft(struct settings *s, const char *arg)
{
	const char *eq = strchr(arg, '=');

	if (eq == NULL || eq == arg || eq[1] == '\0') {
		fprintf(stderr, "residentd: --model-draft takes MODEL=PATH (a model and its draft), not '%s'\n", arg);
		return -1;
	}
	add_draft(s, arg, (size_t)(eq - arg), eq + 1);
	return 0;
}

/* The config's "model_drafts" (an object: a model's name or path to its draft's), unless flags gave some. */
static int
cfg_drafts(struct config *cfg, struct settings *s, char *err)
{
	json_t *v = cfg_get(cfg, "model_drafts"), *d;
	const char *model;

	if (v == NULL || s->n_drafts > 0)
		return 0;
	if (!json_is_object(v))
		return err_set(err, ERR_INVAL, "config: model_drafts must be an object of a model to its draft");
	json_object_foreach(v, model, d) {
		if (!json_is_string(d) || model[0] == '\0' || json_string_value(d)[0] == '\0')
			return err_set(err, ERR_INVAL, "config: model_drafts: '%s' must name a draft model's path", model);
		add_draft(s, model, strlen(model), json_string_value(d));
	}
	return 0;
}

/* Reads the config file; a missing default file is fine, a missing named one is not. */
static int
read_config(struct settings *s, char *err)
{
	char *path = s->config ? xstrdup(s->config) : xdg_path("XDG_CONFIG_HOME", ".config", "resident/residentd.json");
	json_error_t jerr;
	struct config c = { NULL, NULL }, *cfg = &c;
	int rc = 0;

	if (access(path, F_OK) != 0) {
		rc = s->config ? err_set(err, ERR_NOTFOUND, "%s: no such config file", path) : 0;
		free(path);
		return rc;
	}
	if ((c.obj = json_load_file(path, 0, &jerr)) == NULL || !json_is_object(c.obj)) {
		rc = err_set(err, ERR_FORMAT, "%s: line %d: %s", path, jerr.line, c.obj ? "not an object" : jerr.text);
		json_decref(c.obj);
		free(path);
		return rc;
	}
	if ((c.read = json_object()) == NULL) {
		rc = err_set(err, ERR_NOMEM, "%s: out of memory", path);
		json_decref(c.obj);
		free(path);
		return rc;
	}
	if ((rc = cfg_str(cfg, "socket", &s->socket_path, err)) || (rc = cfg_str(cfg, "db", &s->db_path, err)) ||
	    (rc = cfg_str(cfg, "model", &s->model, err)) || (rc = cfg_str(cfg, "device", &s->device, err)) ||
	    (rc = cfg_str(cfg, "group", &s->group, err)) || (rc = cfg_str(cfg, "log_level", &s->log_level, err)) ||
	    (rc = cfg_str(cfg, "device_fault", &s->device_fault, err)) ||
	    (rc = cfg_int(cfg, "threads", &s->threads, err)) || (rc = cfg_int(cfg, "ctx", &s->ctx, err)) ||
	    (rc = cfg_int(cfg, "kv_tokens", &s->kv_tokens, err)) || (rc = cfg_int(cfg, "max_seqs", &s->max_seqs, err)) ||
	    (rc = cfg_int(cfg, "max_queue", &s->max_queue, err)) || (rc = cfg_bool(cfg, "exact", &s->exact, err)) ||
	    (rc = cfg_int(cfg, "max_sessions", &s->max_sessions, err)) ||
	    (rc = cfg_int(cfg, "max_clients", &s->max_clients, err)) ||
	    (rc = cfg_int(cfg, "frame_timeout", &s->frame_timeout, err)) ||
	    (rc = cfg_long(cfg, "max_frame", LONG_MAX, &s->max_frame, err)) ||
	    (rc = cfg_bool(cfg, "kv_share_users", &s->kv_share_users, err)) ||
	    (rc = cfg_str(cfg, "kv_host", &s->kv_host, err)) || (rc = cfg_str(cfg, "kv_disk", &s->kv_disk, err)) ||
	    (rc = cfg_str(cfg, "kv_type", &s->kv_type_text, err)) ||
	    (rc = cfg_str(cfg, "device_memory", &s->device_memory, err)) ||
	    (rc = cfg_str(cfg, "keep_alive", &s->keep_alive, err)) || (rc = cfg_str(cfg, "draft", &s->draft, err)) ||
	    (rc = cfg_drafts(cfg, s, err)))
		err_prefix(err, rc, "%s", path);
	else
		cfg_warn_unknown(cfg, path);
	json_decref(c.read);
	json_decref(c.obj);
	free(path);
	return rc;
}

/* A string setting given again: the last one counts. */
static void
set_str(char **dst, const char *v)
{
	free(*dst);
	*dst = xstrdup(v);
}

/*
 * A numeric option's value: a whole decimal number, all of it ("12abc" or
 * "many" is refused, where atoi took them for 12 and 0, the default);
 * negative ones are left for finish_settings to refuse by name. -1, said on
 * stderr, for anything else.
 */
static int
opt_long(const char *opt, const char *arg, long max, long *out)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(arg, &end, 10);
	if (end == arg || *end != '\0' || errno != 0 || v > max || v < -max) {
		fprintf(stderr, "residentd: --%s wants a whole number, not '%s'\n", opt, arg);
		return -1;
	}
	*out = v;
	return 0;
}

static int
opt_int(const char *opt, const char *arg, int *out)
{
	long v;

	if (opt_long(opt, arg, INT_MAX, &v) != 0)
		return -1;
	*out = (int)v;
	return 0;
}

/* 0; 1 where --help printed the usage; -1 on a bad argument (the usage, or what is wrong, printed to stderr). */
static int
parse_args(int argc, char **argv, struct settings *s)
{
	enum { O_GROUP = 256, O_DB, O_DEVICE, O_CTX, O_KV, O_SEQS, O_QUEUE, O_FRAME, O_EXACT, O_SESSIONS, O_FAULT,
		O_SHARE, O_KV_HOST, O_KV_DISK, O_DEVMEM, O_KEEP, O_CLIENTS, O_FRAME_TIMEOUT, O_DRAFT, O_MODEL_DRAFT, O_KV_TYPE };
	static const struct option lo[] = {
		{ "model", required_argument, NULL, 'm' }, { "socket", required_argument, NULL, 's' },
		{ "group", required_argument, NULL, O_GROUP }, { "db", required_argument, NULL, O_DB },
		{ "config", required_argument, NULL, 'c' }, { "device", required_argument, NULL, O_DEVICE },
		{ "threads", required_argument, NULL, 't' }, { "ctx", required_argument, NULL, O_CTX },
		{ "kv-tokens", required_argument, NULL, O_KV }, { "max-seqs", required_argument, NULL, O_SEQS },
		{ "max-queue", required_argument, NULL, O_QUEUE }, { "max-frame", required_argument, NULL, O_FRAME },
		{ "exact", no_argument, NULL, O_EXACT }, { "log-level", required_argument, NULL, 'l' },
		{ "help", no_argument, NULL, 'h' }, { "max-sessions", required_argument, NULL, O_SESSIONS },
		{ "device-fault", required_argument, NULL, O_FAULT },
		{ "kv-share-users", no_argument, NULL, O_SHARE }, { "kv-host", required_argument, NULL, O_KV_HOST },
		{ "kv-disk", required_argument, NULL, O_KV_DISK }, { "kv-type", required_argument, NULL, O_KV_TYPE },
		{ "device-memory", required_argument, NULL, O_DEVMEM },
		{ "keep-alive", required_argument, NULL, O_KEEP },
		{ "max-clients", required_argument, NULL, O_CLIENTS },
		{ "frame-timeout", required_argument, NULL, O_FRAME_TIMEOUT },
		{ "draft", required_argument, NULL, O_DRAFT },
		{ "model-draft", required_argument, NULL, O_MODEL_DRAFT },
		{ NULL, 0, NULL, 0 },
	};
	int c, bad = 0;

	while ((c = getopt_long(argc, argv, "m:s:c:t:l:h", lo, NULL)) != -1) {
		switch (c) {
		case 'm': set_str(&s->model, optarg); break;
		case 's': set_str(&s->socket_path, optarg); break;
		case 'c': set_str(&s->config, optarg); break;
		case 't': bad = opt_int("threads", optarg, &s->threads); break;
		case 'l': set_str(&s->log_level, optarg); break;
		case O_GROUP: set_str(&s->group, optarg); break;
		case O_DB: set_str(&s->db_path, optarg); break;
		case O_DEVICE: set_str(&s->device, optarg); break;
		case O_CTX: bad = opt_int("ctx", optarg, &s->ctx); break;
		case O_KV: bad = opt_int("kv-tokens", optarg, &s->kv_tokens); break;
		case O_SEQS: bad = opt_int("max-seqs", optarg, &s->max_seqs); break;
		case O_QUEUE: bad = opt_int("max-queue", optarg, &s->max_queue); break;
		case O_FRAME: bad = opt_long("max-frame", optarg, LONG_MAX, &s->max_frame); break;
		case O_EXACT: s->exact = 1; break;
		case O_SESSIONS: bad = opt_int("max-sessions", optarg, &s->max_sessions); break;
		case O_FAULT: set_str(&s->device_fault, optarg); break;
		case O_SHARE: s->kv_share_users = 1; break;
		case O_KV_HOST: set_str(&s->kv_host, optarg); break;
		case O_KV_DISK: set_str(&s->kv_disk, optarg); break;
		case O_KV_TYPE: set_str(&s->kv_type_text, optarg); break;
		case O_DEVMEM: set_str(&s->device_memory, optarg); break;
		case O_KEEP: set_str(&s->keep_alive, optarg); break;
		case O_CLIENTS: bad = opt_int("max-clients", optarg, &s->max_clients); break;
		case O_FRAME_TIMEOUT: bad = opt_int("frame-timeout", optarg, &s->frame_timeout); break;
		case O_DRAFT: set_str(&s->draft, optarg); break;
		case O_MODEL_DRAFT:
			if (parse_model_draft(s, optarg) != 0)
				return -1;
			break;
		case 'h': usage(stdout); return 1;
		default: usage(stderr); return -1;
		}
		if (bad)
			return -1;
	}
	if (optind != argc) {
		usage(stderr);
		return -1;
	}
	return 0;
}

/*
 * A size in bytes: a number with an optional fraction and an optional
 * K, M, G or T (powers of 1024), as "4G", "1.5G", "512M", "1048576".
 */
static int
parse_size(const char *text, const char *what, uint64_t *out, char *err)
{
	static const char units[] = "KMGT";
	const char *u;
	char *end;
	double v;

	errno = 0;
	v = strtod(text, &end);
	if (end != text && *end != '\0' && (u = strchr(units, *end)) != NULL && end[1] == '\0') {
		v *= (double)(1ull << (10 * (u - units + 1)));
		end++;
	}
	if (end == text || *end != '\0' || errno != 0 || !(v >= 0) || v > 1e18 || text[0] == '-')
		return err_set(err, ERR_INVAL, "%s: '%s' is not a size (bytes, or a number with K, M, G or T)",
		    what, text);
	*out = (uint64_t)v;
	return 0;
}

/*
 * The device memory budget: a size, or a fraction (a number up to 1) of
 * the device's free memory now.
 */
static int
device_budget(const struct settings *s, uint64_t *out, char *err)
{
	const char *text = s->device_memory ? s->device_memory : "0.9";
	uint64_t free_b, total;
	char *end;
	double f = strtod(text, &end);
	int rc;

	if (end != text && *end == '\0' && f <= 1) {
		if (!(f > 0))
			return err_set(err, ERR_INVAL, "--device-memory: a fraction must be more than 0");
		if ((rc = engine_device_memory(s->device, &free_b, &total, err)) != 0)
			return err_prefix(err, rc, "--device-memory");
		*out = (uint64_t)(f * (double)free_b);
		log_info("device memory budget %.1f GiB: %.2f of %.1f GiB free (of %.1f GiB)", *out / 1073741824.0, f,
		    free_b / 1073741824.0, total / 1073741824.0);
		return 0;
	}
	return parse_size(text, "--device-memory", out, err);
}

/* A duration: seconds, or a number with s, m or h; negative: forever. */
static int
parse_duration(const char *text, double *out, char *err)
{
	char *end;
	double v = strtod(text, &end);

	if (end != text && (*end == 's' || *end == 'm' || *end == 'h') && end[1] == '\0')
		v *= *end == 'h' ? 3600 : *end == 'm' ? 60 : 1, end++;
	if (end == text || *end != '\0' || !isfinite(v))
		return err_set(err, ERR_INVAL, "--keep-alive: '%s' is not a duration (30s, 5m, 2h, 0, -1)", text);
	*out = v < 0 ? -1 : v;
	return 0;
}

/* The kv/ directory next to the database. */
static char *
kv_dir_of(const char *db)
{
	const char *slash = strrchr(db, '/');
	char buf[PATH_MAX];

	if (slash == NULL)
		return xstrdup("kv");
	snprintf(buf, sizeof buf, "%.*s/kv", (int)(slash - db), db);
	return xstrdup(buf);
}

/* Fills what neither flags nor config set; checks the values. */
static int
finish_settings(struct settings *s, gid_t *gid, enum sched_fault_policy *fault, char *err)
{
	const struct backend_ops *ops;
	struct group *g;
	char buf[PATH_MAX];
	int lvl, has_default = rs_default_socket(buf, sizeof buf) == 0;

	if (s->socket_path == NULL) {
		if (!has_default)
			return err_set(err, ERR_INVAL, "the default socket path is too long; give one with -s");
		s->socket_path = xstrdup(buf);
	}
	/* the default path given with -s (libresident starts residentd so) gets the default's checks too */
	s->socket_private = has_default && strcmp(s->socket_path, buf) == 0;
	if ((s->model != NULL && resolve_model(&s->model, err) != 0) ||
	    (s->draft != NULL && resolve_model(&s->draft, err) != 0))
		return ERR_NOTFOUND;
	if (s->draft != NULL && s->model == NULL)
		return err_set(err, ERR_INVAL, "--draft guesses for the default model: give it with -m too");
	for (int i = 0; i < s->n_drafts; i++)
		if (resolve_model(&s->drafts[2 * i + 1], err) != 0)
			return err_prefix(err, ERR_NOTFOUND, "--model-draft %s", s->drafts[2 * i]);
	if (s->draft != NULL) /* the default model's --model-draft, given last: a later pair replaces an earlier */
		add_draft(s, s->model, strlen(s->model), s->draft);
	if (s->db_path == NULL)
		s->db_path = xdg_path("XDG_DATA_HOME", ".local/share", "resident/resident.db");
	s->kv_dir = kv_dir_of(s->db_path);
	/* before --device-memory, whose fraction asks the device, so that a bad name is said as --device's */
	if (engine_pick_backend(s->device, &ops, err) != 0)
		return err_prefix(err, ERR_INVAL, "--device");
	if (parse_size(s->kv_host ? s->kv_host : "4G", "--kv-host", &s->kv_host_bytes, err) != 0 ||
	    parse_size(s->kv_disk ? s->kv_disk : "16G", "--kv-disk", &s->kv_disk_bytes, err) != 0 ||
	    parse_duration(s->keep_alive ? s->keep_alive : "5m", &s->keep_alive_s, err) != 0 ||
	    device_budget(s, &s->device_bytes, err) != 0)
		return ERR_INVAL;
	if (kv_type_parse(s->kv_type_text ? s->kv_type_text : "f16", &s->kv_type, err) != 0)
		return err_prefix(err, ERR_INVAL, "--kv-type");
	if (s->max_frame == 0)
		s->max_frame = PROTO_MAX_FRAME_DEFAULT;
	if (s->max_frame < 64 || s->max_frame > (1L << 30))
		return err_set(err, ERR_INVAL, "--max-frame must be between 64 bytes and 1 GiB");
	if (s->threads < 0 || s->ctx < 0 || s->kv_tokens < 0 || s->max_seqs < 0 || s->max_queue < 0 ||
	    s->max_sessions < 0 || s->max_clients < 0 || s->frame_timeout < 0)
		return err_set(err, ERR_INVAL, "numeric settings must not be negative");
	if (s->max_clients == 0)
		s->max_clients = SERVER_MAX_CLIENTS_DEFAULT;
	if (s->frame_timeout == 0)
		s->frame_timeout = SERVER_FRAME_TIMEOUT_DEFAULT;
	*fault = SCHED_FAULT_RELOAD;
	if (s->device_fault != NULL && strcmp(s->device_fault, "cpu") == 0)
		*fault = SCHED_FAULT_CPU;
	else if (s->device_fault != NULL && strcmp(s->device_fault, "reload") != 0)
		return err_set(err, ERR_INVAL, "--device-fault must be reload or cpu");
	*gid = (gid_t)-1;
	if (s->group != NULL) {
		if ((g = getgrnam(s->group)) == NULL)
			return err_set(err, ERR_NOTFOUND, "no group named %s", s->group);
		*gid = g->gr_gid;
	}
	if (s->log_level != NULL) {
		if ((lvl = log_level_from_name(s->log_level)) < 0)
			return err_set(err, ERR_INVAL, "unknown log level %s", s->log_level);
		log_set_level((enum log_level)lvl);
	}
	return 0;
}

static void
stop_cb(evutil_socket_t sig, short what, void *arg)
{
	log_info("signal %d: stopping", (int)sig);
	event_base_loopbreak(arg);
}

/* After a stop was asked: cancel what runs, deliver the last replies, flush. */
static void
drain(struct event_base *base, struct server *srv, struct sched *sc)
{
	uint64_t deadline = now_ns() + 3000000000ull;

	server_shutdown(srv);
	sched_stop_thread(sc);
	server_deliver(srv);
	while (server_flushing(srv) && now_ns() < deadline)
		event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
}

int
main(int argc, char **argv)
{
	struct settings s = { 0 };
	struct event_base *base = NULL;
	struct event *sigterm = NULL, *sigint = NULL;
	struct store *st = NULL;
	struct server *srv = NULL;
	struct sched *sc = NULL;
	struct sched_opts so;
	struct server_opts vo = { 0 };
	enum sched_fault_policy fault;
	char err[ERR_LEN];
	int rc = 1, parsed;

	signal(SIGPIPE, SIG_IGN);
	/* over a file size limit (RLIMIT_FSIZE), a write fails with EFBIG: the
	 * database reports it (storage_full), instead of the signal killing us */
	signal(SIGXFSZ, SIG_IGN);
	/*
	 * A fixed threshold: glibc otherwise raises it to the size of the
	 * largest block freed (up to 32 MiB), after which a large request's
	 * buffers come from the heap and stay there. tests/e2e/test_limits.py's
	 * bursts of large requests (2026-11-22, the 2-core development VM):
	 * RSS 7.0 -> 43.4 MB and staying without this, 7.0 -> 8.1 MB with it.
	 */
	mallopt(M_MMAP_THRESHOLD, 128 << 10);
	if ((parsed = parse_args(argc, argv, &s)) != 0) {
		settings_free(&s);
		return parsed > 0 ? 0 : 2;
	}
	if (read_config(&s, err) != 0 || finish_settings(&s, &vo.group, &fault, err) != 0) {
		fprintf(stderr, "residentd: %s\n", err);
		settings_free(&s);
		return 2;
	}
	/* before anything opens a file: systemd's socket is fd 3 */
	if (server_activation(&vo.listen_fd, err) != 0) {
		log_error("%s", err);
		goto out;
	}
	evthread_use_pthreads();
	base = event_base_new();
	/* before the socket exists: a client may stop us as soon as it sees it */
	sigterm = evsignal_new(base, SIGTERM, stop_cb, base);
	sigint = evsignal_new(base, SIGINT, stop_cb, base);
	event_add(sigterm, NULL);
	event_add(sigint, NULL);
	vo.socket_path = s.socket_path;
	vo.private_dir = s.socket_private;
	vo.max_frame = (size_t)s.max_frame;
	vo.max_output = 8u << 20;
	vo.max_clients = fit_fd_limit(s.max_clients);
	vo.frame_timeout = s.frame_timeout;
	vo.default_model = s.model ? model_file_name(s.model) : NULL;
	so = (struct sched_opts){ s.model, s.device, s.threads, s.ctx, s.kv_tokens, s.max_step_tokens,
		s.max_seqs, s.max_queue, s.exact, fault, s.kv_share_users, s.kv_host_bytes, s.kv_dir,
		s.kv_disk_bytes, s.device_bytes, s.keep_alive_s, (const char *const *)s.drafts, s.n_drafts, s.kv_type };
	if (store_open(s.db_path, &st, err) == 0 && s.max_sessions > 0)
		store_set_max_sessions(st, s.max_sessions);
	if (st == NULL || server_start(base, &vo, st, &srv, err) != 0 ||
	    sched_start(&so, server_wake, srv, &sc, err) != 0) {
		log_error("%s", err);
		goto out;
	}
	server_set_sched(srv, sc);
	log_info("residentd %s listening on %s (database %s, model %s)", PACKAGE_VERSION, server_socket_path(srv),
	    s.db_path, s.model ? s.model : "none");
	event_base_dispatch(base);
	drain(base, srv, sc);
	rc = 0;
out:
	server_free(srv);
	if (sc != NULL)
		sched_stop(sc);
	store_close(st);
	if (sigterm)
		event_free(sigterm);
	if (sigint)
		event_free(sigint);
	if (base)
		event_base_free(base);
	free((char *)vo.default_model);
	settings_free(&s);
	log_info("stopped");
	return rc;
}
