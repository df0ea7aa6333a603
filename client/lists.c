/*
 * lists.c: `resident sessions`, `resident models` (and its short forms
 * `show` and `stop`), `resident status` and `resident ps`: one request
 * each, printed as a table or, with --json, as the daemon's result in JSON.
 */
#include "config.h"
#include "cli.h"

#include <getopt.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { O_JSON = 256, O_SOCKET, O_LIMIT, O_OFFSET };

/*
 * Parses the options every listing command takes. Afterwards the
 * positional arguments are argv[optind..argc). Returns 0 or EXIT_USAGE.
 */
static int
list_opts(struct cli *cli, int argc, char **argv, uint64_t *limit, uint64_t *offset)
{
	static const struct option lo[] = {
		{ "json", no_argument, NULL, O_JSON }, { "socket", required_argument, NULL, O_SOCKET },
		{ "limit", required_argument, NULL, O_LIMIT }, { "offset", required_argument, NULL, O_OFFSET },
		CLI_HELP_OPTION, { NULL, 0, NULL, 0 },
	};
	int c;

	optind = 0;
	while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		switch (c) {
		case O_JSON: cli->json = 1; break;
		case O_SOCKET: cli->socket = optarg; break;
		case O_LIMIT:
		case O_OFFSET:
			if (limit == NULL || cli_parse_uint(optarg, c == O_LIMIT ? limit : offset) != 0)
				return cli_usage_error("%s: bad --%s", argv[0], c == O_LIMIT ? "limit" : "offset");
			break;
		case 'h': return cli_help();
		default:
			return cli_usage_error("%s: unknown option", argv[0]);
		}
	}
	return 0;
}

/* A subcommand, with its arguments and how many it takes. */
struct subcmd {
	const char *name, *alias, *args;
	int min, max;
};

/* Checks the count n of a subcommand's arguments; `what` is the command line that ran it. */
static int
want_args(const struct subcmd *sub, int n, const char *what)
{
	if (n < sub->min || n > sub->max)
		return cli_usage_error("usage: resident %s%s%s", what, sub->args[0] ? " " : "", sub->args);
	return 0;
}

/* ---- sessions ---- */

/* Prints the sessions of a session.list result as a table. */
static void
print_sessions(const rs_value *list)
{
	struct table *t = table_new(6, "SESSION", "UPDATED", "TURNS", "TOKENS", "MODEL", "TITLE");
	char when[32], turns[24], tokens[24];
	size_t i;

	for (i = 0; i < rs_len(list); i++) {
		const rs_value *s = rs_at(list, i);

		snprintf(turns, sizeof turns, "%llu", (unsigned long long)rs_uint(rs_get(s, "turns")));
		snprintf(tokens, sizeof tokens, "%llu", (unsigned long long)rs_uint(rs_get(s, "tokens")));
		table_add(t, cli_str(s, "session"), cli_time(rs_uint(rs_get(s, "updated")), when), turns,
		    tokens, cli_str(s, "model"), cli_str(s, "title"));
	}
	table_print(t, stdout);
	table_free(t);
}

/* A turn's tool calls, one a line (NAME ARGUMENTS (ID)), and a tool result's call id. */
static void
print_turn_calls(const rs_value *turn)
{
	const rs_value *calls = rs_get(turn, "tool_calls"), *c;
	size_t k;

	for (k = 0; k < rs_len(calls); k++) {
		c = rs_at(calls, k);
		printf("tool call: %s %s (%s)\n", cli_str(c, "name"), cli_str(c, "arguments"), cli_str(c, "id"));
	}
	if (rs_get(turn, "tool_call_id") != NULL)
		printf("(the result of %s)\n", cli_str(turn, "tool_call_id"));
	if (rs_len(calls) > 0 || rs_get(turn, "tool_call_id") != NULL)
		putchar('\n');
}

