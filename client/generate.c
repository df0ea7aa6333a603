/*
 * generate.c: `resident run` and `resident chat`.
 *
 * Both stream the reply to stdout as it comes: the model's reasoning, where
 * it has any, faint on a terminal and set apart from the answer by a blank
 * line (unless --hide-reasoning), then its answer. A generation is started with
 * rs_generate_start and driven by a ppoll loop on the client's socket, with
 * SIGINT blocked except inside ppoll: so a Ctrl-C always interrupts the
 * wait, and is turned into a `cancel` request instead of ending the
 * program. A second Ctrl-C before the generation ends exits at once.
 */
#include "config.h"
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHAT_SHOW_TURNS 10      /* turns shown when a session is resumed */
#define TITLE_MAX 48            /* bytes of the first message that name a new session */

#define MAX_SAMPLING 32
#define CONSTRAINT_MAX (1 << 20)  /* bytes of a grammar or schema: the protocol's bound */

/* What run and chat were asked for. */
struct gen_opts {
	const char *model, *session, *system;
	char model_path[PATH_MAX];
	int raw, verbose, hide_reasoning;
	struct {                    /* the sampling options given, in order */
		const char *key;
		int is_int;
		uint64_t u;
		double f;
	} samp[MAX_SAMPLING];
	int n_samp;
	char **stop;                /* the --stop texts */
	int n_stop;
	const char *constraint;     /* the generate field of --grammar, --json-schema or --json-object */
	char *constraint_text;      /* the --grammar or --json-schema file's text (NULL for --json-object) */
	char *tools;                /* run --tools: the file's text (JSON of the tools) */
	const char *tool_choice;    /* run --tool-choice: auto, none, required, or a tool's name */
	const char *think;          /* --think: on, off, low, medium, high */
	const char *speculative;    /* --speculative: auto, on, off */
	const char *draft;          /* --draft: the draft model's name or path */
	char draft_path[PATH_MAX];
};

/* What a generation printed last. */
enum shown { SHOWN_NOTHING, SHOWN_REASONING, SHOWN_ANSWER };

/* One generation in progress. */
struct gen {
	int print;                  /* stream the text to stdout */
	int reasoning;              /* and the reasoning before it */
	enum shown shown;
	int finished, cancelled;
	rs_status status;
	char message[256];
	json_t *done;               /* the done reply */
	char last;                  /* the last byte printed */
	size_t printed;
};

static volatile sig_atomic_t sigints;
static sigset_t wait_mask;      /* the signal mask inside ppoll: SIGINT let through */

/* ---- signals and waiting ---- */

static void
sigint_cb(int sig)
{
	if (++sigints >= 2)
		_exit(EXIT_INTERRUPTED);
}

/* From here on SIGINT is only delivered inside wait_readable. */
static void
signals_setup(void)
{
	struct sigaction sa;
	sigset_t block;

	memset(&sa, 0, sizeof sa);
	sa.sa_handler = sigint_cb;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigemptyset(&block);
	sigaddset(&block, SIGINT);
	sigprocmask(SIG_BLOCK, &block, &wait_mask);
	sigdelset(&wait_mask, SIGINT);
}

/* Waits until fd is readable (1) or a signal came (0). */
static int
wait_readable(int fd)
{
	struct pollfd pfd = { .fd = fd, .events = POLLIN };

	if (ppoll(&pfd, 1, NULL, &wait_mask) < 0)
		return errno == EINTR ? 0 : 1;
	return 1;
}

/* ---- one generation ---- */

/* Ends the line and the reasoning's style when the text printed changes from reasoning to answer. */
static void
gen_switch(struct gen *g, enum shown to)
{
	if (g->shown == SHOWN_REASONING)
		cli_reasoning_style(0);
	if (g->shown != SHOWN_NOTHING && to != SHOWN_NOTHING) {
		if (g->last != '\n')
			putchar('\n');
		putchar('\n');
		g->last = '\n';
	}
	if (to == SHOWN_REASONING)
		cli_reasoning_style(1);
	g->shown = to;
}

