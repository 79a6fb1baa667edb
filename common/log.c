/* log — see log.h. Writes whole lines with one write(2) so lines from
 * threads and child processes sharing stderr never interleave mid-line. */
#include "common/log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
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
	g_journal = log_fd_is_journal(getenv("JOURNAL_STREAM"), STDERR_FILENO);
}

bool log_fd_is_journal(const char *journal_stream, int fd)
{
	unsigned long long dev, ino;
	char tail;
	if (!journal_stream || sscanf(journal_stream, "%llu:%llu%c", &dev, &ino, &tail) != 2)
		return false;
	struct stat st;
	if (fstat(fd, &st) < 0)
		return false;
	return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

int log_format_prefix(char *buf, size_t n, enum log_level level, const char *prog, bool journal,
		      const struct timespec *now)
{
	if ((unsigned)level > LOG_LVL_DEBUG)
		level = LOG_LVL_ERROR;
	if (journal)
		return snprintf(buf, n, "<%d>%s: ", syslog_prio[level], prog);
	/* UTC: gmtime_r never reads the time zone database, so no allocation. */
	struct tm tm;
	time_t sec = now->tv_sec;
	gmtime_r(&sec, &tm);
	return snprintf(buf, n, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s %s: ", tm.tm_year + 1900,
			tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
			now->tv_nsec / 1000000, level_tags[level], prog);
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
	int saved_errno = errno;
	if (g_journal < 0)
		g_journal = log_fd_is_journal(getenv("JOURNAL_STREAM"), STDERR_FILENO);
	char line[2048];
	struct timespec now = {0, 0};
	if (!g_journal)
		clock_gettime(CLOCK_REALTIME, &now);
	int n = log_format_prefix(line, sizeof line, level, g_prog, g_journal, &now);
	if (n < 0)
		n = 0;
	if (n > (int)sizeof line - 2)
		n = (int)sizeof line - 2;
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
