/* testdata — where tests find their data files. Three places, in this
 * order of trust:
 *   tests/data                  committed copies (vocab files, a small
 *                               corpus; tests/data/SOURCES.md), always there;
 *   /usr/share/common-licenses  real English text on every Debian machine;
 *   $BERTD_SHARED_DATA          the optional corpora of ../shared/data (meson
 *                               option shared_data): they only add coverage.
 * A test must never fail because the shared data is absent: it asks
 * testdata_shared(), which says on stderr what is skipped and why. */
#ifndef BERTD_TESTS_TESTDATA_H
#define BERTD_TESTS_TESTDATA_H

#include <stddef.h>

/* The Debian directory testdata_licenses() reads. */
#define TESTDATA_LICENSES_DIR "/usr/share/common-licenses"

/* Writes the path of tests/data/name into buf ($BERTD_TEST_DATA, else
 * "tests/data" relative to the working directory) and returns buf. */
const char *testdata_path(char *buf, size_t n, const char *name);

/* Writes the path of name in the shared data directory into buf and returns
 * buf; NULL when $BERTD_SHARED_DATA is unset or empty or holds no readable
 * name. On NULL it prints "skipped: <what> (...why...)" on stderr, so a
 * test's log tells what coverage it ran without. */
const char *testdata_shared(char *buf, size_t n, const char *name, const char *what);

/* The regular files of TESTDATA_LICENSES_DIR (symlinks skipped: they name
 * the same texts twice), sorted by name, concatenated with a blank line
 * between files; *len gets the byte count. The caller owns the result
 * (free). NULL, with a message on stderr, when the directory is missing or
 * holds no text. */
char *testdata_licenses(size_t *len);

#endif