/* Prints a piece of the reply's reasoning or answer. */
static void
gen_print(struct gen *g, const char *s, enum shown part)
{
	size_t n = strlen(s);

	if (n == 0)
		return;
	if (part != g->shown)
		gen_switch(g, part);
	fwrite(s, 1, n, stdout);
	fflush(stdout);
	g->last = s[n - 1];
	g->printed += n;
}

static int
gen_token_cb(uint64_t id, const char *text, const rs_value *reply, void *user)
{
	struct gen *g = user;

	if (g->reasoning)
		gen_print(g, rs_reply_reasoning(reply), SHOWN_REASONING);
	gen_print(g, text, SHOWN_ANSWER);
	return 0;
}

static void
gen_done_cb(uint64_t id, const rs_value *done, void *user)
{
	struct gen *g = user;

	g->finished = 1;
	g->done = cli_json(done);
}

static void
gen_error_cb(uint64_t id, rs_status code, const char *message, void *user)
{
	struct gen *g = user;

	g->finished = 1;
	g->status = code;
	snprintf(g->message, sizeof g->message, "%s", message);
}

/* Runs a generation to its end; the first Ctrl-C cancels it. */
static void
generate(struct cli *cli, const rs_params *p, struct gen *g)
{
	uint64_t id;
	rs_status st;

	sigints = 0;
	id = rs_generate_start(cli->c, p, g->print ? gen_token_cb : NULL, gen_done_cb, gen_error_cb, g);
	if (id == 0) {
		g->finished = 1;
		g->status = RS_ERR_IO;
		snprintf(g->message, sizeof g->message, "%s", rs_last_error(cli->c));
		return;
	}
	while (!g->finished) {
		if (sigints > 0 && !g->cancelled) {
			g->cancelled = 1;
			if ((st = rs_cancel_start(cli->c, id)) != RS_OK) {
				g->finished = 1;
				g->status = st;
				snprintf(g->message, sizeof g->message, "%s", rs_last_error(cli->c));
				break;
			}
		}
		if (wait_readable(rs_fd(cli->c)) && (st = rs_process(cli->c)) != RS_OK && !g->finished) {
			g->finished = 1;
			g->status = st;
			snprintf(g->message, sizeof g->message, "%s", rs_last_error(cli->c));
		}
	}
	sigints = 0;
	if (g->shown == SHOWN_REASONING)
		cli_reasoning_style(0);
	if (g->print && g->printed > 0 && g->last != '\n') {
		putchar('\n');
		fflush(stdout);
	}
}

/* The finish reason of a finished generation. */
static const char *
gen_finish(const struct gen *g)
{
	const char *s = json_string_value(json_object_get(g->done, "finish"));

	return s ? s : "";
}

/* -v: one line of usage statistics on stderr. */
static void
print_usage(const struct gen *g)
{
	json_t *u = json_object_get(g->done, "usage");
	json_int_t drafted = json_integer_value(json_object_get(u, "drafted_tokens"));

	fprintf(stderr, "[%s] %lld prompt tokens (%lld cached), %lld generated, first token after %.1f ms, "
	    "%.1f tokens/s", gen_finish(g),
	    (long long)json_integer_value(json_object_get(u, "prompt_tokens")),
	    (long long)json_integer_value(json_object_get(u, "cached_tokens")),
	    (long long)json_integer_value(json_object_get(u, "generated_tokens")),
	    json_number_value(json_object_get(u, "ttft_ms")), json_number_value(json_object_get(u, "tokens_per_s")));
	if (drafted > 0)
		fprintf(stderr, ", %lld of %lld guessed tokens accepted",
		    (long long)json_integer_value(json_object_get(u, "accepted_tokens")), (long long)drafted);
	fputc('\n', stderr);
}

/* Reports a failed generation; returns the exit status. */
static int
gen_failed(const struct gen *g)
{
	const char *code = rs_status_code(g->status);

	if (code != NULL)
		fprintf(stderr, "resident: generate: %s (%s)\n", g->message, code);
	else
		fprintf(stderr, "resident: generate: %s\n", g->message);
	return g->status == RS_ERR_CONNECT ? EXIT_CONNECT : EXIT_DAEMON;
}