void
cli_print_turns(const rs_value *turns, size_t last, int reasoning)
{
	size_t i, n = rs_len(turns), from = last && n > last ? n - last : 0;
	const char *text, *why;

	if (from > 0)
		printf("(%zu earlier turns)\n\n", from);
	for (i = from; i < n; i++) {
		text = cli_str(rs_at(turns, i), "content");
		why = rs_reply_reasoning(rs_at(turns, i));
		printf("%s: ", cli_str(rs_at(turns, i), "role"));
		if (reasoning && why[0] != '\0') {
			cli_reasoning_style(1);
			fputs(why, stdout);
			cli_reasoning_style(0);
			fputs(why[strlen(why) - 1] == '\n' ? "\n" : "\n\n", stdout);
		}
		printf("%s%s\n", text, text[0] && text[strlen(text) - 1] == '\n' ? "" : "\n");
		print_turn_calls(rs_at(turns, i));
	}
	fflush(stdout);
}

/* A session.get result: the session's fields, then its turns. */
static void
print_session(const rs_value *r)
{
	const rs_value *s = rs_get(r, "session");
	char a[32], b[32];

	printf("session  %s\n", cli_str(s, "session"));
	printf("title    %s\n", cli_str(s, "title"));
	printf("model    %s\n", cli_str(s, "model"));
	if (cli_str(s, "system")[0])
		printf("system   %s\n", cli_str(s, "system"));
	printf("created  %s\n", cli_time(rs_uint(rs_get(s, "created")), a));
	printf("updated  %s\n", cli_time(rs_uint(rs_get(s, "updated")), b));
	printf("tokens   %llu in %llu turns\n\n", (unsigned long long)rs_uint(rs_get(s, "tokens")),
	    (unsigned long long)rs_uint(rs_get(s, "turns")));
	cli_print_turns(rs_get(r, "turns"), 0, 1);
}

/* The subcommands of `sessions` and `models`. */
static const struct subcmd session_subs[] = {
	{ "list", "ls", "[--limit N] [--offset N]", 0, 0 },
	{ "show", NULL, "UUID", 1, 1 },
	{ "rm", "delete", "UUID", 1, 1 },
	{ "rename", NULL, "UUID TITLE", 2, 2 },
	{ "fork", NULL, "UUID [TITLE]", 1, 2 },
}, model_subs[] = {
	{ "list", "ls", "", 0, 0 },
	{ "load", NULL, "NAME_OR_PATH", 1, 1 },
	{ "unload", NULL, "NAME_OR_PATH", 1, 1 },
	{ "show", NULL, "NAME_OR_PATH", 1, 1 },
};
enum { MODEL_LIST, MODEL_LOAD, MODEL_UNLOAD, MODEL_SHOW };

/*
 * Finds the subcommand at argv[optind] and checks its arguments. Returns
 * it, or NULL after printing a usage error.
 */
static const struct subcmd *
find_sub(const struct subcmd *subs, size_t n, int argc, char **argv)
{
	const char *name = optind < argc ? argv[optind] : NULL;
	char what[64];
	size_t i;

	for (i = 0; name != NULL && i < n; i++) {
		if (strcmp(name, subs[i].name) != 0 && (subs[i].alias == NULL || strcmp(name, subs[i].alias) != 0))
			continue;
		snprintf(what, sizeof what, "%s %s", argv[0], subs[i].name);
		if (want_args(&subs[i], argc - optind - 1, what) != 0)
			return NULL;
		return &subs[i];
	}
	if (name == NULL)
		cli_usage_error("usage: resident %s COMMAND ...", argv[0]);
	else
		cli_usage_error("%s: unknown command '%s'", argv[0], name);
	return NULL;
}

int
cmd_sessions(struct cli *cli, int argc, char **argv)
{
	const struct subcmd *sub;
	uint64_t limit = 0, offset = 0;
	const char *uuid;
	rs_value *out = NULL;
	rs_status st;
	int rc;

	if ((rc = list_opts(cli, argc, argv, &limit, &offset)) != 0)
		return rc;
	if ((sub = find_sub(session_subs, sizeof session_subs / sizeof *session_subs, argc, argv)) == NULL)
		return EXIT_USAGE;
	if (limit > 1000 || offset > INT32_MAX)
		return cli_usage_error("sessions: --limit is at most 1000, --offset at most %d", INT32_MAX);
	if ((rc = cli_connect(cli)) != EXIT_OK)
		return rc;

	uuid = argv[optind + 1];
	switch (sub - session_subs) {
	case 0: st = rs_session_list(cli->c, (unsigned)limit, (unsigned)offset, &out); break;
	case 1: st = rs_session_get(cli->c, uuid, &out); break;
	case 2: st = rs_session_delete(cli->c, uuid); break;
	case 3: st = rs_session_rename(cli->c, uuid, argv[optind + 2], &out); break;
	default: st = rs_session_fork(cli->c, uuid, optind + 2 < argc ? argv[optind + 2] : NULL, &out); break;
	}
	if (st != RS_OK)
		return cli_fail(cli, st, sub->name);

	if (cli->json) {
		out ? cli_print_json(out) : cli_print_json_new(json_object());
	} else {
		switch (sub - session_subs) {
		case 0: print_sessions(rs_get(out, "sessions")); break;
		case 1: print_session(out); break;
		case 3:
			printf("%s  %s\n", cli_str(rs_get(out, "session"), "session"),
			    cli_str(rs_get(out, "session"), "title"));
			break;
		case 4: printf("%s\n", cli_str(rs_get(out, "session"), "session")); break;
		}
	}
	rs_value_free(out);
	return EXIT_OK;
}

