/* loader_bench — bertd's batch builder against HuggingFace's
 * DataCollatorForLanguageModeling + torch DataLoader on the same
 * pre-tokenized corpus (HF BertTokenizerFast ids, bench/loader_hf.py).
 *
 * For max_seq_length 128 and 512 it measures, for a fixed wall time each:
 *   serial  mlm_batch_build in this process (one core, no ring)
 *   ring/1  one forked producer running the bertd-loader loop (ring_produce)
 *           into a shm ring, this process consuming (next/release)
 *   ring/2  the same with two producers (scaling)
 *   hf/1, hf/2  the HF reference with 1 and 2 DataLoader workers
 * and prints a table, ratios per core, and one line starting "BENCH ".
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "loader/mlm.h"
#include "loader/rawcorpus.h"
#include "loader/ring.h"

#ifndef BENCH_HF_SCRIPT
#define BENCH_HF_SCRIPT "bench/loader_hf.py"
#endif
/* tests/data (the vocab) and the build's shared_data option ("" = none). */
#ifndef BENCH_TEST_DATA
#define BENCH_TEST_DATA "tests/data"
#endif
#ifndef BENCH_SHARED_DATA
#define BENCH_SHARED_DATA ""
#endif

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double cpu_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* utime + stime of another process, seconds (/proc/<pid>/stat fields 14, 15). */
static double proc_cpu_s(pid_t pid)
{
	char path[64], buf[1024];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return 0;
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	char *p = strrchr(buf, ')');
	unsigned long ut = 0, st = 0;
	if (p && sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) == 2)
		return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
	return 0;
}

/* One measurement: wall-clock rate and rate per CPU-second spent building. */
typedef struct rate {
	double wall, per_cpu;
} rate;

typedef struct bctx {
	const mlm_dataset *ds;
	batch_layout l;
} bctx;

static int build(void *ctx, uint64_t n, void *slot)
{
	bctx *b = ctx;
	return mlm_batch_build(b->ds, &b->l, 1, 1, n, slot);
}

static rate bench_serial(const mlm_dataset *ds, const batch_layout *l, double secs)
{
	void *slot = aligned_alloc(BATCH_ALIGN, l->slot_bytes);
	uint64_t n = 0;
	for (int i = 0; i < 20; i++) /* warm caches and page in the corpus */
		mlm_batch_build(ds, l, 1, 1, n++, slot);
	double t0 = now_s(), c0 = cpu_s(), t;
	uint64_t n0 = n;
	do {
		for (int i = 0; i < 16; i++)
			mlm_batch_build(ds, l, 1, 1, n++, slot);
		t = now_s();
	} while (t - t0 < secs);
	double cpu = cpu_s() - c0;
	free(slot);
	return (rate){(double)(n - n0) * l->B / (t - t0), (double)(n - n0) * l->B / cpu};
}

static rate bench_ring(const mlm_dataset *ds, const batch_layout *l, int producers, double secs,
		       double *prod_wait_ms, double *cons_wait_ms)
{
	char name[64];
	snprintf(name, sizeof(name), "/bertd-bench-%d-%d", (int)getpid(), producers);
	ring_params p = {.G = 1, .S = 16, .M = 1, .layout = *l, .start_batch = 0, .end_batch = UINT64_MAX};
	ring *r;
	const rate fail = {-1, -1};
	if (ring_create(&r, name, &p) != 0)
		return fail;
	pid_t pids[8];
	bctx bc = {.ds = ds, .l = *l};
	for (int i = 0; i < producers; i++) {
		pids[i] = fork();
		if (pids[i] == 0) {
			ring *cr;
			if (ring_attach(&cr, name))
				_exit(10);
			_exit(ring_produce(cr, build, &bc, NULL) == 0 ? 0 : 11);
		}
	}
	void *slot;
	for (int i = 0; i < 20; i++) { /* let producers start and warm up */
		if (ring_next(r, 0, 60000, &slot))
			return fail;
		ring_release(r, 0);
	}
	ring_counters c0, c1;
	ring_get_counters(r, 0, &c0);
	uint64_t got = 0;
	double pc0 = 0, pc1 = 0;
	for (int i = 0; i < producers; i++)
		pc0 += proc_cpu_s(pids[i]);
	double t0 = now_s(), t;
	do {
		if (ring_next(r, 0, 60000, &slot))
			return fail;
		ring_release(r, 0);
		got++;
		t = now_s();
	} while (t - t0 < secs);
	for (int i = 0; i < producers; i++)
		pc1 += proc_cpu_s(pids[i]);
	ring_get_counters(r, 0, &c1);
	ring_shutdown(r);
	for (int i = 0; i < producers; i++)
		waitpid(pids[i], NULL, 0);
	ring_detach(r);
	ring_unlink(name);
	*prod_wait_ms = (double)(c1.producer_wait_ns - c0.producer_wait_ns) / 1e6;
	*cons_wait_ms = (double)(c1.consumer_wait_ns - c0.consumer_wait_ns) / 1e6;
	double seqs = (double)got * l->B;
	/* producers may run ahead by the S slots in flight: negligible over secs */
	return (rate){seqs / (t - t0), pc1 > pc0 ? seqs / (pc1 - pc0) : -1};
}

