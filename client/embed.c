/*
 * embed.c: `resident embed`, the vectors of texts by an embedding model,
 * printed as the daemon's result in JSON.
 *
 *   resident embed [--model M] [--dimensions N] [TEXT...]
 *
 * Without TEXT, each line of standard input that is not empty is one text.
 */
#include "config.h"
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

enum { O_JSON = 256, O_SOCKET, O_DIMS };

/*
 * The lines of stdin that are not empty, into *texts (malloc'd, each too).
 * Returns their count, or -1 after saying why (nothing is left to free).
 */
static ssize_t
read_lines(char ***texts)
{
	char *line = NULL, **v = NULL, **grown;
	size_t cap = 0, n = 0, i;
	ssize_t len;
	int nomem = 0, err;

	*texts = NULL;
	while (!nomem && (len = getline(&line, &cap, stdin)) >= 0) {
		while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
			line[--len] = '\0';
		if (len == 0)
			continue;
		if ((grown = realloc(v, (n + 1) * sizeof *v)) != NULL)
			v = grown;
		if (grown == NULL || (v[n] = strdup(line)) == NULL)
			nomem = 1;
		else
			n++;
	}
	err = nomem ? ENOMEM : ferror(stdin) || !feof(stdin) ? (errno != 0 ? errno : EIO) : 0;
	free(line);
	if (err != 0) {
		fprintf(stderr, "resident: embed: reading standard input: %s\n", strerror(err));
		for (i = 0; i < n; i++)
			free(v[i]);
		free(v);
		return -1;
	}
	*texts = v;
	return (ssize_t)n;
}

int
cmd_embed(struct cli *cli, int argc, char **argv)
{
	static const struct option lo[] = {
		{ "model", required_argument, NULL, 'm' }, { "dimensions", required_argument, NULL, O_DIMS },
		{ "json", no_argument, NULL, O_JSON }, { "socket", required_argument, NULL, O_SOCKET },
		CLI_HELP_OPTION, { NULL, 0, NULL, 0 },
	};
	const char *model = NULL;
	char path[PATH_MAX], **lines = NULL;
	uint64_t dims = 0;
	ssize_t n_lines = 0;
	size_t n, i;
	rs_value *out = NULL;
	rs_status st;
	int c, rc;

	optind = 0;
	while ((c = getopt_long(argc, argv, "m:h", lo, NULL)) != -1) {
		switch (c) {
		case 'm': model = cli_model_arg(optarg, path); break;
		case O_DIMS:
			if (cli_parse_uint(optarg, &dims) != 0 || dims == 0 || dims > UINT_MAX)
				return cli_usage_error("embed: bad --dimensions '%s'", optarg);
			break;
		case O_JSON: cli->json = 1; break;     /* accepted as by every command: the output is JSON anyway */
		case O_SOCKET: cli->socket = optarg; break;
		case 'h': return cli_help();
		default: return cli_usage_error("embed: unknown option");
		}
	}
	if (optind == argc && (n_lines = read_lines(&lines)) < 0)
		return EXIT_USAGE;
	if (optind == argc && n_lines == 0)
		return cli_usage_error("embed: no text (give TEXT arguments, or lines on standard input)");
	n = optind < argc ? (size_t)(argc - optind) : (size_t)n_lines;
	if ((rc = cli_connect(cli)) == EXIT_OK) {
		/* the result is printed as it came: its vectors are not copied out as floats */
		st = rs_embed(cli->c, model, (const char *const *)(optind < argc ? argv + optind : lines), n,
		    (unsigned)dims, NULL, NULL, &out);
		rc = st == RS_OK ? EXIT_OK : cli_fail(cli, st, "embed");
		if (st == RS_OK)
			cli_print_json(out);
	}
	for (i = 0; i < (size_t)n_lines; i++)
		free(lines[i]);
	free(lines);
	rs_value_free(out);
	return rc;
}
