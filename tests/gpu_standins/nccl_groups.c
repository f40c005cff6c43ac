/* The stand-in NCCL's groups (per thread, as in NCCL): calls between ncclGroupStart and
 * ncclGroupEnd become one launch; a call that fails inside a group fails the group. */
#include "nccl_internal.h"

#include <stdlib.h>

static __thread int t_group_depth = 0;
static __thread struct launch* t_group = NULL;
static __thread ncclResult_t t_group_error = ncclSuccess;

EXPORT ncclResult_t ncclGroupStart(void) {
  t_group_depth++;
  return ncclSuccess;
}

EXPORT ncclResult_t ncclGroupEnd(void) {
  if (t_group_depth == 0)
    return fail(ncclInvalidUsage, "ncclGroupEnd: not in a group started by ncclGroupStart");
  if (--t_group_depth > 0) return ncclSuccess;
  struct launch* L = t_group;
  ncclResult_t err = t_group_error;
  t_group = NULL;
  t_group_error = ncclSuccess;
  if (err != ncclSuccess) {
    launch_free(L);
    return err;
  }
  return L ? launch_submit(L) : ncclSuccess;
}

ncclResult_t issue(const struct coll* op) {
  if (t_group_depth > 0) {
    if (!t_group) t_group = calloc(1, sizeof *t_group);
    if (!t_group || launch_add(t_group, op) != 0) {
      if (t_group_error == ncclSuccess) t_group_error = ncclSystemError;
      return fail(ncclSystemError, "out of memory");
    }
    return ncclSuccess;
  }
  struct launch* L = calloc(1, sizeof *L);
  if (!L || launch_add(L, op) != 0) {
    launch_free(L);
    return fail(ncclSystemError, "out of memory");
  }
  return launch_submit(L);
}

/* A failed call inside a group also fails the group's ncclGroupEnd (and drops the group). */
ncclResult_t call_error(ncclResult_t rc) {
  if (t_group_depth > 0 && t_group_error == ncclSuccess) t_group_error = rc;
  return rc;
}
