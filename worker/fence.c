/* fence — see fence.h. */
#include "worker/fence.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int fence_check(char *why, size_t cap)
{
	const char *path = getenv("BERTD_FENCE"), *mine = getenv("BERTD_ATTEMPT");
	if (!path || !*path || !mine || !*mine)
		return 0;
	char line[256] = "";
	FILE *f = fopen(path, "r");
	if (!f) {
		snprintf(why, cap, "cannot read the attempt fence %s: %s", path, strerror(errno));
		return -EIO;
	}
	if (!fgets(line, sizeof line, f))
		line[0] = '\0';
	fclose(f);
	line[strcspn(line, "\n")] = '\0';
	if (strcmp(line, mine) == 0)
		return 0;
	snprintf(why, cap, "attempt %s is over (%s names %s): nothing of it is put in place", mine, path,
		 line[0] ? line : "no attempt");
	return -ESTALE;
}
