/* it_store — what the integration tests that link the daemon's store
 * (daemon/store.h) write into a state dir before its daemon starts. Only
 * for a stopped daemon's store: it never opens one a daemon is running on. */
#ifndef BERTD_TESTS_IT_STORE_H
#define BERTD_TESTS_IT_STORE_H

#include "daemon/store.h"
#include "harness.h"

/* The dataset the seeded jobs name: "wikitext2", ready, with no files (a
 * daemon whose queue is held never reads its absent shards). */
#define IT_SEEDED_DATASET "wikitext2"

/* Opens d's store (creating it) and inserts IT_SEEDED_DATASET as ready;
 * *out: the open store for more seeding (caller closes), or NULL to close
 * it here. 0 or the store's negative error. */
int it_store_seed_dataset(const bertd *d, store **out);

#endif