/* ---- models ---- */

static void
print_models(const rs_value *list)
{
	struct table *t = table_new(7, "NAME", "LOADED", "DEFAULT", "DEVICE", "ARCH", "SIZE", "PATH");
	char size[32];
	size_t i;

	for (i = 0; i < rs_len(list); i++) {
		const rs_value *m = rs_at(list, i);

		table_add(t, cli_str(m, "name"), rs_bool(rs_get(m, "loaded")) ? "yes" : "no",
		    rs_bool(rs_get(m, "default")) ? "*" : "", cli_str(m, "device")[0] ? cli_str(m, "device") : "-",
		    cli_str(m, "arch")[0] ? cli_str(m, "arch") : "-",
		    rs_get(m, "size") ? cli_size(rs_uint(rs_get(m, "size")), size) : "-", cli_str(m, "path"));
	}
	table_print(t, stdout);
	table_free(t);
}

/* What the progress bar needs between replies. */
struct bar {
	const char *name;
	int shown;
};

/* Draws "loading NAME [#####-----]  45%  12.0 MiB / 27.0 MiB" on stderr. */
static void
draw_bar(struct bar *b, uint64_t done, uint64_t total)
{
	char d[32], t[32], cells[31];
	int pct = total ? (int)(done * 100 / total) : 0, i, fill = pct * 30 / 100;

	for (i = 0; i < 30; i++)
		cells[i] = i < fill ? '#' : '-';
	cells[30] = '\0';
	fprintf(stderr, "\rloading %s [%s] %3d%%  %s / %s ", b->name, cells, pct, cli_size(done, d),
	    cli_size(total, t));
	b->shown = 1;
}

static void
progress_cb(uint64_t done, uint64_t total, void *user)
{
	struct bar *b = user;

	if (b != NULL)
		draw_bar(b, done > total ? total : done, total);
}

/* A count in thousands, millions, billions: "1.7M", "268.1M", "8.0B". */
static const char *
count_text(uint64_t n, char *buf, size_t len)
{
	if (n >= 1000000000)
		snprintf(buf, len, "%.1fB", (double)n / 1e9);
	else if (n >= 1000000)
		snprintf(buf, len, "%.1fM", (double)n / 1e6);
	else if (n >= 1000)
		snprintf(buf, len, "%.1fK", (double)n / 1e3);
	else
		snprintf(buf, len, "%llu", (unsigned long long)n);
	return buf;
}