/* ---- options ---- */

enum {
	O_SYSTEM = 256, O_RAW, O_TOP_K, O_TOP_P, O_MIN_P, O_REPEAT, O_SEED, O_STOP, O_JSON, O_SOCKET,
	O_HIDE_REASONING, O_GRAMMAR, O_JSON_SCHEMA, O_JSON_OBJECT, O_TOOLS, O_TOOL_CHOICE, O_THINK, O_SPECULATIVE,
	O_DRAFT,
};

/*
 * A sampling option: its protocol field, its name on the command line
 * (errors name the option the user typed, not the field) and whether it is
 * an integer.
 */
static int
sampling_opt(int c, const char **key, const char **name, int *is_int)
{
	static const struct { int c; const char *key, *name; int is_int; } map[] = {
		{ 'n', "max_tokens", "max-tokens", 1 }, { 't', "temperature", "temperature", 0 },
		{ O_TOP_K, "top_k", "top-k", 1 }, { O_TOP_P, "top_p", "top-p", 0 }, { O_MIN_P, "min_p", "min-p", 0 },
		{ O_REPEAT, "repeat_penalty", "repeat-penalty", 0 }, { O_SEED, "seed", "seed", 1 },
	};
	size_t i;

	for (i = 0; i < sizeof map / sizeof map[0]; i++)
		if (map[i].c == c) {
			*key = map[i].key;
			*name = map[i].name;
			*is_int = map[i].is_int;
			return 1;
		}
	return 0;
}

/*
 * Reads a --grammar, --json-schema or --tools file whole into *out (malloc'd). On
 * failure prints why, naming the option and the file, and returns
 * EXIT_USAGE.
 */
static int
read_constraint_file(const char *cmd, const char *opt, const char *path, char **out)
{
	FILE *fp = fopen(path, "rb");
	char *buf = malloc(CONSTRAINT_MAX + 1);
	const char *why = NULL;
	size_t n = 0;

	if (fp != NULL && buf != NULL)
		n = fread(buf, 1, CONSTRAINT_MAX + 1, fp);
	if (fp == NULL || buf == NULL || ferror(fp))
		why = strerror(errno);
	else if (n > CONSTRAINT_MAX)
		why = "larger than 1 MiB, the most the daemon takes";
	else if (memchr(buf, '\0', n) != NULL)
		why = "holds a NUL byte: not a text file";
	if (fp != NULL)
		fclose(fp);
	if (why != NULL) {
		fprintf(stderr, "resident: %s: %s %s: %s\n", cmd, opt, path, why);
		free(buf);
		return EXIT_USAGE;
	}
	buf[n] = '\0';
	*out = buf;
	return 0;
}

/* --grammar FILE, --json-schema FILE or --json-object: at most one of them. */
static int
constraint_opt(const char *cmd, int c, const char *arg, struct gen_opts *o)
{
	if (o->constraint != NULL)
		return cli_usage_error("%s: give at most one of --grammar, --json-schema and --json-object", cmd);
	if (c == O_JSON_OBJECT) {
		o->constraint = "json";
		return 0;
	}
	o->constraint = c == O_GRAMMAR ? "grammar" : "json_schema";
	return read_constraint_file(cmd, c == O_GRAMMAR ? "--grammar" : "--json-schema", arg,
	    &o->constraint_text);
}

