/* cluster — see cluster.h. */
#include "daemon/cluster.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"

static int relay_listen(cluster_attempt *a, const char *relay_host, int port);

int cluster_attempt_open(cluster_attempt *a, const char *relay_host, const char *job_id)
{
	unsigned char rnd[CLUSTER_TOKEN_HEX / 2];
	a->listen_fd = -1;
	a->fence[0] = '\0';
	a->relay_timeout_ms = CLUSTER_RELAY_TIMEOUT_MS;
	if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd)
		return -EIO;
	for (size_t i = 0; i < sizeof rnd; i++)
		snprintf(a->token + 2 * i, 3, "%02x", rnd[i]);
	snprintf(a->slurm_name, sizeof a->slurm_name, "bertd-%.40s-%.8s", job_id, a->token);

	return relay_listen(a, relay_host, 0);
}

/* Listens for a's relay on port (0: the kernel's) of relay_host's address
 * (every address for a name) and sets a->addr. */
static int relay_listen(cluster_attempt *a, const char *relay_host, int port)
{
	char host[256] = "";
	if (relay_host && *relay_host)
		snprintf(host, sizeof host, "%s", relay_host);
	else if (gethostname(host, sizeof host - 1) < 0)
		return -errno;
	struct sockaddr_in6 a6 = {.sin6_family = AF_INET6, .sin6_addr = in6addr_any, .sin6_port = htons((uint16_t)port)};
	struct sockaddr_in a4 = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY),
				 .sin_port = htons((uint16_t)port)};
	struct sockaddr *sa = (struct sockaddr *)&a6;
	socklen_t len = sizeof a6;
	int family = AF_INET6;
	if (inet_pton(AF_INET, host, &a4.sin_addr) == 1) {
		sa = (struct sockaddr *)&a4;
		len = sizeof a4;
		family = AF_INET;
	} else if (inet_pton(AF_INET6, host, &a6.sin6_addr) != 1) {
		a6.sin6_addr = in6addr_any; /* a name: every address, v4 mapped too */
	}
	int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	int rc = 0, one = 1;
	/* a later daemon listens on the same port again: the earlier one's
	 * connections may linger in TIME_WAIT */
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (bind(fd, sa, len) < 0 || listen(fd, 64) < 0 || getsockname(fd, sa, &len) < 0) {
		rc = -errno;
		close(fd);
		return rc;
	}
	port = family == AF_INET ? ntohs(a4.sin_port) : ntohs(a6.sin6_port);
	bool v6lit = strchr(host, ':') != NULL;
	snprintf(a->addr, sizeof a->addr, "%s%s%s:%d", v6lit ? "[" : "", host, v6lit ? "]" : "", port);
	a->listen_fd = fd;
	return 0;
}

int cluster_attempt_reopen(cluster_attempt *a, const char *relay_host)
{
	const char *colon = strrchr(a->addr, ':');
	char *end;
	long port = colon ? strtol(colon + 1, &end, 10) : 0;
	a->listen_fd = -1;
	if (!colon || *end || port <= 0 || port > 65535 || strlen(a->token) != CLUSTER_TOKEN_HEX)
		return -EINVAL;
	char was[sizeof a->addr];
	snprintf(was, sizeof was, "%s", a->addr);
	int rc = relay_listen(a, relay_host, (int)port);
	if (rc == 0 && strcmp(was, a->addr) != 0) { /* relay_host changed: the ranks dial the old one */
		cluster_attempt_close(a);
		snprintf(a->addr, sizeof a->addr, "%s", was);
		return -EADDRNOTAVAIL;
	}
	return rc;
}

void cluster_attempt_close(cluster_attempt *a)
{
	if (a->listen_fd >= 0)
		close(a->listen_fd);
	a->listen_fd = -1;
}