/* A model.show result, one field a line. */
static void
print_model_info(const rs_value *m)
{
	const rs_value *types = rs_get(m, "tensor_types");
	char a[32], w[32];
	size_t i;

	printf("name          %s%s\n", cli_str(m, "name"), rs_bool(rs_get(m, "default")) ? " (the default model)" : "");
	printf("path          %s\n", cli_str(m, "path"));
	printf("family        %s (%s)\n", cli_str(m, "arch"), cli_str(m, "format"));
	printf("parameters    %s\n", count_text(rs_uint(rs_get(m, "parameters")), a, sizeof a));
	printf("quantization  %s (", cli_str(m, "quantization"));
	for (i = 0; i < rs_len(types); i++)
		printf("%s%s: %llu tensors, %s", i ? "; " : "", cli_str(rs_at(types, i), "type"),
		    (unsigned long long)rs_uint(rs_get(rs_at(types, i), "tensors")),
		    cli_size(rs_uint(rs_get(rs_at(types, i), "bytes")), a));
	printf(")\nweights       %s\n", cli_size(rs_uint(rs_get(m, "size")), a));
	printf("layers        %llu, embedding %llu, feed-forward %llu\n", (unsigned long long)rs_uint(rs_get(m, "layers")),
	    (unsigned long long)rs_uint(rs_get(m, "embedding")), (unsigned long long)rs_uint(rs_get(m, "feed_forward")));
	printf("attention     %llu heads, %llu KV heads, head size %llu", (unsigned long long)rs_uint(rs_get(m, "heads")),
	    (unsigned long long)rs_uint(rs_get(m, "kv_heads")), (unsigned long long)rs_uint(rs_get(m, "head_dim")));
	if (rs_uint(rs_get(m, "sliding_window")) > 0)
		printf("; sliding window of %llu tokens", (unsigned long long)rs_uint(rs_get(m, "sliding_window")));
	printf("\nvocabulary    %llu tokens\n", (unsigned long long)rs_uint(rs_get(m, "vocab")));
	printf("context       %llu tokens (trained for %llu)\n", (unsigned long long)rs_uint(rs_get(m, "context")),
	    (unsigned long long)rs_uint(rs_get(m, "context_train")));
	if (cli_str(m, "template_error")[0])
		printf("template      none usable: %s\n", cli_str(m, "template_error"));
	else if (strcmp(cli_str(m, "template"), "raw") == 0)
		printf("template      none (raw prompts only)\n");
	else
		printf("template      %s\n", cli_str(m, "template"));
	if (cli_str(m, "pooling")[0])
		printf("embeddings    %llu floats, %s pooling%s\n", (unsigned long long)rs_uint(rs_get(m, "dimensions")),
		    cli_str(m, "pooling"), rs_bool(rs_get(m, "bidirectional")) ? ", bidirectional attention (no text)" : "");
	if (rs_bool(rs_get(m, "loaded")))
		printf("loaded        on %s, holding %s\n", cli_str(m, "device"), cli_size(rs_uint(rs_get(m, "memory_bytes")), a));
	else
		printf("loaded        no (loading takes %s at least)\n", cli_size(rs_uint(rs_get(m, "need_bytes")), a));
	if (rs_uint(rs_get(m, "host_layers")) > 0)
		printf("host memory   %s: the feed-forward of %llu of %llu layers, computed there (all on the device takes %s)\n",
		    cli_size(rs_uint(rs_get(m, "host_bytes")), a), (unsigned long long)rs_uint(rs_get(m, "host_layers")),
		    (unsigned long long)rs_uint(rs_get(m, "layers")), cli_size(rs_uint(rs_get(m, "whole_bytes")), w));
	if (rs_uint(rs_get(m, "hot_experts")) > 0)
		printf("hot experts   %llu of each host layer also on the device, the most chosen\n",
		    (unsigned long long)rs_uint(rs_get(m, "hot_experts")));
}

/* A model.unload result: what was unloaded, and the requests that ended. */
static void
print_unloaded(const rs_value *r)
{
	const char *name = cli_str(rs_get(r, "model"), "name");
	uint64_t n = rs_uint(rs_get(r, "cancelled"));

	if (!rs_bool(rs_get(r, "unloaded")))
		printf("%s is not loaded\n", name);
	else if (n > 0)
		printf("unloaded %s; %llu running request%s cancelled\n", name, (unsigned long long)n,
		    n == 1 ? " was" : "s were");
	else
		printf("unloaded %s\n", name);
}