/* Parses the options of run and chat; positional arguments stay at argv[optind..]. */
static int
gen_parse(struct cli *cli, int argc, char **argv, struct gen_opts *o)
{
	static const struct option lo[] = {
		{ "model", required_argument, NULL, 'm' }, { "session", required_argument, NULL, 's' },
		{ "system", required_argument, NULL, O_SYSTEM }, { "raw", no_argument, NULL, O_RAW },
		{ "max-tokens", required_argument, NULL, 'n' }, { "temperature", required_argument, NULL, 't' },
		{ "top-k", required_argument, NULL, O_TOP_K }, { "top-p", required_argument, NULL, O_TOP_P },
		{ "min-p", required_argument, NULL, O_MIN_P }, { "repeat-penalty", required_argument, NULL, O_REPEAT },
		{ "seed", required_argument, NULL, O_SEED }, { "stop", required_argument, NULL, O_STOP },
		{ "verbose", no_argument, NULL, 'v' }, { "json", no_argument, NULL, O_JSON },
		{ "socket", required_argument, NULL, O_SOCKET },
		{ "hide-reasoning", no_argument, NULL, O_HIDE_REASONING },
		{ "grammar", required_argument, NULL, O_GRAMMAR },
		{ "json-schema", required_argument, NULL, O_JSON_SCHEMA },
		{ "json-object", no_argument, NULL, O_JSON_OBJECT },
		{ "tools", required_argument, NULL, O_TOOLS },
		{ "tool-choice", required_argument, NULL, O_TOOL_CHOICE }, { "think", required_argument, NULL, O_THINK },
		{ "speculative", required_argument, NULL, O_SPECULATIVE }, { "draft", required_argument, NULL, O_DRAFT },
		CLI_HELP_OPTION, { NULL, 0, NULL, 0 },
	};
	const char *key, *name;
	int c, is_int, k, rc;

	if ((o->stop = calloc((size_t)argc, sizeof *o->stop)) == NULL)
		return EXIT_DAEMON;
	optind = 0;
	while ((c = getopt_long(argc, argv, "m:s:n:t:vh", lo, NULL)) != -1) {
		if (sampling_opt(c, &key, &name, &is_int)) {
			if (o->n_samp == MAX_SAMPLING)
				return cli_usage_error("%s: too many options", argv[0]);
			k = o->n_samp++;
			o->samp[k].key = key;
			o->samp[k].is_int = is_int;
			if (is_int ? cli_parse_uint(optarg, &o->samp[k].u) != 0 : cli_parse_float(optarg, &o->samp[k].f) != 0)
				return cli_usage_error("%s: --%s wants %s, not '%s'", argv[0], name,
				    is_int ? "a whole number" : "a number", optarg);
			continue;
		}
		switch (c) {
		case 'm': o->model = cli_model_arg(optarg, o->model_path); break;
		case 's': o->session = optarg; break;
		case O_SYSTEM: o->system = optarg; break;
		case O_RAW: o->raw = 1; break;
		case O_STOP: o->stop[o->n_stop++] = optarg; break;
		case 'v': o->verbose = 1; break;
		case O_HIDE_REASONING: o->hide_reasoning = 1; break;
		case O_JSON: cli->json = 1; break;
		case O_SOCKET: cli->socket = optarg; break;
		case O_GRAMMAR:
		case O_JSON_SCHEMA:
		case O_JSON_OBJECT:
			if ((rc = constraint_opt(argv[0], c, optarg, o)) != 0)
				return rc;
			break;
		case O_TOOLS:
			free(o->tools);
			if ((rc = read_constraint_file(argv[0], "--tools", optarg, &o->tools)) != 0)
				return rc;
			break;
		case O_TOOL_CHOICE: o->tool_choice = optarg; break;
		case O_THINK:
			if (strcmp(optarg, "on") != 0 && strcmp(optarg, "off") != 0 && strcmp(optarg, "low") != 0 &&
			    strcmp(optarg, "medium") != 0 && strcmp(optarg, "high") != 0)
				return cli_usage_error("%s: --think wants on, off, low, medium or high, not '%s'", argv[0],
				    optarg);
			o->think = optarg;
			break;
		case O_SPECULATIVE:
			if (strcmp(optarg, "auto") != 0 && strcmp(optarg, "on") != 0 && strcmp(optarg, "off") != 0)
				return cli_usage_error("%s: --speculative wants auto, on or off, not '%s'", argv[0],
				    optarg);
			o->speculative = optarg;
			break;
		case O_DRAFT: o->draft = cli_model_arg(optarg, o->draft_path); break;
		case 'h': return cli_help();
		default: return cli_usage_error("%s: unknown option", argv[0]);
		}
	}
	return 0;
}