bool cluster_token_ok(const cluster_attempt *a, const char *token)
{
	if (!token || strlen(token) != CLUSTER_TOKEN_HEX)
		return false;
	unsigned char diff = 0;
	for (size_t i = 0; i < CLUSTER_TOKEN_HEX; i++)
		diff |= (unsigned char)(a->token[i] ^ token[i]);
	return diff == 0;
}

void cluster_srun_argv(cluster_argv *out, const char *srun, int nodes, int per_node, int gpus_per_node,
		       int immediate_s, const cluster_attempt *a, const char *worker_bin, const char *job_json)
{
	static char job_opt[] = "--job";
	/* --opt=value throughout: srun's --immediate takes an optional value */
	snprintf(out->num[0], sizeof out->num[0], "--nodes=%d", nodes);
	snprintf(out->num[1], sizeof out->num[1], "--ntasks-per-node=%d", per_node);
	snprintf(out->num[2], sizeof out->num[2], "--immediate=%d", immediate_s);
	snprintf(out->num[3], sizeof out->num[3], "--job-name=%s", a->slurm_name);
	int n = 0;
	out->argv[n++] = (char *)srun;
	out->argv[n++] = out->num[0];
	out->argv[n++] = out->num[1];
	out->argv[n++] = out->num[2];
	out->argv[n++] = out->num[3];
	if (gpus_per_node > 0) {
		snprintf(out->num[4], sizeof out->num[4], "--gpus-per-node=%d", gpus_per_node);
		out->argv[n++] = out->num[4];
	}
	out->argv[n++] = (char *)worker_bin;
	out->argv[n++] = job_opt;
	out->argv[n++] = (char *)job_json;
	out->argv[n] = NULL;
}

int cluster_srun_env(cluster_env **out, char *const base[], int threads, const cluster_attempt *a,
		     const char *slurm_conf)
{
	size_t nb = 0;
	while (base[nb])
		nb++;
	cluster_env *e = calloc(1, sizeof *e + (nb + CLUSTER_ENV_OWN + 1) * sizeof(char *));
	if (!e)
		return -ENOMEM;
	int k = 0;
	snprintf(e->own[k++], sizeof e->own[0], "OMP_NUM_THREADS=%d", threads);
	snprintf(e->own[k++], sizeof e->own[0], "OPENBLAS_NUM_THREADS=%d", threads);
	snprintf(e->own[k++], sizeof e->own[0], "BERTD_RELAY=%s", a->addr);
	snprintf(e->own[k++], sizeof e->own[0], "BERTD_RELAY_TOKEN=%s", a->token);
	snprintf(e->own[k++], sizeof e->own[0], "BERTD_RELAY_TIMEOUT_MS=%d", a->relay_timeout_ms);
	if (a->fence[0]) {
		snprintf(e->own[k++], sizeof e->own[0], "BERTD_ATTEMPT=%s", a->slurm_name);
		snprintf(e->own[k++], sizeof e->own[0], "BERTD_FENCE=%s", a->fence);
	}
	if (slurm_conf && *slurm_conf)
		snprintf(e->own[k++], sizeof e->own[0], "SLURM_CONF=%s", slurm_conf);
	size_t n = 0;
	for (int i = 0; i < k; i++)
		e->envp[n++] = e->own[i];
	for (size_t i = 0; i < nb; i++)
		e->envp[n++] = base[i];
	e->envp[n] = NULL;
	*out = e;
	return 0;
}

int cluster_dataset_verdict(const char (*node)[64], const char (*sha)[CLUSTER_TOKEN_HEX + 1], int world,
			    const char *dataset, char *why, size_t cap)
{
	for (int i = 0; i < world; i++) {
		if (sha[i][0])
			continue;
		snprintf(why, cap, "dataset \"%s\" is missing on node %s (no readable manifest.json at the job's "
			 "dataset path there)", dataset, node[i]);
		return -ENOENT;
	}
	for (int i = 1; i < world; i++) {
		if (strcmp(sha[i], sha[0]) == 0)
			continue;
		snprintf(why, cap,
			 "dataset \"%s\" differs between nodes: %s has content digest %.12s, %s has %.12s (every "
			 "node needs the same prepared dataset)",
			 dataset, node[0], sha[0], node[i], sha[i]);
		return -EINVAL;
	}
	return 0;
}