/* Runs a subcommand of `models` on its argument (NULL for list); `what` names it in errors. */
static int
model_cmd(struct cli *cli, const struct subcmd *sub, const char *arg, const char *what)
{
	struct bar bar = { 0 };
	rs_value *out = NULL;
	const rs_value *m;
	rs_status st;
	char size[32], path[PATH_MAX];
	int rc;

	if ((rc = cli_connect(cli)) != EXIT_OK)
		return rc;
	if (arg != NULL)
		arg = cli_model_arg(arg, path);
	switch (sub - model_subs) {
	case MODEL_LIST:
		st = rs_model_list(cli->c, &out);
		break;
	case MODEL_LOAD:
		bar.name = arg;
		st = rs_model_load(cli->c, arg, progress_cb, isatty(2) ? &bar : NULL, &out);
		if (bar.shown && st == RS_OK) {     /* the bar ends full */
			m = rs_get(out, "model");
			draw_bar(&bar, rs_uint(rs_get(m, "size")), rs_uint(rs_get(m, "size")));
		}
		if (bar.shown)
			fputc('\n', stderr);
		break;
	case MODEL_UNLOAD:
		st = rs_model_unload(cli->c, arg, &out);
		break;
	default:
		st = rs_model_show(cli->c, arg, &out);
		break;
	}
	if (st != RS_OK)
		return cli_fail(cli, st, what);

	if (cli->json) {
		cli_print_json(out);
	} else {
		switch (sub - model_subs) {
		case MODEL_LIST: print_models(rs_get(out, "models")); break;
		case MODEL_LOAD:
			m = rs_get(out, "model");
			printf("loaded %s (%s, %s, %s)\n", cli_str(m, "name"), cli_str(m, "arch"),
			    cli_size(rs_uint(rs_get(m, "size")), size), cli_str(m, "device"));
			break;
		case MODEL_UNLOAD: print_unloaded(out); break;
		default: print_model_info(rs_get(out, "model")); break;
		}
	}
	rs_value_free(out);
	return EXIT_OK;
}

int
cmd_models(struct cli *cli, int argc, char **argv)
{
	const struct subcmd *sub;
	int rc;

	if ((rc = list_opts(cli, argc, argv, NULL, NULL)) != 0)
		return rc;
	if ((sub = find_sub(model_subs, sizeof model_subs / sizeof *model_subs, argc, argv)) == NULL)
		return EXIT_USAGE;
	return model_cmd(cli, sub, optind + 1 < argc ? argv[optind + 1] : NULL, sub->name);
}

/* `resident show` and `resident stop`: `models show` and `models unload` without the `models`. */
static int
model_short(struct cli *cli, int argc, char **argv, const struct subcmd *sub)
{
	int rc;

	if ((rc = list_opts(cli, argc, argv, NULL, NULL)) != 0)
		return rc;
	if ((rc = want_args(sub, argc - optind, argv[0])) != 0)
		return rc;
	return model_cmd(cli, sub, argv[optind], argv[0]);
}

int
cmd_show(struct cli *cli, int argc, char **argv)
{
	return model_short(cli, argc, argv, &model_subs[MODEL_SHOW]);
}

int
cmd_stop(struct cli *cli, int argc, char **argv)
{
	return model_short(cli, argc, argv, &model_subs[MODEL_UNLOAD]);
}

/* ---- status ---- */

/* "5m 00s", "until needed" (negative), and what is left of it while the loaded model is unused. */
static const char *
keep_alive_text(const rs_value *m, char *buf, size_t len)
{
	double keep = rs_float(rs_get(m, "keep_alive_s")), left = rs_float(rs_get(m, "expires_in_s"));
	char a[32], b[32];

	if (keep < 0)
		snprintf(buf, len, "until needed");
	else if (left >= 0)
		snprintf(buf, len, "%s (%s left)", cli_duration(keep, a), cli_duration(left, b));
	else
		snprintf(buf, len, "%s", cli_duration(keep, a));
	return buf;
}

/* "1536 / 24", and where hits came from besides the device. */
static const char *
cache_text(const rs_value *m, char *buf, size_t len)
{
	unsigned long long host = rs_uint(rs_get(m, "cache_host_hit_tokens")), disk = rs_uint(rs_get(m, "cache_disk_hit_tokens"));
	int n = snprintf(buf, len, "%llu / %llu", (unsigned long long)rs_uint(rs_get(m, "cache_hit_tokens")),
	    (unsigned long long)rs_uint(rs_get(m, "cache_miss_tokens")));

	if ((host > 0 || disk > 0) && n > 0 && (size_t)n < len)
		snprintf(buf + n, len - (size_t)n, " (host %llu, disk %llu)", host, disk);
	return buf;
}

