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
  // The one-round algorithm's staging, ahead of the call (provider.h): for a message of the
  // one-round algorithm's size written with ordinary stores, where waits give up the core, and
  // when the slot of the next step is free already (the peers released the step that used it
  // last); the token is that step.
  void* StagingFor(size_t count, DataType dtype, ReduceOp op) override;
  uint64_t Staged() override;
  bool RunStaged(void* buf, size_t count, DataType dtype, ReduceOp op, double scale,
                 uint64_t token) override;

 private:
  void OneRound(uint8_t* data, size_t count, size_t elem, DataType dtype, ReduceOp op);
  // The one-round algorithm's second half: every rank's staged input reduced into `data`.
  void ReduceStaged(uint8_t* data, size_t count, DataType dtype, ReduceOp op, uint64_t step);
  void Sliced(uint8_t* data, size_t count, size_t elem, DataType dtype, ReduceOp op,
              double scale);

  ShmLink& link_;
  uint64_t step_ = 0;  // steps so far; the same on every rank
  uint64_t staged_step_ = 0;  // the step staged early (0: none since the last call)
  uint64_t offered_step_ = 0;  // the step of the last StagingFor
  size_t staged_bytes_ = 0;
  SlotStores stores_;  // how the slots are written (slot_stores.h)
};

}  // namespace horovodlike
