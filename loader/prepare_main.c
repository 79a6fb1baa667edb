/* bertd-prepare — command line front end of prepare.c: raw corpus files to
 * a dataset directory of token shards. Run by hand, or by the daemon as a
 * child for POST /v1/datasets (it reads --progress-fd lines and the final
 * JSON line on stdout). This file only parses options and reports; it must
 * never hold preparation logic.
 *
 * A run killed before it finished leaves its work directory (prepare.h);
 * the same command again continues from its finished shards (--fresh
 * starts over). SOURCE_DATE_EPOCH, when set, is the manifest's "created"
 * (reproducible-builds.org), so two preparations of the same corpus can
 * be compared byte for byte.
 *
 * Run by the daemon (BERTD_CHANNEL set, --progress-fd its socket), it
 * outlives the daemon: the progress lines travel as common/chan.h messages
 * (kept until a daemon acknowledges them, sent again to a later daemon
 * that connects to <BERTD_CHANNEL>.sock), and at exit it writes its exit
 * record <BERTD_CHANNEL>.exit, so a daemon that was not there accounts for
 * its end (docs/architecture.md, "Jobs outlive the daemon").
 *
 * Exit codes are bertd's common ones (common/exitcodes.h): 0 done;
 * 1 internal error; 2 usage (bad options, or the output exists already);
 * 3 out of memory; 5 data error (no inputs, unreadable or malformed input,
 * empty corpus, vocab missing / unusable / lacking a special token);
 * 7 I/O error writing the output.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <jansson.h>

#include "common/chan.h"
#include "common/exitcodes.h"
#include "common/log.h"
#include "loader/prepare.h"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: bertd-prepare -o DATASET_DIR (--vocab FILE | --train-vocab SIZE) [options] INPUT...\n"
		"\n"
		"Tokenizes a corpus once into memory-mappable token shards for bertd.\n"
		"INPUT is a file, a directory (every file below it) or a glob pattern; gzip, zstd,\n"
		"xz and bzip2 files are decompressed and tar archives read member by member\n"
		"(told by their first bytes, not their names). Every file must be UTF-8 text.\n"
		"\n"
		"  -o, --output DIR           dataset directory to create (must not exist); built in\n"
		"                             .DIR.partial beside it, which a run killed midway leaves\n"
		"                             and the same command resumes from\n"
		"      --fresh                discard such an interrupted run's work instead\n"
		"  -f, --format text|jsonl    text: one sentence per line, blank line = new document\n"
		"                             jsonl: one object per line, its text = one document\n"
		"      --text-field NAME      jsonl field holding the text (default \"text\")\n"
		"      --vocab FILE           BERT vocab.txt to tokenize with\n"
		"      --train-vocab SIZE     train a WordPiece vocab of SIZE entries on the corpus\n"
		"      --lowercase, --cased   uncased or cased pipeline (default: inferred from the\n"
		"                             vocab; uncased when training)\n"
		"      --shard-tokens N       start a new shard after N tokens (default 67108864)\n"
		"      --max-sentence-tokens N  cut longer sentences (default 510, 0 = never)\n"
		"  -j, --jobs N               tokenizing threads (default: online CPUs)\n"
		"      --progress-fd N        write JSON progress lines to file descriptor N\n"
		"      --root DIR             confine reading to DIR (repeatable): inputs and the vocab\n"
		"                             must lie under a root, and a symbolic link leading out\n"
		"                             of its root is skipped (the daemon passes its data_roots)\n"
		"      --max-depth N          fail below N directory levels, 1..256 (default 32)\n"
		"      --max-files N          fail past N input files (default 1000000)\n"
		"      --max-bytes N          fail past N input bytes (default 0 = unlimited)\n"
		"      --include PATTERN      read only found files and archive members matching a\n"
		"                             pattern (repeatable; fnmatch; without '/': the base name)\n"
		"      --exclude PATTERN      do not read found files and members matching it\n"
		"                             (repeatable); an INPUT naming a file is always read\n"
		"  -v, --verbose              more log output\n"
		"  -h, --help                 this text\n"
		"\n"
		"Prints a JSON summary line on stdout (\"ok\":true|false).\n"
		"Exit codes: 0 ok, 1 internal, 2 usage or output exists, 3 out of memory,\n"
		"5 input or vocab error, 7 cannot write the output.\n");
}

static int parse_u64(const char *s, uint64_t max, uint64_t *out)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || end == s || *end || s[0] == '-' || v > max)
		return -EINVAL;
	*out = v;
	return 0;
}

/* The daemon's line when BERTD_CHANNEL is set (daemon_open): progress
 * lines from prepare_run reach it through a pipe that a relay thread
 * reads; the thread also takes a later daemon's connection and its
 * acknowledgements. Only the relay thread uses ch while prepare_run runs,
 * only main before and after. */
