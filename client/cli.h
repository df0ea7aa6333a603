/*
 * cli.h: what the files of the `resident` command share. The CLI talks to
 * residentd only through libresident (resident.h).
 */
#ifndef RESIDENT_CLI_H
#define RESIDENT_CLI_H

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>

#include "resident.h"

/* Exit statuses (resident(1), EXIT STATUS). */
enum {
	EXIT_OK = 0,
	EXIT_DAEMON = 1,        /* the daemon answered an error, or the connection was lost */
	EXIT_USAGE = 2,
	EXIT_CONNECT = 3,       /* cannot connect: residentd is not running */
	EXIT_INTERRUPTED = 130, /* `run` cancelled with Ctrl-C */
	EXIT_HELP = -1          /* not an exit status: a command printed the usage for -h; main exits 0 */
};

/* Settings shared by every command. */
struct cli {
	const char *socket;     /* --socket, or NULL for the default */
	int start;              /* --start: start residentd if nobody listens */
	int json;               /* --json: machine-readable output */
	rs_client *c;           /* after cli_connect */
	rs_value *hello;        /* the daemon's hello result */
};

/* A command: argv[0] is its name; returns an exit status. */
typedef int (*cli_cmd_fn)(struct cli *cli, int argc, char **argv);

/* ---- resident.c ---- */

/* Connects and says hello; on failure prints why and returns EXIT_CONNECT (or EXIT_DAEMON). */
int cli_connect(struct cli *cli);
/* Prints the client's last error for a failed call and returns the exit status for st. */
int cli_fail(struct cli *cli, rs_status st, const char *what);
/*
 * -h and --help after a command. Every command's getopt table has
 * CLI_HELP_OPTION and "h" in its short options, and answers 'h' with
 * `return cli_help();`: the usage on stdout, then EXIT_HELP, which the
 * command passes up as it passes up a usage error. The command's own
 * getopt finds it rather than main looking first, as only the command's
 * table knows which options take an argument (`run --stop -h` stops at
 * "-h") and where its options end (`run -- --help` is a prompt).
 */
#define CLI_HELP_OPTION { "help", no_argument, NULL, 'h' }
int cli_help(void);
/* Prints a usage error for a command and returns EXIT_USAGE. */
int cli_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Parses a whole unsigned decimal / a float into *out; 0, or -1 if malformed. */
int cli_parse_uint(const char *s, uint64_t *out);
int cli_parse_float(const char *s, double *out);
/*
 * A model argument as the daemon should see it: a file or directory that
 * exists here becomes its absolute path (residentd runs in another
 * directory), anything else is a model's name and stays as given. buf
 * holds PATH_MAX bytes.
 */
const char *cli_model_arg(const char *arg, char *buf);

/* ---- generate.c: run and chat ---- */

int cmd_run(struct cli *cli, int argc, char **argv);
int cmd_chat(struct cli *cli, int argc, char **argv);

/* ---- embed.c ---- */

int cmd_embed(struct cli *cli, int argc, char **argv);

/* ---- lists.c: sessions, models (show, stop), status, ps ---- */

int cmd_sessions(struct cli *cli, int argc, char **argv);
int cmd_models(struct cli *cli, int argc, char **argv);
int cmd_show(struct cli *cli, int argc, char **argv);
int cmd_stop(struct cli *cli, int argc, char **argv);
int cmd_status(struct cli *cli, int argc, char **argv);
int cmd_ps(struct cli *cli, int argc, char **argv);
/*
 * Prints a session's turns (the last `last` of them; 0: all) as "role: text"
 * blocks, an assistant turn's reasoning (cli_print_reasoning) before its
 * text when reasoning is set.
 */
void cli_print_turns(const rs_value *turns, size_t last, int reasoning);

/* ---- output.c ---- */

/* A value as JSON (a new reference; unrepresentable strings become null). */
json_t *cli_json(const rs_value *v);
/* Prints a value as indented JSON on stdout, with a newline. */
void cli_print_json(const rs_value *v);
/* Prints a jansson value the same way; takes the reference. */
void cli_print_json_new(json_t *j);
/* A string field of a map, or "" when missing. */
const char *cli_str(const rs_value *map, const char *key);
/* Human sizes, local times, durations, written into buf (32 bytes). */
const char *cli_size(uint64_t bytes, char *buf);
const char *cli_time(uint64_t unix_s, char *buf);
const char *cli_duration(double seconds, char *buf);
/* Terminal columns a UTF-8 string takes (one per code point). */
size_t cli_width(const char *s);
/* Whether stdout takes ANSI styles: it is a terminal, and NO_COLOR is unset or empty (no-color.org). */
int cli_color(void);
/* Starts (on) or ends printing a model's reasoning on stdout: faint where cli_color says so. */
void cli_reasoning_style(int on);

/* A text table: columns aligned, the last one not padded. */
struct table;
struct table *table_new(int n_cols, ...);
/* Adds a row of n_cols strings (copied). */
void table_add(struct table *t, ...);
void table_print(struct table *t, FILE *fp);
void table_free(struct table *t);

#endif
