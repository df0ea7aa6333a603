/*
 * resident: the command-line client of residentd.
 *
 *   resident [--socket PATH] [--start] [--json] COMMAND [ARGS]
 *
 * Global options come before the command; each command parses its own
 * (and accepts --json, --socket and -h/--help too). Exit statuses are in cli.h.
 */
#include "config.h"
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void
usage(FILE *fp)
{
	fprintf(fp,
	    "usage: resident [--socket PATH] [--start] [--json] COMMAND [ARGS]\n"
	    "\n"
	    "commands:\n"
	    "  run [OPTIONS] [PROMPT...]      generate a reply to PROMPT (or stdin) as it comes\n"
	    "  chat [OPTIONS]                 talk with a model; the conversation is a session\n"
	    "  sessions list [--limit N] [--offset N]\n"
	    "  sessions show UUID             a session and its turns\n"
	    "  sessions rm UUID               delete a session\n"
	    "  sessions rename UUID TITLE\n"
	    "  sessions fork UUID [TITLE]     copy a session; prints the new one's id\n"
	    "  models list\n"
	    "  models load NAME_OR_PATH       load a model (a progress bar on stderr)\n"
	    "  models unload NAME_OR_PATH     unload it; what runs on it is cancelled\n"
	    "  models show NAME_OR_PATH       family, sizes, quantization, template, context\n"
	    "  show NAME_OR_PATH              the same as models show\n"
	    "  stop NAME_OR_PATH              the same as models unload\n"
	    "  ps                             loaded models: memory, requests, keep-alive left\n"
	    "  status                         models, memory, sequences, clients, batches\n"
	    "  embed [-m, --model MODEL] [--dimensions N] [TEXT...]\n"
	    "                                 vectors of TEXTs (or of each line of stdin) by an\n"
	    "                                 embedding model, as JSON (with or without --json)\n"
	    "\n"
	    "options of run and chat:\n"
	    "  -m, --model NAME           model (default: the session's, else the daemon's)\n"
	    "  -s, --session UUID         continue this session\n"
	    "      --system TEXT          system prompt (run; chat: for a new session)\n"
	    "      --raw                  run: send PROMPT as raw text, without the chat template\n"
	    "  -n, --max-tokens N         at most N tokens (default 512)\n"
	    "  -t, --temperature T        0 is greedy (default 0.8)\n"
	    "      --top-k K, --top-p P, --min-p P, --repeat-penalty R, --seed N\n"
	    "      --stop TEXT            stop before TEXT (may be repeated)\n"
	    "      --hide-reasoning       do not print the model's reasoning (shown faint before\n"
	    "                             its answer)\n"
	    "      --think WHEN           on (default), off, or gpt-oss's effort: low, medium, high\n"
	    "      --speculative WHEN     auto (default): guess tokens from the text and check them\n"
	    "                             in one step (the same output, faster where it repeats)\n"
	    "                             where the daemon measured that it pays; on: always; off\n"
	    "      --draft MODEL          a smaller model of the same vocabulary guesses instead\n"
	    "      --grammar FILE         the reply must match the grammar in FILE (GBNF-like,\n"
	    "                             libclient/PROTOCOL.md)\n"
	    "      --json-schema FILE     the reply must be JSON valid against the schema in FILE\n"
	    "      --json-object          the reply must be a JSON object\n"
	    "                             (one of these three at most; FILE up to 1 MiB)\n"
	    "      --tools FILE           run: offer the tools in FILE (JSON, OpenAI's list); the\n"
	    "                             reply's calls are printed as 'tool call: NAME ARGS (ID)'\n"
	    "      --tool-choice CHOICE   run: auto, none, required, or a tool's name to call\n"
	    "  -v, --verbose              print token counts and speed on stderr\n"
	    "\n"
	    "global options:\n"
	    "      --socket PATH          residentd's socket (default $RESIDENT_SOCKET,\n"
	    "                             else $XDG_RUNTIME_DIR/resident/socket,\n"
	    "                             else /tmp/resident-UID/socket)\n"
	    "      --start                start residentd if it is not running\n"
	    "      --json                 machine-readable output (run: one object at the end)\n"
	    "  -h, --help                 this summary (after a command's name too: run --help)\n"
	    "      --version\n"
	    "\n"
	    "exit status: 0 ok, 1 the daemon answered an error, 2 usage, 3 cannot connect,\n"
	    "130 run interrupted\n");
}

int
cli_help(void)
{
	usage(stdout);
	return EXIT_HELP;
}