static struct daemon_line {
	bool on;
	chan ch;
	int pipe_rd, pipe_wr;  /* prepare_run writes its progress lines to pipe_wr */
	pthread_t relay;
	bool relaying;
} dl = {.pipe_rd = -1, .pipe_wr = -1};

/* Sends one progress object to the daemon (kept until acknowledged). */
static void daemon_send(json_t *j)
{
	int rc = chan_send(&dl.ch, json_incref(j), false);
	if (rc < 0)
		log_debug("daemon channel: %s", strerror(-rc));
}

/* Takes what the daemon sent (acknowledgements, a new daemon's
 * connection: chan_next); nothing else is expected of it. */
static void daemon_poll(void)
{
	json_t *in;
	while (chan_next(&dl.ch, &in) == 1)
		json_decref(in);
}

static void *relay_main(void *arg)
{
	(void)arg;
	char buf[8192];
	size_t len = 0;
	for (;;) {
		struct pollfd p[3] = {{.fd = dl.pipe_rd, .events = POLLIN},
				      {.fd = dl.ch.fd, .events = POLLIN},
				      {.fd = dl.ch.listen_fd, .events = POLLIN}};
		if (poll(p, 3, 1000) < 0 && errno != EINTR)
			break;
		daemon_poll();
		if (!(p[0].revents & (POLLIN | POLLHUP)))
			continue;
		ssize_t n = read(dl.pipe_rd, buf + len, sizeof buf - len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break; /* prepare_run is done */
		len += (size_t)n;
		char *nl;
		while ((nl = memchr(buf, '\n', len))) {
			size_t k = (size_t)(nl - buf);
			json_t *m = json_loadb(buf, k, 0, NULL);
			if (json_is_object(m))
				daemon_send(m);
			json_decref(m);
			memmove(buf, nl + 1, len - k - 1);
			len -= k + 1;
		}
		if (len == sizeof buf)
			len = 0; /* not a progress line: prepare.c's are short */
	}
	return NULL;
}

/* With BERTD_CHANNEL set and fd the daemon's socket: the line that
 * outlives the daemon, and *progress_fd the pipe prepare_run writes to.
 * Without: nothing (the plain progress fd, run by hand). */
static void daemon_open(int *progress_fd)
{
	const char *base = getenv(CHAN_ENV);
	if (!base || !*base || *progress_fd < 0)
		return;
	/* chan reads it without waiting (chan_next) */
	fcntl(*progress_fd, F_SETFL, fcntl(*progress_fd, F_GETFL) | O_NONBLOCK);
	pid_t parent = getppid();
	int rc = chan_open(&dl.ch, *progress_fd, base, true, "prepare", 0);
	if (rc < 0) {
		/* no daemon could adopt it: it goes with this one, as before */
		log_warn("cannot listen on %s.sock (%s): this preparation ends with the daemon", base, strerror(-rc));
		if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent)
			raise(SIGKILL);
	}
	dl.on = true;
	int p[2];
	if (pipe2(p, O_CLOEXEC) < 0) {
		log_warn("pipe: %s; progress goes to the daemon at the end only", strerror(errno));
		*progress_fd = -1;
		return;
	}
	dl.pipe_rd = p[0];
	dl.pipe_wr = p[1];
	if (pthread_create(&dl.relay, NULL, relay_main, NULL) != 0) {
		log_warn("cannot start the progress relay; progress goes to the daemon at the end only");
		close(p[0]);
		close(p[1]);
		dl.pipe_rd = dl.pipe_wr = -1;
		*progress_fd = -1;
		return;
	}
	dl.relaying = true;
	*progress_fd = dl.pipe_wr;
}

