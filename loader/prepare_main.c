/* bertd-prepare — command line front end of prepare.c: raw corpus files to
 * a dataset directory of token shards. Run by hand, or by the daemon as a
 * child for POST /v1/datasets (it reads --progress-fd lines and the final
 * JSON line on stdout). This file only parses options and reports; it must
 * never hold preparation logic.
 *
 * Exit codes: 0 done; 1 internal error (memory, threads); 2 usage;
 * 3 input error (no inputs, unreadable or malformed input, empty corpus);
 * 4 vocab error (missing, unusable, lacks a special token);
 * 5 output error (exists already, cannot be written).
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "common/log.h"
#include "loader/prepare.h"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: bertd-prepare -o DATASET_DIR (--vocab FILE | --train-vocab SIZE) [options] INPUT...\n"
		"\n"
		"Tokenizes a corpus once into memory-mappable token shards for bertd.\n"
		"INPUT is a file, a directory (every file below it) or a glob pattern.\n"
		"\n"
		"  -o, --output DIR           dataset directory to create (must not exist)\n"
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
		"  -v, --verbose              more log output\n"
		"  -h, --help                 this text\n"
		"\n"
		"Prints a JSON summary line on stdout (\"ok\":true|false).\n"
		"Exit codes: 0 ok, 1 internal, 2 usage, 3 input, 4 vocab, 5 output.\n");
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

static int fail_json(int code, const char *msg)
{
	json_t *j = json_pack("{s:b, s:s, s:i}", "ok", 0, "error", msg, "exit_code", code);
	char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
	if (s)
		printf("%s\n", s);
	free(s);
	json_decref(j);
	return code;
}

int main(int argc, char **argv)
{
	enum { O_TEXT_FIELD = 256, O_VOCAB, O_TRAIN, O_LOWER, O_CASED, O_SHARD, O_MAXSENT, O_PFD };
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
		case 'v':
			log_set_level(LOG_LVL_DEBUG);
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return fail_json(2, "bad option");
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
		return fail_json(2, bad);
	}
	if (o.train_vocab_size && o.lowercase < 0)
		o.lowercase = 1;
	o.inputs = (const char *const *)(argv + optind);
	o.n_inputs = (size_t)(argc - optind);
	o.progress_tty = isatty(STDERR_FILENO);

	prepare_summary s;
	enum prepare_error err;
	char msg[1024];
	int rc = prepare_run(&o, &s, &err, msg, sizeof msg);
	if (rc < 0) {
		static const int code[] = {1, 2, 3, 4, 5, 1};
		return fail_json(code[err], msg[0] ? msg : strerror(-rc));
	}
	double mbps = s.tokenize_seconds > 0 ? (double)s.bytes / 1e6 / s.tokenize_seconds : 0.0;
	fprintf(stderr,
		"%s: %llu files, %.1f MB -> %llu documents, %llu sentences, %llu tokens in %llu shard(s)\n"
		"  vocab %u entries (%s%s), unk rate %.4f%%, %.1f MB/s tokenizing with %d thread(s), %.2f s total\n",
		o.out_dir, (unsigned long long)s.files, (double)s.bytes / 1e6,
		(unsigned long long)s.documents, (unsigned long long)s.sentences,
		(unsigned long long)s.tokens, (unsigned long long)s.shards, s.vocab_size,
		s.lowercase ? "uncased" : "cased", s.vocab_trained ? ", trained" : "",
		s.tokens ? 100.0 * (double)s.unk / (double)s.tokens : 0.0, mbps, o.threads, s.seconds);
	json_t *j = prepare_summary_json(&s, o.out_dir);
	char *js = j ? json_dumps(j, JSON_COMPACT) : NULL;
	if (js)
		printf("%s\n", js);
	free(js);
	json_decref(j);
	return 0;
}
