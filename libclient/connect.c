/*
 * connect.c: finding the daemon's socket, connecting, and starting
 * residentd when asked to and nobody listens.
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define START_TIMEOUT_MS 10000
#define START_POLL_MS 50

static void set_error(rs_error *err, rs_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Fills *err, if given. */
static void
set_error(rs_error *err, rs_status code, const char *fmt, ...)
{
	va_list ap;

	if (err == NULL)
		return;
	err->code = code;
	va_start(ap, fmt);
	vsnprintf(err->message, sizeof err->message, fmt, ap);
	va_end(ap);
}

/*
 * One connect attempt; nonblock: the socket is non-blocking, and a daemon
 * whose queue of connections is full fails it with EAGAIN instead of
 * making it wait. Returns the fd, or -1 with errno set.
 */
static int
try_connect(const struct sockaddr_un *sa, int nonblock)
{
	int fd, e;

	if ((fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | (nonblock ? SOCK_NONBLOCK : 0), 0)) < 0)
		return -1;
	while (connect(fd, (const struct sockaddr *)sa, sizeof *sa) != 0) {
		if (errno == EINTR)
			continue;
		e = errno;
		close(fd);
		errno = e;
		return -1;
	}
	return fd;
}

/*
 * The grandchild: a new session, stdio on /dev/null, no descriptors of
 * the application, default signals, then residentd. On failure it reports
 * errno through the pipe.
 */
static void
exec_daemon(const char *path, int report)
{
	const char *prog = getenv("RESIDENT_DAEMON");
	sigset_t none;
	long fd, max = sysconf(_SC_OPEN_MAX);
	int null, e, sig;

	if (prog == NULL || prog[0] == '\0')
		prog = "residentd";
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	for (sig = 1; sig < 32; sig++)
		if (sig != SIGKILL && sig != SIGSTOP)
			signal(sig, SIG_DFL);
	if ((null = open("/dev/null", O_RDWR)) >= 0) {
		dup2(null, 0), dup2(null, 1), dup2(null, 2);
		if (null > 2)
			close(null);
	}
	/* the application's pipes must not be held open by the daemon */
	for (fd = 3; fd < (max > 0 && max < 65536 ? max : 65536); fd++)
		if (fd != report)
			close((int)fd);
	/* do not keep the caller's directory busy; a relative socket path needs it */
	if (path[0] == '/' && chdir("/") != 0)
		_exit(127);
	execlp(prog, prog, "-s", path, (char *)NULL);
	e = errno;
	if (write(report, &e, sizeof e) < 0)
		_exit(127);
	_exit(127);
}

/*
 * Starts residentd detached (double fork, setsid: it is nobody's child and
 * has no terminal). Returns 0 once it has been exec'd, or -1 with err.
 */
static int
spawn_daemon(const char *path, rs_error *err)
{
	int p[2], e = 0, status;
	pid_t pid;
	ssize_t n;

	if (pipe2(p, O_CLOEXEC) != 0) {
		set_error(err, RS_ERR_CONNECT, "cannot start residentd: pipe: %s", strerror(errno));
		return -1;
	}
	if ((pid = fork()) < 0) {
		set_error(err, RS_ERR_CONNECT, "cannot start residentd: fork: %s", strerror(errno));
		close(p[0]), close(p[1]);
		return -1;
	}
	if (pid == 0) {
		close(p[0]);
		setsid();
		if (fork() != 0)
			_exit(0);
		exec_daemon(path, p[1]);
	}
	close(p[1]);
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	while ((n = read(p[0], &e, sizeof e)) < 0 && errno == EINTR)
		;
	close(p[0]);
	if (n == (ssize_t)sizeof e) {
		const char *prog = getenv("RESIDENT_DAEMON");

		set_error(err, RS_ERR_CONNECT, "cannot start %s: %s", prog && prog[0] ? prog : "residentd",
		    strerror(e));
		return -1;
	}
	return 0;
}

/* Milliseconds of a monotonic clock. */
static long long
now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* After starting the daemon: tries to connect until it accepts or the time is up. */
static int
wait_for_daemon(const struct sockaddr_un *sa, rs_error *err)
{
	long long deadline = now_ms() + START_TIMEOUT_MS;
	int fd;

	for (;;) {
		if ((fd = try_connect(sa, 0)) >= 0)
			return fd;
		if (errno != ENOENT && errno != ECONNREFUSED)
			break;
		if (now_ms() >= deadline) {
			set_error(err, RS_ERR_CONNECT,
			    "residentd was started but did not listen on %s within %d seconds", sa->sun_path,
			    START_TIMEOUT_MS / 1000);
			return -1;
		}
		poll(NULL, 0, START_POLL_MS);
	}
	set_error(err, RS_ERR_CONNECT, "cannot connect to %s: %s", sa->sun_path, strerror(errno));
	return -1;
}

int
connect_socket(const char *path, int flags, rs_error *err)
{
	struct sockaddr_un sa;
	int fd;

	memset(&sa, 0, sizeof sa);
	sa.sun_family = AF_UNIX;
	if (strlen(path) >= sizeof sa.sun_path) {
		set_error(err, RS_ERR_INVAL, "the socket path %s is too long", path);
		return -1;
	}
	memcpy(sa.sun_path, path, strlen(path) + 1);
	if ((flags & RS_START_DAEMON) && (flags & RS_NONBLOCK)) {
		set_error(err, RS_ERR_INVAL, "RS_START_DAEMON waits for the daemon: it does not go with RS_NONBLOCK");
		return -1;
	}
	if ((fd = try_connect(&sa, (flags & RS_NONBLOCK) != 0)) >= 0)
		return fd;
	if (errno == EAGAIN) {
		set_error(err, RS_ERR_CONNECT, "residentd at %s takes no more connections now (its queue is full)",
		    path);
		return -1;
	}
	if (errno == ENOENT || errno == ECONNREFUSED) {
		if (flags & RS_START_DAEMON)
			return spawn_daemon(path, err) == 0 ? wait_for_daemon(&sa, err) : -1;
		if (errno == ENOENT)
			set_error(err, RS_ERR_CONNECT, "residentd is not running (no socket at %s)", path);
		else
			set_error(err, RS_ERR_CONNECT, "residentd is not running (nobody listens at %s)", path);
		return -1;
	}
	set_error(err, RS_ERR_CONNECT, "cannot connect to %s: %s", path, strerror(errno));
	return -1;
}
