/* log.h: leveled logging to stderr (the journal under systemd). */
#ifndef RESIDENT_LOG_H
#define RESIDENT_LOG_H

enum log_level { LOG_ERROR, LOG_WARN, LOG_INFO, LOG_DEBUG };

void log_set_level(enum log_level l);
/* Parses "error", "warn", "info", "debug"; -1 if unknown. */
int log_level_from_name(const char *s);
void log_msg(enum log_level l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_error(...) log_msg(LOG_ERROR, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_WARN, __VA_ARGS__)
#define log_info(...) log_msg(LOG_INFO, __VA_ARGS__)
#define log_debug(...) log_msg(LOG_DEBUG, __VA_ARGS__)

#endif