int
cli_usage_error(const char *fmt, ...)
{
	va_list ap;

	fputs("resident: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputs(" (see resident --help)\n", stderr);
	return EXIT_USAGE;
}

const char *
cli_model_arg(const char *arg, char *buf)
{
	return realpath(arg, buf) != NULL ? buf : arg;
}

int
cli_parse_uint(const char *s, uint64_t *out)
{
	unsigned long long v;
	char *end;

	if (s == NULL || *s < '0' || *s > '9')
		return -1;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno != 0 || *end != '\0')
		return -1;
	*out = v;
	return 0;
}

int
cli_parse_float(const char *s, double *out)
{
	char *end;
	double v;

	if (s == NULL || *s == '\0')
		return -1;
	errno = 0;
	v = strtod(s, &end);
	if (errno != 0 || *end != '\0' || !isfinite(v))
		return -1;
	*out = v;
	return 0;
}

int
cli_fail(struct cli *cli, rs_status st, const char *what)
{
	const char *msg = cli->c ? rs_last_error(cli->c) : rs_strerror(st);
	const char *code = rs_status_code(st);

	if (code != NULL)
		fprintf(stderr, "resident: %s: %s (%s)\n", what, msg, code);
	else
		fprintf(stderr, "resident: %s: %s\n", what, msg[0] ? msg : rs_strerror(st));
	if (st == RS_ERR_CONNECT)
		return EXIT_CONNECT;
	if (st == RS_ERR_INVAL)
		return EXIT_USAGE;
	return EXIT_DAEMON;
}

int
cli_connect(struct cli *cli)
{
	rs_error err;
	rs_status st;

	cli->c = rs_connect(cli->socket, cli->start ? RS_START_DAEMON : 0, &err);
	if (cli->c == NULL) {
		if (strncmp(err.message, "residentd is not running", 24) == 0)
			fprintf(stderr, "resident: %s; start it with `residentd -m MODEL` or "
			    "`systemctl --user start residentd`\n", err.message);
		else
			fprintf(stderr, "resident: %s\n", err.message);
		return err.code == RS_ERR_CONNECT ? EXIT_CONNECT : EXIT_USAGE;
	}
	if ((st = rs_hello(cli->c, "resident", &cli->hello)) != RS_OK)
		return cli_fail(cli, st, "hello");
	if (rs_uint(rs_get(cli->hello, "version")) != RS_PROTOCOL_VERSION)
		fprintf(stderr, "resident: warning: residentd speaks protocol %llu, this client %d\n",
		    (unsigned long long)rs_uint(rs_get(cli->hello, "version")), RS_PROTOCOL_VERSION);
	return EXIT_OK;
}

static const struct {
	const char *name;
	cli_cmd_fn fn;
} commands[] = {
	{ "run", cmd_run },
	{ "chat", cmd_chat },
	{ "sessions", cmd_sessions },
	{ "session", cmd_sessions },
	{ "models", cmd_models },
	{ "model", cmd_models },
	{ "show", cmd_show },
	{ "stop", cmd_stop },
	{ "ps", cmd_ps },
	{ "status", cmd_status },
	{ "embed", cmd_embed },
};

int
main(int argc, char **argv)
{
	enum { O_SOCKET = 256, O_START, O_JSON, O_VERSION };
	static const struct option lo[] = {
		{ "socket", required_argument, NULL, O_SOCKET }, { "start", no_argument, NULL, O_START },
		{ "json", no_argument, NULL, O_JSON }, { "version", no_argument, NULL, O_VERSION },
		{ "help", no_argument, NULL, 'h' }, { NULL, 0, NULL, 0 },
	};
	struct cli cli = { 0 };
	size_t i;
	int c, rc;

	while ((c = getopt_long(argc, argv, "+h", lo, NULL)) != -1) {
		switch (c) {
		case O_SOCKET: cli.socket = optarg; break;
		case O_START: cli.start = 1; break;
		case O_JSON: cli.json = 1; break;
		case O_VERSION:
			printf("resident %s (protocol %d)\n", PACKAGE_VERSION, RS_PROTOCOL_VERSION);
			return EXIT_OK;
		case 'h': usage(stdout); return EXIT_OK;
		default: usage(stderr); return EXIT_USAGE;
		}
	}
	if (optind >= argc) {
		usage(stderr);
		return EXIT_USAGE;
	}
	if (strcmp(argv[optind], "help") == 0) {
		usage(stdout);
		return EXIT_OK;
	}
	for (i = 0; i < sizeof commands / sizeof commands[0]; i++) {
		if (strcmp(argv[optind], commands[i].name) != 0)
			continue;
		rc = commands[i].fn(&cli, argc - optind, argv + optind);
		rs_value_free(cli.hello);
		rs_close(cli.c);
		return rc == EXIT_HELP ? EXIT_OK : rc;
	}
	return cli_usage_error("unknown command '%s'", argv[optind]);
}