/* The memory budget and the KV tiers, a line each. */
static void
print_memory(const rs_value *s)
{
	const rs_value *mem = rs_get(s, "memory"), *kv = rs_get(s, "kv");
	char a[32], b[32], c[32], d[32], e[32];

	if (mem != NULL)
		printf("memory     %s used of %s by the loaded models; loads %llu, unloads %llu\n",
		    cli_size(rs_uint(rs_get(mem, "used_bytes")), a), cli_size(rs_uint(rs_get(mem, "budget_bytes")), b),
		    (unsigned long long)rs_uint(rs_get(mem, "loads")), (unsigned long long)rs_uint(rs_get(mem, "unloads")));
	if (kv != NULL)
		printf("KV cache   %s on the device, %s in host memory (of %s), %s on disk (of %s)\n",
		    cli_size(rs_uint(rs_get(kv, "device_bytes")), a), cli_size(rs_uint(rs_get(kv, "host_bytes")), b),
		    cli_size(rs_uint(rs_get(kv, "host_budget_bytes")), c), cli_size(rs_uint(rs_get(kv, "disk_bytes")), d),
		    cli_size(rs_uint(rs_get(kv, "disk_budget_bytes")), e));
}

/*
 * The q-quantile (0..1) of a status histogram, interpolated in its bucket
 * as Prometheus' histogram_quantile does (above the last bound: that
 * bound); -1 when it has no values.
 */
static double
hist_quantile(const rs_value *h, double q)
{
	const rs_value *bounds = rs_get(h, "bounds"), *counts = rs_get(h, "counts");
	size_t i, n = rs_len(bounds);
	uint64_t total = 0, below = 0, c;
	double rank, lo;

	if (n == 0 || rs_len(counts) != n + 1)
		return -1;
	for (i = 0; i <= n; i++)
		total += rs_uint(rs_at(counts, i));
	if (total == 0)
		return -1;
	rank = q * (double)total;
	for (i = 0; i < n; i++) {
		c = rs_uint(rs_at(counts, i));
		if (c > 0 && (double)(below + c) >= rank) {
			lo = i > 0 ? rs_float(rs_at(bounds, i - 1)) : 0;
			return lo + (rs_float(rs_at(bounds, i)) - lo) * (rank - (double)below) / (double)c;
		}
		below += c;
	}
	return rs_float(rs_at(bounds, n - 1));
}

/* "120 ms / 340 ms": a latency histogram's median and 90th percentile; "-" when it has no values. */
static const char *
latency_text(const rs_value *h, char *buf, size_t len)
{
	double p50 = hist_quantile(h, 0.5), p90 = hist_quantile(h, 0.9);

	if (p50 < 0)
		snprintf(buf, len, "-");
	else
		snprintf(buf, len, "%.*f ms / %.*f ms", p50 < 0.01 ? 1 : 0, p50 * 1e3, p90 < 0.01 ? 1 : 0, p90 * 1e3);
	return buf;
}

/* The requests ended, by how. */
static void
print_requests(const rs_value *s)
{
	const rs_value *r = rs_get(s, "requests");

	if (r != NULL)
		printf("requests   %llu stop, %llu length, %llu context, %llu cancelled, %llu failed\n",
		    (unsigned long long)rs_uint(rs_get(r, "stop")), (unsigned long long)rs_uint(rs_get(r, "length")),
		    (unsigned long long)rs_uint(rs_get(r, "context")), (unsigned long long)rs_uint(rs_get(r, "cancel")),
		    (unsigned long long)rs_uint(rs_get(r, "error")));
}

/* Per model: its tokens in and out, its guesses accepted (speculative decoding), and its latencies. */
static void
print_latency(const rs_value *models)
{
	struct table *t = table_new(6, "MODEL", "PROMPT TOKENS", "GENERATED", "GUESSES ACCEPTED",
	    "FIRST TOKEN p50 / p90", "NEXT TOKEN p50 / p90");
	char in[24], out[24], guess[48], first[48], next[48];
	size_t i;

	for (i = 0; i < rs_len(models); i++) {
		const rs_value *m = rs_at(models, i);
		unsigned long long drafted = rs_uint(rs_get(m, "drafted_tokens"));

		snprintf(in, sizeof in, "%llu", (unsigned long long)rs_uint(rs_get(m, "prompt_tokens")));
		snprintf(out, sizeof out, "%llu", (unsigned long long)rs_uint(rs_get(m, "generated_tokens")));
		if (drafted > 0)
			snprintf(guess, sizeof guess, "%llu of %llu", (unsigned long long)rs_uint(rs_get(m, "accepted_tokens")),
			    drafted);
		else
			snprintf(guess, sizeof guess, "-");
		table_add(t, cli_str(m, "name"), in, out, guess, latency_text(rs_get(m, "ttft"), first, sizeof first),
		    latency_text(rs_get(m, "itl"), next, sizeof next));
	}
	table_print(t, stdout);
	table_free(t);
}

