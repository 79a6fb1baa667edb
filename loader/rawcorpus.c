/* rawcorpus — see rawcorpus.h. */
#include "loader/rawcorpus.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"

static int map_file(const char *dir, const char *name, void **out, size_t *len)
{
	char path[4096];
	if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, name) >= sizeof(path))
		return -ENAMETOOLONG;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		int rc = -errno;
		log_error("rawcorpus: %s: %s", path, strerror(errno));
		return rc;
	}
	struct stat st;
	int rc = 0;
	if (fstat(fd, &st) != 0) {
		rc = -errno;
		goto out;
	}
	*len = (size_t)st.st_size;
	*out = NULL;
	if (*len > 0) {
		void *p = mmap(NULL, *len, PROT_READ, MAP_SHARED, fd, 0);
		if (p == MAP_FAILED) {
			rc = -errno;
			goto out;
		}
		*out = p;
	}
out:
	close(fd);
	return rc;
}

int rawcorpus_open(rawcorpus *rc, const char *dir)
{
	memset(rc, 0, sizeof(*rc));
	char path[4096];
	if ((size_t)snprintf(path, sizeof(path), "%s/meta.txt", dir) >= sizeof(path))
		return -ENAMETOOLONG;
	FILE *f = fopen(path, "re");
	if (!f) {
		int e = -errno;
		log_error("rawcorpus: %s: %s", path, strerror(errno));
		return e;
	}
	corpus_view *v = &rc->view;
	char key[64];
	unsigned long long val;
	int seen = 0, err = 0;
	char line[256];
	while (fgets(line, sizeof(line), f)) {
		if (line[0] == '#' || line[0] == '\n')
			continue;
		if (sscanf(line, "%63s %llu", key, &val) != 2) {
			if (strncmp(line, "format ", 7) == 0 && strncmp(line + 7, "bertd-rawtok-1", 14) == 0) {
				seen |= 1;
				continue;
			}
			err = 1;
			break;
		}
		if (!strcmp(key, "token_bytes"))
			v->token_bytes = (int)val, seen |= 2;
		else if (!strcmp(key, "vocab_size"))
			v->vocab_size = (uint32_t)val, seen |= 4;
		else if (!strcmp(key, "pad"))
			v->special.pad = (uint32_t)val, seen |= 8;
		else if (!strcmp(key, "unk"))
			v->special.unk = (uint32_t)val, seen |= 16;
		else if (!strcmp(key, "cls"))
			v->special.cls = (uint32_t)val, seen |= 32;
		else if (!strcmp(key, "sep"))
			v->special.sep = (uint32_t)val, seen |= 64;
		else if (!strcmp(key, "mask"))
			v->special.mask = (uint32_t)val, seen |= 128;
	}
	fclose(f);
	if (err || seen != 255 || (v->token_bytes != 2 && v->token_bytes != 4)) {
		log_error("rawcorpus: %s: want 'format bertd-rawtok-1' and token_bytes, vocab_size, "
			  "pad, unk, cls, sep, mask",
			  path);
		return -EBADMSG;
	}
	static const char *const names[3] = {"tokens.bin", "sent_off.bin", "doc_off.bin"};
	for (int i = 0; i < 3; i++) {
		int r = map_file(dir, names[i], &rc->maps[i], &rc->lens[i]);
		if (r) {
			rawcorpus_close(rc);
			return r;
		}
	}
	if (rc->lens[0] % (size_t)v->token_bytes || rc->lens[1] % 8 || rc->lens[2] % 8 || rc->lens[1] < 8 ||
	    rc->lens[2] < 8) {
		log_error("rawcorpus: %s: array sizes do not match their element types", dir);
		rawcorpus_close(rc);
		return -EBADMSG;
	}
	v->tokens = rc->maps[0];
	v->n_tokens = rc->lens[0] / (size_t)v->token_bytes;
	v->sent_off = rc->maps[1];
	v->n_sents = rc->lens[1] / 8 - 1;
	v->doc_off = rc->maps[2];
	v->n_docs = rc->lens[2] / 8 - 1;
	return 0;
}

void rawcorpus_close(rawcorpus *rc)
{
	for (int i = 0; i < 3; i++)
		if (rc->maps[i])
			munmap(rc->maps[i], rc->lens[i]);
	memset(rc, 0, sizeof(*rc));
}
