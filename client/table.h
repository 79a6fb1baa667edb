/* table — bertctl's human output: columns padded to their widest cell, a
 * header row, nothing else. Must never be used for --json output. */
#ifndef BERTD_CLIENT_TABLE_H
#define BERTD_CLIENT_TABLE_H

#include <stdio.h>

#define TABLE_MAX_COLS 10

typedef struct table {
	int ncols;
	size_t nrows, cap;
	char **cells;       /* (nrows, ncols), owned; row 0 the header */
} table;

/* Starts a table with the ncols header names (NULL-ended after them). */
void table_init(table *t, const char *h0, ...) __attribute__((sentinel));
/* Appends a row of ncols cells (copied; NULL prints "-"). 0 or -1. */
int table_row(table *t, const char *const *cells);
/* Prints it to out, the last column unpadded; frees it. */
void table_print(table *t, FILE *out);
/* Frees t without printing (a no-op after table_print). */
void table_free(table *t);

#endif