static rate bench_hf(const char *script, const char *dir, const char *vocab, uint32_t T, uint32_t B,
		     int workers, double secs)
{
	char cmd[8192];
	snprintf(cmd, sizeof(cmd),
		 "python3 '%s' hf --dir '%s' --vocab '%s' --seq %u --batch %u --workers %d --seconds %.1f "
		 "2>/dev/null",
		 script, dir, vocab, T, B, workers, secs);
	rate v = {-1, -1};
	FILE *f = popen(cmd, "r");
	if (!f)
		return v;
	char line[512];
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "HF_RESULT seqs_per_s=%lf seqs_per_cpu_s=%lf", &v.wall, &v.per_cpu) == 2)
			break;
	pclose(f);
	return v;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	log_init("loader_bench", LOG_LVL_WARN);
	const char *dir = "/tmp/bertd-bench-rawtok", *data = NULL, *script = BENCH_HF_SCRIPT;
	double secs = 3.0;
	uint32_t B = 32;
	int hf = 1;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--raw") && i + 1 < argc)
			dir = argv[++i];
		else if (!strcmp(argv[i], "--data") && i + 1 < argc)
			data = argv[++i];
		else if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
			secs = atof(argv[++i]);
		else if (!strcmp(argv[i], "--batch") && i + 1 < argc)
			B = (uint32_t)atoi(argv[++i]);
		else if (!strcmp(argv[i], "--hf-script") && i + 1 < argc)
			script = argv[++i];
		else if (!strcmp(argv[i], "--no-hf"))
			hf = 0;
		else {
			fprintf(stderr, "usage: %s [--data SHARED_DATA_DIR] [--raw DIR] [--seconds S] [--batch B] "
					"[--hf-script PATH] [--no-hf]\n"
					"  corpus: wikitext2-raw-test.txt + pg2600-war-and-peace.txt of --data (default: "
					"the build's shared_data), else /usr/share/common-licenses\n",
				argv[0]);
			return 2;
		}
	}
	if (!data)
		data = BENCH_SHARED_DATA;
	char vocab[4096], meta[4200], wt[4200], wp[4200], text[8500];
	snprintf(vocab, sizeof(vocab), "%s/bert-base-uncased-vocab.txt", BENCH_TEST_DATA);
	snprintf(wt, sizeof(wt), "%s/wikitext2-raw-test.txt", data);
	snprintf(wp, sizeof(wp), "%s/pg2600-war-and-peace.txt", data);
	struct stat st;
	if (*data && stat(wt, &st) == 0 && stat(wp, &st) == 0) {
		snprintf(text, sizeof(text), "'%s' '%s'", wt, wp);
	} else {
		fprintf(stderr, "corpus: /usr/share/common-licenses (no WikiText-2 / War and Peace in '%s')\n", data);
		snprintf(text, sizeof(text), "/usr/share/common-licenses/*");
	}
	snprintf(meta, sizeof(meta), "%s/meta.txt", dir);
	if (stat(meta, &st) != 0) {
		char cmd[16384];
		snprintf(cmd, sizeof(cmd), "python3 '%s' prepare --text %s --vocab '%s' --out '%s'", script, text,
			 vocab, dir);
		if (system(cmd) != 0) {
			fprintf(stderr, "preparing %s failed\n", dir);
			return 1;
		}
	}
	rawcorpus rc;
	if (rawcorpus_open(&rc, dir) != 0)
		return 1;
	printf("corpus: %s (%llu HF WordPiece tokens, %llu sentences, %llu documents)\n", dir,
	       (unsigned long long)rc.view.n_tokens, (unsigned long long)rc.view.n_sents,
	       (unsigned long long)rc.view.n_docs);
	char load[128] = "?";
	FILE *lf = fopen("/proc/loadavg", "r");
	if (lf) {
		if (!fgets(load, sizeof(load), lf))
			strcpy(load, "?\n");
		fclose(lf);
	}
	printf("batch %u, %.1f s per measurement, %ld online CPUs, loadavg %s\n", B, secs,
	       sysconf(_SC_NPROCESSORS_ONLN), load);
	printf("seqs/CPU-second: sequences per second of CPU time of the processes that build batches\n"
	       "(bertd: this process or the loaders; HF: main + DataLoader workers), robust to a busy box.\n\n");
	printf("%5s %-28s %13s %9s %15s %9s\n", "seq", "path", "seqs/s wall", "vs hf/1", "seqs/CPU-second",
	       "vs hf/1");
	const uint32_t Ts[2] = {128, 512};
	char machine[2048];
	int mlen = snprintf(machine, sizeof(machine), "BENCH loader batch=%u", B);
	for (int k = 0; k < 2; k++) {
		uint32_t T = Ts[k];
		mlm_config cfg;
		mlm_config_defaults(&cfg, T);
		mlm_dataset *ds;
		if (mlm_dataset_create(&ds, &rc.view, 1, &cfg) != 0)
			return 1;
		batch_layout l;
		batch_layout_init(&l, B, T, cfg.max_pred);
		double pw1, cw1, pw2, cw2;
		rate serial = bench_serial(ds, &l, secs);
		rate r1 = bench_ring(ds, &l, 1, secs, &pw1, &cw1);
		rate r2 = bench_ring(ds, &l, 2, secs, &pw2, &cw2);
		rate none = {-1, -1};
		rate h1 = hf ? bench_hf(script, dir, vocab, T, B, 1, secs) : none;
		rate h2 = hf ? bench_hf(script, dir, vocab, T, B, 2, secs) : none;
		struct {
			const char *name;
			rate v;
		} rows[] = {
			{"bertd serial (in-process)", serial}, {"bertd ring, 1 loader proc", r1},
			{"bertd ring, 2 loader procs", r2},    {"HF collator, 1 worker", h1},
			{"HF collator, 2 workers", h2},
		};
		for (int i = 0; i < 5; i++) {
			rate v = rows[i].v;
			printf("%5u %-28s", T, rows[i].name);
			if (v.wall < 0)
				printf(" %13s\n", "n/a");
			else if (h1.wall > 0)
				printf(" %13.0f %8.1fx %15.0f %8.1fx\n", v.wall, v.wall / h1.wall, v.per_cpu,
				       v.per_cpu / h1.per_cpu);
			else
				printf(" %13.0f %9s %15.0f\n", v.wall, "", v.per_cpu);
		}
		printf("%5u ring/1 producer blocked %.0f ms, consumer blocked %.0f ms; ring/2 %.0f / %.0f ms; "
		       "2-proc wall scaling %.2fx\n\n",
		       T, pw1, cw1, pw2, cw2, r2.wall / r1.wall);
		mlen += snprintf(machine + mlen, sizeof(machine) - (size_t)mlen,
				 " T%u_serial=%.0f T%u_serial_cpu=%.0f T%u_ring1=%.0f T%u_ring2=%.0f T%u_hf1=%.0f "
				 "T%u_hf1_cpu=%.0f T%u_hf2=%.0f T%u_ratio_per_core=%.1f",
				 T, serial.wall, T, serial.per_cpu, T, r1.wall, T, r2.wall, T, h1.wall, T, h1.per_cpu,
				 T, h2.wall, T, h1.per_cpu > 0 ? serial.per_cpu / h1.per_cpu : -1.0);
		mlm_dataset_destroy(ds);
	}
	printf("%s\n", machine);
	rawcorpus_close(&rc);
	return 0;
}