/* Sets the sampling options given (and the stop texts, if with_stop) in p. */
static void
apply_sampling(const struct gen_opts *o, rs_params *p, int with_stop)
{
	int i;

	for (i = 0; i < o->n_samp; i++) {
		if (o->samp[i].is_int)
			rs_params_set_uint(p, o->samp[i].key, o->samp[i].u);
		else
			rs_params_set_float(p, o->samp[i].key, o->samp[i].f);
	}
	for (i = 0; with_stop && i < o->n_stop; i++)
		rs_params_add_stop(p, o->stop[i]);
	if (o->speculative != NULL)
		rs_params_set_str(p, "speculative", o->speculative);
	if (o->draft != NULL)
		rs_params_set_str(p, "draft", o->draft);
}

/* Sets the output's constraint, if one was given: a request's own, never a session's default. */
static void
apply_constraint(const struct gen_opts *o, rs_params *p)
{
	if (o->constraint_text != NULL)
		rs_params_set_str(p, o->constraint, o->constraint_text);
	else if (o->constraint != NULL)
		rs_params_set_bool(p, o->constraint, 1);
}

/* run's --tools and --tool-choice: auto, none and required are the protocol's, another word a tool's name. */
static void
apply_tools(const struct gen_opts *o, rs_params *p)
{
	const char *c = o->tool_choice;

	if (o->tools != NULL)
		rs_params_set_str(p, "tools", o->tools);
	if (c != NULL)
		rs_params_set_str(p, strcmp(c, "auto") == 0 || strcmp(c, "none") == 0 || strcmp(c, "required") == 0 ?
		    "tool_choice" : "tool_name", c);
}

/* --think: on and off as the protocol's true and false, an effort as it is. */
static void
apply_think(const struct gen_opts *o, rs_params *p)
{
	if (o->think == NULL)
		return;
	if (strcmp(o->think, "on") == 0 || strcmp(o->think, "off") == 0)
		rs_params_set_bool(p, "think", strcmp(o->think, "on") == 0);
	else
		rs_params_set_str(p, "think", o->think);
}

/* Prints the reply's tool calls, one a line: NAME ARGUMENTS (its id). */
static void
print_calls(const struct gen *g)
{
	json_t *calls = json_object_get(g->done, "tool_calls"), *c;
	size_t i;

	json_array_foreach(calls, i, c)
		printf("tool call: %s %s (%s)\n", json_string_value(json_object_get(c, "name")),
		    json_string_value(json_object_get(c, "arguments")), json_string_value(json_object_get(c, "id")));
	if (json_object_get(g->done, "tool_error") != NULL)
		fprintf(stderr, "resident: run: a tool call did not parse: %s\n",
		    json_string_value(json_object_get(g->done, "tool_error")));
	fflush(stdout);
}

/* ---- run ---- */

/* Reads all of stdin into a string; NULL on an error, said on stderr. */
static char *
read_all_stdin(void)
{
	size_t len = 0, cap = 4096;
	char *buf = malloc(cap), *nb;
	ssize_t n;
	int err = ENOMEM;

	while (buf != NULL) {
		if (cap - len < 2) {
			if ((nb = realloc(buf, cap *= 2)) == NULL)
				break;
			buf = nb;
		}
		if ((n = read(0, buf + len, cap - len - 1)) == 0) {
			buf[len] = '\0';
			return buf;
		}
		if (n < 0 && errno != EINTR) {
			err = errno;
			break;
		}
		len += n > 0 ? (size_t)n : 0;
	}
	free(buf);
	fprintf(stderr, "resident: run: reading standard input: %s\n", strerror(err));
	return NULL;
}

/*
 * The prompt: the arguments joined with spaces, or stdin for none or "-".
 * NULL: none given, or (*failed set, said on stderr) stdin could not be read.
 */
