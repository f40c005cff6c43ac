// The shared-memory allreduce: every rank of a ShmLink reads the others' data straight from the
// segment's staging slots, with no messages (the algorithm is described in shm_allreduce.cc).
#pragma once

#include <cstddef>
#include <cstdint>

#include "../../common/common.h"
#include "../../links/shm/shm_link.h"
#include "../provider.h"
#include "slot_stores.h"

namespace horovodlike {

class ShmAllreduce final : public AllreduceProvider {
 public:
  explicit ShmAllreduce(ShmLink& link)
      : link_(link),
        stores_(link.stream_stores() == "on"    ? SlotStores::Mode::kStreaming
                : link.stream_stores() == "off" ? SlotStores::Mode::kOrdinary
                                                : SlotStores::Mode::kAuto) {}
  const char* name() const override { return "shm_allreduce"; }

  // In place over every rank of the link, Average reduced as Sum, the result multiplied by
  // `scale` as it is written (every rank passes the same scale). Every rank of the link calls
  // it with the same arguments, in the same order as its other calls.
  void Run(void* buf, size_t count, DataType dtype, ReduceOp op, double scale) override;

 private:
  void OneRound(uint8_t* data, size_t count, size_t elem, DataType dtype, ReduceOp op);
  void Sliced(uint8_t* data, size_t count, size_t elem, DataType dtype, ReduceOp op,
              double scale);

  ShmLink& link_;
  uint64_t step_ = 0;  // steps so far; the same on every rank
  SlotStores stores_;  // how the slots are written (slot_stores.h)
};

}  // namespace horovodlike
