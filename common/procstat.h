/* procstat — is a process still the one we knew? Reads /proc/<pid>/stat.
 * kill(pid, 0) is not enough for peers in shared memory: a killed process
 * stays a zombie (and "exists") until its parent reaps it, and a pid can be
 * reused; the start time tells a reused pid apart. */
#ifndef BERTD_COMMON_PROCSTAT_H
#define BERTD_COMMON_PROCSTAT_H

#include <stdint.h>
#include <sys/types.h>

/* Field 22 of /proc/<pid>/stat (start time in clock ticks since boot) and
 * the state letter in *state; 0 when the process is gone. */
uint64_t procstat_starttime(pid_t pid, char *state);

/* 1 when pid is alive (not a zombie) and started at starttime, else 0. */
int procstat_alive(pid_t pid, uint64_t starttime);

#endif
