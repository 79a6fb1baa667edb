/* it_store — see it_store.h. */
#include <stdio.h>

#include "it_store.h"

int it_store_seed_dataset(const bertd *d, store **out)
{
	char db[200];
	store *st = NULL;
	snprintf(db, sizeof db, "%s/bertd.db", d->state_dir);
	store_dataset ds = {.id = "ds-00000000000000aa", .name = IT_SEEDED_DATASET, .spec_json = "{}"};
	int rc = store_open(&st, db);
	if (rc == 0)
		rc = store_dataset_insert(st, &ds);
	if (rc == 0)
		rc = store_dataset_finish(st, ds.id, DATASET_READY, NULL, NULL);
	if (rc == 0 && out) {
		*out = st;
		return 0;
	}
	store_close(st);
	return rc;
}