/* text into path, atomically and durably (tmp, fsync, rename). */
static int write_atomic(const char *path, const char *text)
{
	char tmp[1200];
	snprintf(tmp, sizeof tmp, "%s.tmp", path);
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return -errno;
	size_t n = strlen(text);
	int rc = write(fd, text, n) == (ssize_t)n ? 0 : -EIO;
	if (rc == 0 && fsync(fd) < 0)
		rc = -errno;
	close(fd);
	if (rc == 0 && rename(tmp, path) < 0)
		rc = -errno;
	if (rc < 0)
		unlink(tmp);
	return rc;
}

int cluster_fence_open(cluster_attempt *a, const char *job_dir)
{
	char line[128];
	if ((size_t)snprintf(a->fence, sizeof a->fence, "%s/attempt", job_dir) >= sizeof a->fence) {
		a->fence[0] = '\0';
		return -ENAMETOOLONG;
	}
	snprintf(line, sizeof line, "%s\n", a->slurm_name);
	int rc = write_atomic(a->fence, line);
	if (rc < 0)
		a->fence[0] = '\0';
	return rc;
}

int cluster_fence_close(const cluster_attempt *a)
{
	return a->fence[0] ? write_atomic(a->fence, "over\n") : 0;
}

void cluster_scancel(const cluster_attempt *a, const char *srun, const char *slurm_conf)
{
	char bin[1100] = "scancel", name[128], conf[1100] = "";
	const char *slash = srun ? strrchr(srun, '/') : NULL;
	if (slash)
		snprintf(bin, sizeof bin, "%.*s/scancel", (int)(slash - srun), srun);
	snprintf(name, sizeof name, "--name=%s", a->slurm_name);
	if (slurm_conf && *slurm_conf)
		snprintf(conf, sizeof conf, "SLURM_CONF=%s", slurm_conf);
	char *argv[] = {bin, "--quiet", name, NULL};
	char *envp[] = {"PATH=/usr/bin:/bin", conf[0] ? conf : NULL, NULL};
	/* Twice forked: the grandchild belongs to init, the daemon waits
	 * only for the short-lived middle one. */
	pid_t pid = fork();
	if (pid < 0) {
		log_warn("scancel %s: fork: %s", a->slurm_name, strerror(errno));
		return;
	}
	if (pid == 0) {
		if (fork() == 0) {
			int dn = open("/dev/null", O_RDWR);
			if (dn >= 0) {
				dup2(dn, 0);
				dup2(dn, 1);
				dup2(dn, 2);
			}
			execve(bin, argv, envp);
			if (!slash)
				execvpe(bin, argv, envp);
			_exit(127);
		}
		_exit(0);
	}
	waitpid(pid, NULL, 0);
}

/* Whether a sinfo %t state keeps a node from taking a new job. */
static bool state_down(const char *st)
{
	static const char *const bad[] = {"down", "drain", "drng", "drained", "draining", "fail", "failg",
					  "failing", "maint", "unk", "unknown", "futr", "future", "inval",
					  "npc"};
	if (strchr(st, '*')) /* not responding */
		return true;
	size_t n = strspn(st, "abcdefghijklmnopqrstuvwxyz_");
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
		if (strlen(bad[i]) == n && strncmp(st, bad[i], n) == 0)
			return true;
	return false;
}

static void add_down(cluster_nodes *out, const char *name, const char *st)
{
	size_t used = strlen(out->down), cap = sizeof out->down - 6; /* room for ", ..." */
	out->ndown++;
	if (out->cut)
		return;
	int w = snprintf(out->down + used, cap - used, "%s%s (%s)", used ? ", " : "", name, st);
	if (w >= 0 && (size_t)w < cap - used)
		return;
	out->down[used] = '\0'; /* does not fit: the whole entries so far, then ", ..." */
	strcat(out->down, ", ...");
	out->cut = true;
}