/* prepare_run is over: the relay passes on what is left in the pipe and
 * stops; ch is main's again. */
static void daemon_relay_stop(void)
{
	if (!dl.relaying)
		return;
	close(dl.pipe_wr);
	dl.pipe_wr = -1;
	pthread_join(dl.relay, NULL);
	close(dl.pipe_rd);
	dl.pipe_rd = -1;
	dl.relaying = false;
}

/* The end: the exit record with code and whatever no daemon acknowledged. */
static int daemon_close(int code)
{
	if (!dl.on)
		return code;
	daemon_relay_stop();
	daemon_poll();
	chan_close(&dl.ch, code);
	dl.on = false;
	return code;
}

/* One JSON line on stdout and, when the daemon listens, on the progress fd
 * (or its channel). */
static void emit_line(json_t *j, int progress_fd)
{
	char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
	if (!s)
		return;
	printf("%s\n", s);
	fflush(stdout);
	if (dl.on) {
		daemon_relay_stop();
		daemon_send(j);
	} else if (progress_fd >= 0) {
		size_t n = strlen(s);
		s[n] = '\n';
		int rc = prepare_write_line(progress_fd, s, n + 1);
		if (rc < 0)
			log_debug("progress fd: %s", strerror(-rc));
	}
	free(s);
}

static int fail_json(int code, const char *msg, int progress_fd)
{
	json_t *j = json_pack("{s:b, s:s, s:i}", "ok", 0, "error", msg, "exit_code", code);
	emit_line(j, progress_fd);
	json_decref(j);
	return daemon_close(code);
}