static char *
run_prompt(int argc, char **argv, int *failed)
{
	size_t len = 0;
	char *s;
	int i;

	*failed = 0;
	if (optind >= argc || (optind == argc - 1 && strcmp(argv[optind], "-") == 0)) {
		if (isatty(0) && optind >= argc)
			return NULL;
		*failed = (s = read_all_stdin()) == NULL;
		return s;
	}
	for (i = optind; i < argc; i++)
		len += strlen(argv[i]) + 1;
	if ((s = malloc(len)) == NULL)
		return NULL;
	s[0] = '\0';
	for (i = optind; i < argc; i++) {
		strcat(s, argv[i]);
		if (i + 1 < argc)
			strcat(s, " ");
	}
	return s;
}

int
cmd_run(struct cli *cli, int argc, char **argv)
{
	struct gen_opts o = { 0 };
	struct gen g = { 0 };
	rs_params *p = rs_params_new();
	char *prompt = NULL;
	int rc, failed;

	if (p == NULL)
		return EXIT_DAEMON;
	if ((rc = gen_parse(cli, argc, argv, &o)) != 0)
		goto out;
	if (o.raw && (o.session || o.system)) {
		rc = cli_usage_error("run: --raw sends the prompt as is: no --session or --system with it");
		goto out;
	}
	if ((prompt = run_prompt(argc, argv, &failed)) == NULL) {
		rc = failed ? EXIT_USAGE : cli_usage_error("run: no prompt (give it as arguments, or on stdin)");
		goto out;
	}
	if ((o.tools != NULL || o.tool_choice != NULL) && o.raw) {
		rc = cli_usage_error("run: tools are rendered by the chat template: no --tools or --tool-choice "
		    "with --raw");
		goto out;
	}
	apply_sampling(&o, p, 1);
	apply_constraint(&o, p);
	apply_tools(&o, p);
	apply_think(&o, p);
	if (o.raw) {
		rs_params_set_str(p, "prompt", prompt);
	} else {
		if (o.system)
			rs_params_add_message(p, "system", o.system);
		rs_params_add_message(p, "user", prompt);
	}
	if (o.session)
		rs_params_set_str(p, "session", o.session);
	if (o.model)
		rs_params_set_str(p, "model", o.model);
	if ((rc = cli_connect(cli)) != EXIT_OK)
		goto out;
	signals_setup();
	g.print = !cli->json;
	g.reasoning = !o.hide_reasoning;
	generate(cli, p, &g);
	if (g.status != RS_OK) {
		rc = gen_failed(&g);
		goto out;
	}
	if (!cli->json)
		print_calls(&g);
	if (o.verbose)
		print_usage(&g);
	rc = g.cancelled && strcmp(gen_finish(&g), "cancel") == 0 ? EXIT_INTERRUPTED : EXIT_OK;
	if (cli->json) {            /* takes g.done, which gen_finish reads */
		cli_print_json_new(g.done);
		g.done = NULL;
	}
out:
	json_decref(g.done);
	free(prompt);
	free(o.stop);
	free(o.constraint_text);
	free(o.tools);
	rs_params_free(p);
	return rc;
}

/* ---- chat: reading the user's messages ---- */

/* Buffered lines of stdin, read with ppoll so that Ctrl-C interrupts them. */
struct input {
	char *buf;
	size_t len, cap;
	int eof;
	int tty;
};

/*
 * The next line, without its newline, into *line (malloc'd). Returns 1, 0
 * at the end of input (a last unterminated line is still returned first),
 * or -1 when Ctrl-C interrupted the wait.
 */