int cluster_sinfo_parse(const char *text, cluster_nodes *out, char *why, size_t cap)
{
	*out = (cluster_nodes){0};
	char (*seen)[64] = NULL;
	size_t nseen = 0, room = 0;
	int rc = 0;
	for (const char *line = text; *line && rc == 0;) {
		const char *end = strchr(line, '\n');
		size_t len = end ? (size_t)(end - line) : strlen(line);
		char name[64], st[32], extra;
		char buf[256];
		snprintf(buf, sizeof buf, "%.*s", (int)(len < sizeof buf ? len : sizeof buf - 1), line);
		line += len + (end ? 1 : 0);
		if (strspn(buf, " \t\r") == strlen(buf))
			continue;
		if (len >= sizeof buf || sscanf(buf, "%63s %31s %c", name, st, &extra) != 2) {
			snprintf(why, cap, "sinfo printed \"%.80s\" where \"<node> <state>\" was expected", buf);
			rc = -EINVAL;
			break;
		}
		bool dup = false;
		for (size_t i = 0; i < nseen && !dup; i++)
			dup = strcmp(seen[i], name) == 0;
		if (dup)
			continue;
		if (nseen == room) {
			size_t nr = room ? room * 2 : 64;
			char (*grown)[64] = realloc(seen, nr * sizeof *seen);
			if (!grown) {
				snprintf(why, cap, "out of memory reading sinfo's node list");
				rc = -ENOMEM;
				break;
			}
			seen = grown;
			room = nr;
		}
		snprintf(seen[nseen++], sizeof seen[0], "%s", name);
		out->total++;
		if (state_down(st))
			add_down(out, name, st);
		else
			out->up++;
	}
	free(seen);
	return rc;
}

/* The first line of s (at most cap-1 bytes) into out. */
static void first_line(const char *s, char *out, size_t cap)
{
	size_t n = strcspn(s, "\n");
	snprintf(out, cap, "%.*s", (int)(n < cap ? n : cap - 1), s);
}

static int64_t mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Runs the Slurm tool beside srun (else PATH's) with args (at most 8,
 * NULL-ended) and SLURM_CONF=slurm_conf for at most timeout_ms. 0 with
 * *text its stdout (caller frees); or a negative errno with why naming
 * what failed (its exit status and first line of stderr, or the deadline). */