int main(int argc, char **argv)
{
	enum { O_TEXT_FIELD = 256, O_VOCAB, O_TRAIN, O_LOWER, O_CASED, O_SHARD, O_MAXSENT, O_PFD,
	       O_ROOT, O_MAXDEPTH, O_MAXFILES, O_MAXBYTES, O_INCLUDE, O_EXCLUDE, O_FRESH };
	static const struct option longopts[] = {
		{"output", required_argument, NULL, 'o'},
		{"format", required_argument, NULL, 'f'},
		{"text-field", required_argument, NULL, O_TEXT_FIELD},
		{"vocab", required_argument, NULL, O_VOCAB},
		{"train-vocab", required_argument, NULL, O_TRAIN},
		{"lowercase", no_argument, NULL, O_LOWER},
		{"cased", no_argument, NULL, O_CASED},
		{"shard-tokens", required_argument, NULL, O_SHARD},
		{"max-sentence-tokens", required_argument, NULL, O_MAXSENT},
		{"jobs", required_argument, NULL, 'j'},
		{"progress-fd", required_argument, NULL, O_PFD},
		{"root", required_argument, NULL, O_ROOT},
		{"max-depth", required_argument, NULL, O_MAXDEPTH},
		{"max-files", required_argument, NULL, O_MAXFILES},
		{"max-bytes", required_argument, NULL, O_MAXBYTES},
		{"include", required_argument, NULL, O_INCLUDE},
		{"exclude", required_argument, NULL, O_EXCLUDE},
		{"fresh", no_argument, NULL, O_FRESH},
		{"verbose", no_argument, NULL, 'v'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	log_init("bertd-prepare", LOG_LVL_INFO);
	/* a progress reader that goes away must not kill us */
	signal(SIGPIPE, SIG_IGN);
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	prepare_opts o = {.lowercase = -1, .max_sentence_tokens = 510,
			  .threads = ncpu > 0 ? (int)(ncpu < 256 ? ncpu : 256) : 1, .progress_fd = -1};
	uint64_t v;
	char bad[256] = "";
	/* static: reachable until exit, as the options pointing into it */
	static const char **roots, **include, **exclude;
	roots = calloc((size_t)argc, sizeof *roots); /* at most one per argument */
	include = calloc((size_t)argc, sizeof *include);
	exclude = calloc((size_t)argc, sizeof *exclude);
	if (!roots || !include || !exclude)
		return fail_json(BERTD_EXIT_OOM, "out of memory", -1);
	int c;
	while ((c = getopt_long(argc, argv, "o:f:j:vh", longopts, NULL)) != -1) {
		switch (c) {
		case 'o':
			o.out_dir = optarg;
			break;
		case 'f':
			if (!strcmp(optarg, "text"))
				o.format = PREPARE_TEXT;
			else if (!strcmp(optarg, "jsonl"))
				o.format = PREPARE_JSONL;
			else
				snprintf(bad, sizeof bad, "--format must be text or jsonl");
			break;
		case O_TEXT_FIELD:
			o.text_field = optarg;
			break;
		case O_VOCAB:
			o.vocab_path = optarg;
			break;
		case O_TRAIN:
			if (parse_u64(optarg, 1u << 24, &v) || v < 16)
				snprintf(bad, sizeof bad, "--train-vocab wants 16..16777216");
			else
				o.train_vocab_size = (uint32_t)v;
			break;
		case O_LOWER:
			o.lowercase = 1;
			break;
		case O_CASED:
			o.lowercase = 0;
			break;
		case O_SHARD:
			if (parse_u64(optarg, UINT64_MAX, &v) || v == 0)
				snprintf(bad, sizeof bad, "--shard-tokens wants a positive integer");
			else
				o.shard_tokens = v;
			break;
		case O_MAXSENT:
			if (parse_u64(optarg, UINT32_MAX, &v))
				snprintf(bad, sizeof bad, "--max-sentence-tokens wants an integer");
			else
				o.max_sentence_tokens = (uint32_t)v;
			break;
		case 'j':
			if (parse_u64(optarg, 1024, &v) || v == 0)
				snprintf(bad, sizeof bad, "--jobs wants 1..1024");
			else
				o.threads = (int)v;
			break;
		case O_PFD:
			if (parse_u64(optarg, INT_MAX, &v) || fcntl((int)v, F_GETFD) < 0)
				snprintf(bad, sizeof bad, "--progress-fd wants an open file descriptor");
			else
				o.progress_fd = (int)v;
			break;
		case O_ROOT:
			roots[o.n_roots++] = optarg;
			break;
		case O_INCLUDE:
		case O_EXCLUDE:
			if (!optarg[0])
				snprintf(bad, sizeof bad, "--%s wants a non-empty pattern",
					 c == O_INCLUDE ? "include" : "exclude");
			else if (c == O_INCLUDE)
				include[o.n_include++] = optarg;
			else
				exclude[o.n_exclude++] = optarg;
			break;
		case O_MAXDEPTH:
			if (parse_u64(optarg, 256, &v) || v == 0)
				snprintf(bad, sizeof bad, "--max-depth wants 1..256");
			else
				o.max_depth = (uint32_t)v;
			break;
		case O_MAXFILES:
			if (parse_u64(optarg, UINT64_MAX, &v) || v == 0)
				snprintf(bad, sizeof bad, "--max-files wants a positive integer");
			else
				o.max_files = v;
			break;
		case O_MAXBYTES:
			if (parse_u64(optarg, UINT64_MAX, &v))
				snprintf(bad, sizeof bad, "--max-bytes wants an integer (0 = unlimited)");
			else
				o.max_bytes = v;
			break;
		case O_FRESH:
			o.fresh = true;
			break;
		case 'v':
			log_set_level(LOG_LVL_DEBUG);
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return fail_json(BERTD_EXIT_BAD_CONFIG, "bad option", -1);
		}
	}
	if (!bad[0] && !o.out_dir)
		snprintf(bad, sizeof bad, "-o DATASET_DIR is required");
	if (!bad[0] && optind >= argc)
		snprintf(bad, sizeof bad, "no INPUT given");
	if (!bad[0] && !!o.vocab_path == !!o.train_vocab_size)
		snprintf(bad, sizeof bad, "give exactly one of --vocab FILE and --train-vocab SIZE");
	if (bad[0]) {
		log_error("%s", bad);
		usage(stderr);
		return fail_json(BERTD_EXIT_BAD_CONFIG, bad, -1);
	}
	if (o.train_vocab_size && o.lowercase < 0)
		o.lowercase = 1;
	daemon_open(&o.progress_fd);
	const char *sde = getenv("SOURCE_DATE_EPOCH");
	if (!bad[0] && sde && *sde) {
		if (parse_u64(sde, INT64_MAX, &v) || v == 0) {
			log_error("SOURCE_DATE_EPOCH must be a positive integer (seconds)");
			return fail_json(BERTD_EXIT_BAD_CONFIG, "SOURCE_DATE_EPOCH must be a positive integer",
					 o.progress_fd);
		}
		o.created = (int64_t)v;
	}
	o.roots = roots;
	o.include = include;
	o.exclude = exclude;
	o.inputs = (const char *const *)(argv + optind);
	o.n_inputs = (size_t)(argc - optind);
	o.progress_tty = isatty(STDERR_FILENO);

	prepare_summary s;
	enum prepare_error err;
	char msg[1024];
	int rc = prepare_run(&o, &s, &err, msg, sizeof msg);
	if (rc < 0) {
		int code = BERTD_EXIT_FAILURE;
		if (rc == -ENOMEM)
			code = BERTD_EXIT_OOM;
		else if (err == PREPARE_ERR_USAGE || rc == -EEXIST)
			code = BERTD_EXIT_BAD_CONFIG;
		else if (err == PREPARE_ERR_INPUT || err == PREPARE_ERR_VOCAB)
			code = BERTD_EXIT_DATA;
		else if (err == PREPARE_ERR_OUTPUT)
			code = BERTD_EXIT_IO;
		return fail_json(code, msg[0] ? msg : strerror(-rc), o.progress_fd);
	}
	double mbps = s.tokenize_seconds > 0 ? (double)s.bytes / 1e6 / s.tokenize_seconds : 0.0;
	char asked[48] = ""; /* a trained vocab short of its size says so */
	if (s.vocab_trained && s.vocab_size < s.vocab_size_requested)
		snprintf(asked, sizeof asked, " of %u requested", s.vocab_size_requested);
	fprintf(stderr,
		"%s: %llu files, %.1f MB -> %llu documents, %llu sentences, %llu tokens in %llu shard(s)\n"
		"  vocab %u entries%s (%s%s), unk rate %.4f%%, %.1f MB/s tokenizing with %d thread(s), %.2f s total\n",
		o.out_dir, (unsigned long long)s.files, (double)s.bytes / 1e6,
		(unsigned long long)s.documents, (unsigned long long)s.sentences,
		(unsigned long long)s.tokens, (unsigned long long)s.shards, s.vocab_size,
		asked,
		s.lowercase ? "uncased" : "cased", s.vocab_trained ? ", trained" : "",
		s.tokens ? 100.0 * (double)s.unk / (double)s.tokens : 0.0, mbps, o.threads, s.seconds);
	if (s.resumed_shards || s.resumed_vocab)
		fprintf(stderr, "  resumed an interrupted run: %llu shard(s)%s kept\n",
			(unsigned long long)s.resumed_shards, s.resumed_vocab ? " and the trained vocab" : "");
	json_t *j = prepare_summary_json(&s, o.out_dir);
	char *js = j ? json_dumps(j, JSON_COMPACT) : NULL;
	if (js)
		printf("%s\n", js);
	fflush(stdout);
	free(js);
	/* the daemon's progress channel ends with the same numbers under "stats" */
	if (o.progress_fd >= 0 || dl.on) {
		json_t *done = json_pack("{s:s, s:O}", "phase", "done", "stats", j);
		if (dl.on) {
			daemon_relay_stop();
			if (done)
				daemon_send(done);
		} else {
			char *ds = done ? json_dumps(done, JSON_COMPACT) : NULL;
			if (ds) {
				size_t n = strlen(ds);
				ds[n] = '\n';
				int wr = prepare_write_line(o.progress_fd, ds, n + 1);
				if (wr < 0)
					log_debug("progress fd: %s", strerror(-wr));
			}
			free(ds);
		}
		json_decref(done);
	}
	json_decref(j);
	return daemon_close(BERTD_EXIT_OK);
}
