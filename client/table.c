/* table — see table.h. */
#include "client/table.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

void table_init(table *t, const char *h0, ...)
{
	const char *h[TABLE_MAX_COLS];
	int n = 0;
	va_list ap;
	va_start(ap, h0);
	for (const char *s = h0; s && n < TABLE_MAX_COLS; s = va_arg(ap, const char *))
		h[n++] = s;
	va_end(ap);
	memset(t, 0, sizeof *t);
	t->ncols = n;
	table_row(t, h);
}

int table_row(table *t, const char *const *cells)
{
	if (t->nrows == t->cap) {
		size_t cap = t->cap ? t->cap * 2 : 16;
		char **c = realloc(t->cells, cap * (size_t)t->ncols * sizeof *c);
		if (!c)
			return -1;
		t->cells = c;
		t->cap = cap;
	}
	for (int i = 0; i < t->ncols; i++) {
		char *s = strdup(cells[i] ? cells[i] : "-");
		if (!s) {
			for (int j = 0; j < i; j++)
				free(t->cells[t->nrows * t->ncols + j]);
			return -1;
		}
		/* one cell, one line: a newline in a name would break the columns */
		for (char *p = s; *p; p++)
			if (*p == '\n' || *p == '\r' || *p == '\t')
				*p = ' ';
		t->cells[t->nrows * t->ncols + i] = s;
	}
	t->nrows++;
	return 0;
}

void table_print(table *t, FILE *out)
{
	size_t w[TABLE_MAX_COLS] = {0};
	for (size_t r = 0; r < t->nrows; r++)
		for (int i = 0; i < t->ncols; i++) {
			size_t n = strlen(t->cells[r * t->ncols + i]);
			if (n > w[i])
				w[i] = n;
		}
	for (size_t r = 0; r < t->nrows; r++) {
		for (int i = 0; i < t->ncols; i++) {
			const char *s = t->cells[r * t->ncols + i];
			if (i == t->ncols - 1)
				fprintf(out, "%s\n", s);
			else
				fprintf(out, "%-*s  ", (int)w[i], s);
			free(t->cells[r * t->ncols + i]);
		}
	}
	free(t->cells);
	memset(t, 0, sizeof *t);
}

void table_free(table *t)
{
	for (size_t i = 0; i < t->nrows * (size_t)t->ncols; i++)
		free(t->cells[i]);
	free(t->cells);
	memset(t, 0, sizeof *t);
}
