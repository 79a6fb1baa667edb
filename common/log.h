/* log — leveled logging to stderr for every bertd process.
 *
 * Lines carry a syslog-style "<N>" prefix when stderr is the journal, so
 * journald keeps the level and adds its own timestamp; otherwise they read
 * "2025-01-02T03:04:05.678Z LEVEL prog: message" (UTC, milliseconds) for a
 * person at a terminal or a log file. "stderr is the journal" is decided as
 * systemd.exec(5) documents: JOURNAL_STREAM holds "DEV:INODE" of the stream
 * systemd connected, and it counts only while fd 2 still is that stream (a
 * redirect in a unit's shell wrapper keeps the variable but not the journal).
 * Never allocates, safe to call from any thread (one write(2) per line). Not
 * async-signal-safe.
 */
#ifndef BERTD_COMMON_LOG_H
#define BERTD_COMMON_LOG_H

#include <stdbool.h>
#include <stddef.h>
#include <time.h>

enum log_level { LOG_LVL_ERROR = 0, LOG_LVL_WARN = 1, LOG_LVL_INFO = 2, LOG_LVL_DEBUG = 3 };

/* Sets the program name shown in each line and the most verbose level printed. */
void log_init(const char *prog, enum log_level level);
void log_set_level(enum log_level level);
enum log_level log_get_level(void);

/* Parses "error" | "warn" | "info" | "debug"; returns 0, or -EINVAL. */
int log_level_parse(const char *s, enum log_level *out);
const char *log_level_name(enum log_level level);

/* True when fd is the stream journal_stream ("DEV:INODE", the value of
 * JOURNAL_STREAM; NULL or malformed = false) names. */
bool log_fd_is_journal(const char *journal_stream, int fd);

/* Writes the line prefix into buf (at most n bytes, NUL-terminated): for the
 * journal "<PRIO>prog: ", else "YYYY-MM-DDTHH:MM:SS.mmmZ LEVEL prog: " for
 * the UTC time now. Returns its length (snprintf's rule). Exposed for tests. */
int log_format_prefix(char *buf, size_t n, enum log_level level, const char *prog, bool journal,
		      const struct timespec *now);

void log_msg(enum log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_error(...) log_msg(LOG_LVL_ERROR, __VA_ARGS__)
#define log_warn(...)  log_msg(LOG_LVL_WARN, __VA_ARGS__)
#define log_info(...)  log_msg(LOG_LVL_INFO, __VA_ARGS__)
#define log_debug(...) log_msg(LOG_LVL_DEBUG, __VA_ARGS__)

#endif
