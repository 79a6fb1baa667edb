/* procstat — see procstat.h. */
#include "common/procstat.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

uint64_t procstat_starttime(pid_t pid, char *state)
{
	char path[64], buf[1024];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	char *p = strrchr(buf, ')'); /* comm may hold spaces and parens */
	if (!p || p[1] != ' ')
		return 0;
	p += 2;
	*state = *p;
	/* p is at field 3; skip to field 22 */
	for (int field = 3; field < 22 && p; field++) {
		p = strchr(p, ' ');
		if (p)
			p++;
	}
	return p ? strtoull(p, NULL, 10) : 0;
}

int procstat_alive(pid_t pid, uint64_t starttime)
{
	char state = 0;
	uint64_t st = procstat_starttime(pid, &state);
	if (st == 0 || st != starttime)
		return 0;
	return state != 'Z' && state != 'X' && state != 'x';
}
