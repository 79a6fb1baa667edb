/* log — leveled logging to stderr for every bertd process.
 *
 * Lines carry a syslog-style "<N>" prefix when stderr is the journal (systemd
 * sets JOURNAL_STREAM), so journald keeps the level; otherwise they read
 * "LEVEL prog: message" for a person at a terminal. Never allocates, safe to
 * call from any thread (one write(2) per line). Not async-signal-safe.
 */
#ifndef BERTD_COMMON_LOG_H
#define BERTD_COMMON_LOG_H

enum log_level { LOG_LVL_ERROR = 0, LOG_LVL_WARN = 1, LOG_LVL_INFO = 2, LOG_LVL_DEBUG = 3 };

/* Sets the program name shown in each line and the most verbose level printed. */
void log_init(const char *prog, enum log_level level);
void log_set_level(enum log_level level);
enum log_level log_get_level(void);

/* Parses "error" | "warn" | "info" | "debug"; returns 0, or -EINVAL. */
int log_level_parse(const char *s, enum log_level *out);
const char *log_level_name(enum log_level level);

void log_msg(enum log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_error(...) log_msg(LOG_LVL_ERROR, __VA_ARGS__)
#define log_warn(...)  log_msg(LOG_LVL_WARN, __VA_ARGS__)
#define log_info(...)  log_msg(LOG_LVL_INFO, __VA_ARGS__)
#define log_debug(...) log_msg(LOG_LVL_DEBUG, __VA_ARGS__)

#endif
