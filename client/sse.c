/* sse — see sse.h. Follows the WHATWG "interpreting an event stream" steps:
 * CR, LF and CRLF end lines; a line starting with ':' is a comment (the
 * daemon's keep-alives); "field: value" with one optional space after the
 * colon; "id" containing NUL is ignored; a blank line dispatches the event
 * when it has data. */
#include "client/sse.h"

#include <stdlib.h>
#include <string.h>

void sse_init(sse_parser *p, sse_event_fn fn, void *arg)
{
	memset(p, 0, sizeof *p);
	p->fn = fn;
	p->arg = arg;
}

static int grow(char **b, size_t *cap, size_t need)
{
	if (need <= *cap)
		return 0;
	size_t c = *cap ? *cap : 256;
	while (c < need)
		c *= 2;
	char *nb = realloc(*b, c);
	if (!nb)
		return -1;
	*b = nb;
	*cap = c;
	return 0;
}

static int dispatch(sse_parser *p)
{
	int rc = 0;
	if (p->have_data) {
		p->data[p->data_len] = 0;
		rc = p->fn(p->arg, p->event, p->id, p->data, p->data_len);
	}
	p->data_len = 0;
	p->have_data = 0;
	p->event[0] = 0;
	return rc;
}

/* One complete line (without its end). */
static int line_done(sse_parser *p)
{
	char *l = p->line;
	size_t n = p->line_len;
	p->line_len = 0;
	if (n == 0)
		return dispatch(p);
	if (l[0] == ':')
		return 0;
	size_t colon = 0;
	while (colon < n && l[colon] != ':')
		colon++;
	const char *val = l + n;
	size_t vlen = 0;
	if (colon < n) {
		val = l + colon + 1;
		vlen = n - colon - 1;
		if (vlen && *val == ' ')
			val++, vlen--;
	}
	if (colon == 4 && memcmp(l, "data", 4) == 0) {
		if (grow(&p->data, &p->data_cap, p->data_len + vlen + 2))
			return -1;
		if (p->have_data)
			p->data[p->data_len++] = '\n';
		memcpy(p->data + p->data_len, val, vlen);
		p->data_len += vlen;
		p->have_data = 1;
	} else if (colon == 5 && memcmp(l, "event", 5) == 0) {
		size_t k = vlen < sizeof p->event - 1 ? vlen : sizeof p->event - 1;
		memcpy(p->event, val, k);
		p->event[k] = 0;
	} else if (colon == 2 && memcmp(l, "id", 2) == 0) {
		if (!memchr(val, 0, vlen) && vlen < sizeof p->id) {
			memcpy(p->id, val, vlen);
			p->id[vlen] = 0;
		}
	}
	/* retry and unknown fields: ignored (bertctl's own backoff decides) */
	return 0;
}

int sse_feed(sse_parser *p, const char *buf, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		char ch = buf[i];
		if (ch == '\n' && p->after_cr) {
			p->after_cr = 0;
			continue;
		}
		p->after_cr = ch == '\r';
		if (ch == '\r' || ch == '\n') {
			int rc = line_done(p);
			if (rc)
				return rc;
			continue;
		}
		if (grow(&p->line, &p->line_cap, p->line_len + 2))
			return -1;
		p->line[p->line_len++] = ch;
	}
	return 0;
}

void sse_reset(sse_parser *p)
{
	p->line_len = 0;
	p->data_len = 0;
	p->have_data = 0;
	p->after_cr = 0;
	p->event[0] = 0;
}

void sse_free(sse_parser *p)
{
	free(p->line);
	free(p->data);
	p->line = p->data = NULL;
	p->line_cap = p->data_cap = 0;
}