static int
input_line(struct input *in, char **line)
{
	char *nl, *nb;
	size_t n;
	ssize_t k;

	for (;;) {
		nl = in->len > 0 ? memchr(in->buf, '\n', in->len) : NULL;
		if (nl != NULL || (in->eof && in->len > 0)) {
			n = nl ? (size_t)(nl - in->buf) : in->len;
			if ((*line = malloc(n + 1)) == NULL)
				return 0;
			memcpy(*line, in->buf, n);
			(*line)[n] = '\0';
			n += nl != NULL;
			memmove(in->buf, in->buf + n, in->len - n);
			in->len -= n;
			return 1;
		}
		if (in->eof)
			return 0;
		if (in->cap - in->len < 4096) {
			if ((nb = realloc(in->buf, in->cap + 65536)) == NULL)
				return 0;
			in->buf = nb;
			in->cap += 65536;
		}
		if (!wait_readable(0)) {
			sigints = 0;
			return -1;
		}
		if ((k = read(0, in->buf + in->len, in->cap - in->len)) > 0)
			in->len += (size_t)k;
		else if (k == 0 || errno != EINTR)
			in->eof = 1;
	}
}

/* Appends a line and a newline to a growing message. */
static void
msg_append(char **msg, size_t *len, const char *s, size_t n)
{
	char *m = realloc(*msg, *len + n + 2);

	if (m == NULL)
		return;
	memcpy(m + *len, s, n);
	m[*len + n] = '\n';
	m[*len + n + 1] = '\0';
	*msg = m;
	*len += n + 1;
}

/*
 * Reads one message: a line; lines ending in a backslash continue it; a
 * line holding only """ starts a block that another such line ends.
 * Returns 1 with *out (malloc'd, no trailing newline), 0 at the end of
 * input, -1 if Ctrl-C discarded what was typed.
 */
static int
read_message(struct input *in, char **out)
{
	char *line, *msg = NULL;
	size_t len = 0, n;
	int r, block = 0;

	if (in->tty)
		fputs(">>> ", stderr);
	for (;;) {
		if ((r = input_line(in, &line)) <= 0) {
			if (r == 0 && msg != NULL)
				break;          /* end of input ends the message */
			free(msg);
			if (r < 0 && in->tty)
				fputs("\n", stderr);
			return r;
		}
		n = strlen(line);
		if (!block && msg == NULL && strcmp(line, "\"\"\"") == 0) {
			block = 1;
			msg = calloc(1, 1);
		} else if (block && strcmp(line, "\"\"\"") == 0) {
			free(line);
			break;
		} else if (block) {
			msg_append(&msg, &len, line, n);
		} else if (n > 0 && line[n - 1] == '\\') {
			msg_append(&msg, &len, line, n - 1);
		} else {
			msg_append(&msg, &len, line, n);
			free(line);
			break;
		}
		free(line);
		if (in->tty)
			fputs("... ", stderr);
	}
	if (len > 0 && msg[len - 1] == '\n')
		msg[--len] = '\0';
	*out = msg;
	return 1;
}

/* Whether s holds only white space. */
static int
blank(const char *s)
{
	return s[strspn(s, " \t\r\n")] == '\0';
}

/* ---- chat ---- */

/* A title from a message: its first line, cut at a character boundary. */
static void
make_title(const char *msg, char *title, size_t size)
{
	size_t n = strcspn(msg += strspn(msg, " \t\r\n"), "\r\n");

	if (n > TITLE_MAX) {
		n = TITLE_MAX;
		while (n > 0 && ((unsigned char)msg[n] & 0xc0) == 0x80)
			n--;
	}
	snprintf(title, size, "%.*s%s", (int)n, msg, msg[n] && msg[n] != '\n' && msg[n] != '\r' ? "..." : "");
}