static void
print_status(const rs_value *hello, const rs_value *s)
{
	const rs_value *models = rs_get(s, "models"), *clients = rs_get(s, "clients"), *steps = rs_get(s, "steps");
	char up[32], w[32], kv[64], a[24], q[24], keep[80], hits[96];
	struct table *t;
	size_t i;

	printf("%s, protocol %llu, up %s\n", cli_str(hello, "server"),
	    (unsigned long long)rs_uint(rs_get(s, "version")), cli_duration(rs_float(rs_get(s, "uptime_s")), up));
	printf("sequences  %llu active, %llu queued\n", (unsigned long long)rs_uint(rs_get(s, "active")),
	    (unsigned long long)rs_uint(rs_get(s, "queued")));
	printf("batches    %llu steps, %llu tokens, largest %llu sequences, mean %.2f\n",
	    (unsigned long long)rs_uint(rs_get(steps, "count")), (unsigned long long)rs_uint(rs_get(steps, "tokens")),
	    (unsigned long long)rs_uint(rs_get(steps, "max_batch")), rs_float(rs_get(steps, "mean_batch")));
	print_requests(s);
	print_memory(s);

	printf("\n");
	t = table_new(9, "MODEL", "DEVICE", "MEMORY", "KEEP-ALIVE", "KV CACHE", "KV BLOCKS FREE",
	    "CACHE HIT / MISS", "ACTIVE", "QUEUED");
	for (i = 0; i < rs_len(models); i++) {
		const rs_value *m = rs_at(models, i);
		char blocks[48];

		if (rs_get(m, "kv_blocks") != NULL)
			snprintf(blocks, sizeof blocks, "%llu / %llu", (unsigned long long)rs_uint(rs_get(m, "kv_free_blocks")),
			    (unsigned long long)rs_uint(rs_get(m, "kv_blocks")));
		else
			snprintf(blocks, sizeof blocks, "%llu", (unsigned long long)rs_uint(rs_get(m, "kv_free_blocks")));
		snprintf(a, sizeof a, "%llu", (unsigned long long)rs_uint(rs_get(m, "active")));
		snprintf(q, sizeof q, "%llu", (unsigned long long)rs_uint(rs_get(m, "queued")));
		table_add(t, cli_str(m, "name"), cli_str(m, "device")[0] ? cli_str(m, "device") : "(unloaded)",
		    cli_size(rs_uint(rs_get(m, rs_get(m, "memory_bytes") ? "memory_bytes" : "weights_bytes")), w),
		    keep_alive_text(m, keep, sizeof keep),
		    rs_get(m, "kv_bytes") ? cli_size(rs_uint(rs_get(m, "kv_bytes")), kv) : "-", blocks,
		    cache_text(m, hits, sizeof hits), a, q);
	}
	table_print(t, stdout);
	table_free(t);

	printf("\n");
	print_latency(models);

	printf("\n");
	t = table_new(4, "PID", "UID", "CLIENT", "REQUESTS");
	for (i = 0; i < rs_len(clients); i++) {
		const rs_value *c = rs_at(clients, i);
		char pid[24], uid[24];

		snprintf(pid, sizeof pid, "%llu", (unsigned long long)rs_uint(rs_get(c, "pid")));
		snprintf(uid, sizeof uid, "%llu", (unsigned long long)rs_uint(rs_get(c, "uid")));
		snprintf(a, sizeof a, "%llu", (unsigned long long)rs_uint(rs_get(c, "requests")));
		table_add(t, pid, uid, cli_str(c, "client")[0] ? cli_str(c, "client") : "-", a);
	}
	table_print(t, stdout);
	table_free(t);
}

/* Prints the status result s (hello: the daemon's hello) as text. */
typedef void print_fn(const rs_value *hello, const rs_value *s);