static int run_tool(const char *srun, const char *tool, char *const args[], const char *slurm_conf,
		    int timeout_ms, char **text, char *why, size_t cap)
{
	char bin[1100], conf[1100] = "";
	const char *slash = srun ? strrchr(srun, '/') : NULL;
	*text = NULL;
	if (slash)
		snprintf(bin, sizeof bin, "%.*s/%s", (int)(slash - srun), srun, tool);
	else
		snprintf(bin, sizeof bin, "%s", tool);
	if (slurm_conf && *slurm_conf)
		snprintf(conf, sizeof conf, "SLURM_CONF=%s", slurm_conf);
	char *argv[10] = {bin};
	for (int i = 0; i < 8 && args[i]; i++)
		argv[i + 1] = args[i];
	char *envp[] = {"PATH=/usr/bin:/bin", conf[0] ? conf : NULL, NULL};
	int po[2], pe[2];
	if (pipe2(po, O_CLOEXEC) < 0)
		return snprintf(why, cap, "%s: pipe: %s", tool, strerror(errno)), -EIO;
	if (pipe2(pe, O_CLOEXEC) < 0) {
		int e = errno;
		close(po[0]);
		close(po[1]);
		return snprintf(why, cap, "%s: pipe: %s", tool, strerror(e)), -EIO;
	}
	/* posix_spawn, not fork: this may run on an HTTP thread of a daemon that
	 * may be large; its own process group, so a timeout kills all of it */
	posix_spawn_file_actions_t fa;
	posix_spawnattr_t at;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
	posix_spawn_file_actions_adddup2(&fa, po[1], 1);
	posix_spawn_file_actions_adddup2(&fa, pe[1], 2);
	posix_spawnattr_init(&at);
	posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP);
	posix_spawnattr_setpgroup(&at, 0);
	pid_t pid = -1;
	int se = slash ? posix_spawn(&pid, bin, &fa, &at, argv, envp)
		       : posix_spawnp(&pid, bin, &fa, &at, argv, envp);
	posix_spawn_file_actions_destroy(&fa);
	posix_spawnattr_destroy(&at);
	close(po[1]);
	close(pe[1]);
	if (se) {
		close(po[0]);
		close(pe[0]);
		return snprintf(why, cap, "cannot run %s: %s", bin, strerror(se)), -se;
	}
	size_t cap_o = 64 * 1024, n_o = 0, n_e = 0;
	char *o = malloc(cap_o), err[512] = "";
	int64_t deadline = mono_ms() + timeout_ms;
	bool timed_out = false, open_o = true, open_e = true;
	int rc = o ? 0 : -ENOMEM;
	while ((open_o || open_e) && rc == 0) {
		int64_t left = deadline - mono_ms();
		if (left <= 0) {
			timed_out = true;
			break;
		}
		struct pollfd pf[2] = {{.fd = open_o ? po[0] : -1, .events = POLLIN},
				       {.fd = open_e ? pe[0] : -1, .events = POLLIN}};
		int pr = poll(pf, 2, (int)left);
		if (pr < 0 && errno != EINTR)
			rc = -errno;
		if (pr <= 0)
			continue;
		if (open_o && pf[0].revents) {
			if (n_o + 4096 + 1 > cap_o) {
				char *g = cap_o < (64u << 20) ? realloc(o, cap_o * 2) : NULL;
				if (!g) {
					rc = -E2BIG;
					break;
				}
				o = g;
				cap_o *= 2;
			}
			ssize_t r = read(po[0], o + n_o, cap_o - n_o - 1);
			if (r > 0)
				n_o += (size_t)r;
			else if (r == 0 || errno != EINTR)
				open_o = false;
		}
		if (open_e && pf[1].revents) {
			char tmp[512];
			ssize_t r = read(pe[0], tmp, sizeof tmp);
			if (r > 0) {
				size_t take = (size_t)r < sizeof err - 1 - n_e ? (size_t)r : sizeof err - 1 - n_e;
				memcpy(err + n_e, tmp, take);
				n_e += take;
				err[n_e] = '\0';
			} else if (r == 0 || errno != EINTR) {
				open_e = false;
			}
		}
	}
	close(po[0]);
	close(pe[0]);
	/* Output closed: the tool still gets what is left of the deadline to exit
	 * (its pidfd; without one, the wait is unbounded as before pidfds). */
	int pfd = timed_out || rc ? -1 : (int)syscall(SYS_pidfd_open, pid, 0);
	if (pfd >= 0) {
		int64_t left = deadline - mono_ms();
		struct pollfd pf = {.fd = pfd, .events = POLLIN};
		int pr;
		while ((pr = poll(&pf, 1, left > 0 ? (int)left : 0)) < 0 && errno == EINTR)
			left = deadline - mono_ms();
		timed_out = pr == 0;
		close(pfd);
	}
	if (timed_out || rc)
		kill(-pid, SIGKILL);
	int st = 0;
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	char line[300];
	first_line(err, line, sizeof line);
	if (timed_out) {
		snprintf(why, cap, "%s did not answer within %d ms (is slurmctld up?)", bin, timeout_ms);
		rc = -ETIMEDOUT;
	} else if (rc) {
		snprintf(why, cap, "reading %s's output: %s", bin, strerror(-rc));
	} else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		char how[64];
		if (WIFEXITED(st))
			snprintf(how, sizeof how, "exited with %d", WEXITSTATUS(st));
		else
			snprintf(how, sizeof how, "was killed by signal %d", WIFSIGNALED(st) ? WTERMSIG(st) : 0);
		snprintf(why, cap, "%s %s%s%s", bin, how, line[0] ? ": " : "", line);
		rc = -EIO;
	} else {
		o[n_o] = '\0';
		*text = o;
		o = NULL;
	}
	free(o);
	return rc;
}