/* Opens the session to talk in: resumes o->session (showing its last turns) or creates one. */
static int
chat_open(struct cli *cli, const struct gen_opts *o, char *uuid, size_t size, int *titled)
{
	rs_params *defaults;
	rs_value *out;
	const rs_value *s;
	rs_status st;

	if (o->session != NULL) {
		if ((st = rs_session_get(cli->c, o->session, &out)) != RS_OK)
			return cli_fail(cli, st, "session");
		s = rs_get(out, "session");
		fprintf(stderr, "session %s: %s (model %s, %llu turns)\n", cli_str(s, "session"),
		    cli_str(s, "title")[0] ? cli_str(s, "title") : "untitled", cli_str(s, "model"),
		    (unsigned long long)rs_uint(rs_get(s, "turns")));
		cli_print_turns(rs_get(out, "turns"), CHAT_SHOW_TURNS, !o->hide_reasoning);
	} else {
		/* the sampling options become the new session's defaults */
		if ((defaults = rs_params_new()) == NULL)
			return EXIT_DAEMON;
		apply_sampling(o, defaults, 0);
		st = rs_session_new(cli->c, o->model, NULL, o->system, defaults, &out);
		rs_params_free(defaults);
		if (st != RS_OK)
			return cli_fail(cli, st, "new session");
		s = rs_get(out, "session");
		fprintf(stderr, "new session %s (resume it with `resident chat --session %s`)\n",
		    cli_str(s, "session"), cli_str(s, "session"));
	}
	snprintf(uuid, size, "%s", cli_str(s, "session"));
	*titled = cli_str(s, "title")[0] != '\0';
	rs_value_free(out);
	return EXIT_OK;
}

/*
 * One turn: sends the message, streams the reply; *kept tells whether the
 * daemon committed it. Returns 0, or an exit status to stop with.
 */
static int
chat_turn(struct cli *cli, const struct gen_opts *o, const char *uuid, const char *text, int *kept)
{
	struct gen g = { .print = 1, .reasoning = !o->hide_reasoning };
	rs_params *p = rs_params_new();
	int rc = 0;

	*kept = 0;
	if (p == NULL)
		return EXIT_DAEMON;
	apply_sampling(o, p, 1);
	apply_constraint(o, p);
	apply_think(o, p);
	rs_params_set_str(p, "session", uuid);
	rs_params_add_message(p, "user", text);
	if (o->model)
		rs_params_set_str(p, "model", o->model);
	generate(cli, p, &g);
	rs_params_free(p);
	if (g.status != RS_OK) {
		rc = gen_failed(&g);
		/* a request the daemon refused leaves the session usable */
		if (g.status != RS_ERR_IO && g.status != RS_ERR_PROTOCOL && g.status != RS_ERR_SHUTTING_DOWN)
			rc = 0;
	} else if (strcmp(gen_finish(&g), "cancel") == 0) {
		fputs("[cancelled: this turn is not kept]\n", stderr);
	} else {
		*kept = 1;
		if (o->verbose)
			print_usage(&g);
	}
	json_decref(g.done);
	return rc;
}

int
cmd_chat(struct cli *cli, int argc, char **argv)
{
	struct gen_opts o = { 0 };
	struct input in = { 0 };
	char uuid[64], title[TITLE_MAX + 8], *text;
	int rc, r, titled = 0, kept;

	if ((rc = gen_parse(cli, argc, argv, &o)) != 0)
		goto out;
	if (optind < argc || o.raw || cli->json || (o.session && o.system)) {
		rc = cli_usage_error("usage: resident chat [--session UUID | --system TEXT] [--model NAME] "
		    "[sampling options]");
		goto out;
	}
	if (o.tools != NULL || o.tool_choice != NULL) {
		rc = cli_usage_error("chat: --tools and --tool-choice are for run (chat has no tool results to "
		    "send back)");
		goto out;
	}
	if ((rc = cli_connect(cli)) != EXIT_OK || (rc = chat_open(cli, &o, uuid, sizeof uuid, &titled)) != EXIT_OK)
		goto out;
	signals_setup();
	in.tty = isatty(0);
	while ((r = read_message(&in, &text)) != 0) {
		if (r < 0)
			continue;
		if (blank(text)) {
			free(text);
			continue;
		}
		if ((rc = chat_turn(cli, &o, uuid, text, &kept)) != 0) {
			free(text);
			goto out;
		}
		if (kept && !titled) {
			make_title(text, title, sizeof title);
			titled = rs_session_rename(cli->c, uuid, title, NULL) == RS_OK;
		}
		free(text);
	}
	if (in.tty)
		fputs("\n", stderr);
	rc = EXIT_OK;
out:
	free(in.buf);
	free(o.stop);
	free(o.constraint_text);
	free(o.tools);
	return rc;
}