/* status and ps: one status request, printed by text, or by json with --json. */
static int
status_cmd(struct cli *cli, int argc, char **argv, print_fn *text, void (*json)(const rs_value *s))
{
	rs_value *out;
	rs_status st;
	int rc;

	if ((rc = list_opts(cli, argc, argv, NULL, NULL)) != 0)
		return rc;
	if (optind < argc)
		return cli_usage_error("usage: resident %s [--json]", argv[0]);
	if ((rc = cli_connect(cli)) != EXIT_OK)
		return rc;
	if ((st = rs_server_status(cli->c, &out)) != RS_OK)
		return cli_fail(cli, st, "status");
	if (cli->json)
		json(out);
	else
		text(cli->hello, out);
	rs_value_free(out);
	return EXIT_OK;
}

int
cmd_status(struct cli *cli, int argc, char **argv)
{
	return status_cmd(cli, argc, argv, print_status, cli_print_json);
}

/* ---- ps ---- */

/* What is left of a loaded model's keep-alive: "4m 10s left", "in use", "until needed". */
static const char *
keep_left_text(const rs_value *m, char *buf, size_t len)
{
	double left = rs_float(rs_get(m, "expires_in_s"));
	char d[32];

	if (left >= 0)
		snprintf(buf, len, "%s left", cli_duration(left, d));
	else if (rs_uint(rs_get(m, "active")) > 0 || rs_float(rs_get(m, "keep_alive_s")) >= 0)
		snprintf(buf, len, "in use");
	else
		snprintf(buf, len, "until needed");
	return buf;
}

/* Where a loaded model's layers are: "-" on the device alone, else its host memory and layers there. */
static const char *
host_text(const rs_value *m, char *buf, size_t len)
{
	char sz[32];

	if (rs_uint(rs_get(m, "host_layers")) == 0)
		return "-";
	if (rs_uint(rs_get(m, "hot_experts")) > 0)
		snprintf(buf, len, "%s (%llu layers, %llu hot experts each)", cli_size(rs_uint(rs_get(m, "host_bytes")), sz),
		    (unsigned long long)rs_uint(rs_get(m, "host_layers")), (unsigned long long)rs_uint(rs_get(m, "hot_experts")));
	else
		snprintf(buf, len, "%s (%llu layers)", cli_size(rs_uint(rs_get(m, "host_bytes")), sz),
		    (unsigned long long)rs_uint(rs_get(m, "host_layers")));
	return buf;
}

/* The loaded models of a status result, a line each. */
static void
print_ps(const rs_value *hello, const rs_value *s)
{
	const rs_value *models = rs_get(s, "models");
	struct table *t = table_new(7, "NAME", "DEVICE", "MEMORY", "HOST", "RUNNING", "QUEUED", "KEEP-ALIVE");
	char mem[32], host[64], a[24], q[24], keep[48];
	size_t i;

	for (i = 0; i < rs_len(models); i++) {
		const rs_value *m = rs_at(models, i);

		if (!rs_bool(rs_get(m, "loaded")))
			continue;
		snprintf(a, sizeof a, "%llu", (unsigned long long)rs_uint(rs_get(m, "active")));
		snprintf(q, sizeof q, "%llu", (unsigned long long)rs_uint(rs_get(m, "queued")));
		table_add(t, cli_str(m, "name"), cli_str(m, "device"), cli_size(rs_uint(rs_get(m, "memory_bytes")), mem),
		    host_text(m, host, sizeof host), a, q, keep_left_text(m, keep, sizeof keep));
	}
	table_print(t, stdout);
	table_free(t);
}

/* {"models": [...]}: status's maps of the loaded models. */
static void
print_ps_json(const rs_value *s)
{
	const rs_value *models = rs_get(s, "models");
	json_t *list = json_array();
	size_t i;

	for (i = 0; i < rs_len(models); i++)
		if (rs_bool(rs_get(rs_at(models, i), "loaded")))
			json_array_append_new(list, cli_json(rs_at(models, i)));
	cli_print_json_new(json_pack("{s:o}", "models", list));
}

int
cmd_ps(struct cli *cli, int argc, char **argv)
{
	return status_cmd(cli, argc, argv, print_ps, print_ps_json);
}
