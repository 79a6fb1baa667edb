/* log — see log.h. Writes whole lines with one write(2) so lines from
 * threads and child processes sharing stderr never interleave mid-line. */
#include "common/log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

static const char *g_prog = "bertd";
static volatile int g_level = LOG_LVL_INFO;
static int g_journal = -1; /* -1 unknown, 0 terminal/file, 1 journald */

static const char *const level_names[] = {"error", "warn", "info", "debug"};
static const char *const level_tags[] = {"ERROR", "WARN ", "INFO ", "DEBUG"};
static const int syslog_prio[] = {3, 4, 6, 7};

void log_init(const char *prog, enum log_level level)
{
	if (prog)
		g_prog = prog;
	g_level = level;
	g_journal = getenv("JOURNAL_STREAM") != NULL;
}

void log_set_level(enum log_level level) { g_level = level; }
enum log_level log_get_level(void) { return (enum log_level)g_level; }

int log_level_parse(const char *s, enum log_level *out)
{
	for (int i = 0; i <= LOG_LVL_DEBUG; i++) {
		if (strcasecmp(s, level_names[i]) == 0) {
			*out = (enum log_level)i;
			return 0;
		}
	}
	if (strcasecmp(s, "warning") == 0) {
		*out = LOG_LVL_WARN;
		return 0;
	}
	return -EINVAL;
}

const char *log_level_name(enum log_level level)
{
	return (level >= 0 && level <= LOG_LVL_DEBUG) ? level_names[level] : "?";
}

void log_msg(enum log_level level, const char *fmt, ...)
{
	if ((int)level > g_level)
		return;
	if (g_journal < 0)
		g_journal = getenv("JOURNAL_STREAM") != NULL;
	int saved_errno = errno;
	char line[2048];
	int n;
	if (g_journal)
		n = snprintf(line, sizeof line, "<%d>%s: ", syslog_prio[level], g_prog);
	else
		n = snprintf(line, sizeof line, "%s %s: ", level_tags[level], g_prog);
	va_list ap;
	va_start(ap, fmt);
	int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
	va_end(ap);
	size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
	if (len > sizeof line - 2)
		len = sizeof line - 2;
	line[len++] = '\n';
	ssize_t w = write(STDERR_FILENO, line, len);
	(void)w;
	errno = saved_errno;
}