int cluster_sinfo(const char *srun, const char *slurm_conf, int timeout_ms, cluster_nodes *out, char *why,
		  size_t cap)
{
	char *args[] = {"-h", "-N", "-o", "%N %t", NULL}, *text = NULL;
	int rc = run_tool(srun, "sinfo", args, slurm_conf, timeout_ms, &text, why, cap);
	if (rc == 0)
		rc = cluster_sinfo_parse(text, out, why, cap);
	free(text);
	return rc;
}

/* Whether a Slurm job state (squeue's %T, sacct's State) is final. */
static bool state_final(const char *st)
{
	static const char *const live[] = {"PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED",
					   "REQUEUED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", ""};
	for (size_t i = 0; i < sizeof live / sizeof live[0]; i++)
		if (strcmp(st, live[i]) == 0)
			return false;
	return true;
}

/* The first line of text as "STATE|REASON" into state and reason. */
static void split_state(const char *text, char *state, size_t scap, char *reason, size_t rcap)
{
	char line[256];
	first_line(text ? text : "", line, sizeof line);
	char *bar = strchr(line, '|');
	if (bar)
		*bar = '\0';
	char *sp = strchr(line, ' '); /* sacct: "CANCELLED by 0" */
	if (sp)
		*sp = '\0';
	snprintf(state, scap, "%s", line);
	snprintf(reason, rcap, "%s", bar ? bar + 1 : "");
}

int cluster_slurm_state(const cluster_attempt *a, const char *srun, const char *slurm_conf, int timeout_ms,
			char *out, size_t cap)
{
	char name[128], why[300], state[64] = "", reason[128] = "", *text = NULL;
	int64_t deadline = mono_ms() + timeout_ms;
	snprintf(name, sizeof name, "--name=%s", a->slurm_name);
	out[0] = '\0';
	/* sacct where accounting is kept: the final state at once */
	char *sacct[] = {"-n", "-X", "-P", name, "-o", "State,Reason", NULL};
	if (run_tool(srun, "sacct", sacct, slurm_conf, timeout_ms, &text, why, sizeof why) == 0)
		split_state(text, state, sizeof state, reason, sizeof reason);
	free(text);
	/* else slurmctld's record (kept MinJobAge after the end): squeue,
	 * again while the job is still completing, up to the deadline */
	char *squeue[] = {"-h", "-t", "all", name, "-o", "%T|%r", NULL};
	while (!state_final(state)) {
		int64_t left = deadline - mono_ms();
		if (left <= 0)
			break;
		text = NULL;
		int rc = run_tool(srun, "squeue", squeue, slurm_conf, (int)left, &text, why, sizeof why);
		if (rc == 0)
			split_state(text, state, sizeof state, reason, sizeof reason);
		free(text);
		if (rc < 0 || !state[0])
			break;
		if (!state_final(state))
			poll(NULL, 0, 100);
	}
	if (!state[0])
		return -ENOENT;
	if (reason[0] && strcmp(reason, "None") != 0)
		snprintf(out, cap, "%s (%s)", state, reason);
	else
		snprintf(out, cap, "%s", state);
	return 0;
}

bool cluster_state_own(const char *state)
{
	static const char *const own[] = {"CANCELLED", "NODE_FAIL", "TIMEOUT", "PREEMPTED", "BOOT_FAIL",
					  "DEADLINE", "OUT_OF_MEMORY"};
	for (size_t i = 0; i < sizeof own / sizeof own[0]; i++) {
		size_t n = strlen(own[i]);
		if (strncmp(state, own[i], n) == 0 && (state[n] == '\0' || state[n] == ' '))
			return true;
	}
	return false;
}
