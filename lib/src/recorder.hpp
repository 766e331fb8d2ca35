#pragma once
// This process's flight recorder: every collective a group runs is entered here before it
// starts and marked when it ends, in the memory idist-run reads (IDIST_RECORDER_FD), so that a
// stall can be reported from outside the rank even while it is frozen.
//
// enter() and leave() are inline and take no lock, no atomic read-modify-write on an owned
// ring and no clock: they run on every collective (see flight_recorder.hpp for the budget).

#include <atomic>
#include <cstdint>

#include "idist/common/flight_recorder.hpp"
#include "idist/types.hpp"

namespace idist::detail {

// A writer's ring: its own when one was free (its calls must then come one at a time, as a
// group's collectives do), else the shared ring 0. Empty with IDIST_FLIGHT_RECORDER=0.
class RecorderRing {
 public:
  // Where a call was entered, for leave().
  struct Mark {
    common::recorder::Slot* slot = nullptr;
    std::uint64_t number = 0;
    const common::recorder::Ring* shared = nullptr;  // the ring, where others write it too
  };

  // A ring of its own when one is free, else the shared one.
  static RecorderRing own();
  // The shared ring, for writers that may run on several threads at once.
  static RecorderRing shared();

  RecorderRing() = default;
  RecorderRing(RecorderRing&& other) noexcept
      : segment_(other.segment_), ring_(other.ring_), life_(other.life_), owned_(other.owned_) {
    other.ring_ = nullptr;
    other.owned_ = false;
  }
  RecorderRing& operator=(RecorderRing&&) = delete;
  RecorderRing(const RecorderRing&) = delete;
  ~RecorderRing() {
    if (owned_) ring_->owner.store(0, std::memory_order_release);
  }

  Mark enter(std::uint32_t epoch, std::int32_t group, std::uint64_t seq, common::recorder::Op op, DType dtype,
             std::uint64_t count, std::int32_t root,
             common::recorder::Kind kind = common::recorder::Kind::collective) noexcept {
    namespace rec = common::recorder;
    if (ring_ == nullptr) return {};
    std::uint64_t n = 0;
    if (owned_) {
      n = ring_->next.load(std::memory_order_relaxed);
      ring_->next.store(n + 1, std::memory_order_relaxed);
    } else {
      n = ring_->next.fetch_add(1, std::memory_order_relaxed);
    }
    auto& slot = ring_->slots[n % rec::kSlots];
    auto v = slot.version.load(std::memory_order_relaxed);
    if (owned_) {
      slot.version.store(v | 1, std::memory_order_relaxed);
    } else if ((v & 1) != 0 || !slot.version.compare_exchange_strong(v, v | 1, std::memory_order_relaxed)) {
      // Ring 0 came round to a slot another thread is still writing (it was pre-empted there):
      // this call goes unrecorded rather than mixed into that one.
      return {};
    }
    std::atomic_thread_fence(std::memory_order_release);
    // Plain load and store: see Slot::order.
    const auto order = segment_->order.load(std::memory_order_relaxed);
    segment_->order.store(order + 1, std::memory_order_relaxed);
    slot.state.store(static_cast<std::uint8_t>(rec::State::entered), std::memory_order_relaxed);
    slot.op = static_cast<std::uint8_t>(op);
    slot.dtype = static_cast<std::uint8_t>(dtype);
    slot.kind = static_cast<std::uint8_t>(kind);
    slot.epoch = life_ | (epoch & 0xffff);
    slot.group = group;
    slot.root = root;
    slot.seq = seq;
    slot.count = count;
    slot.number = n;
    slot.order = order;
    slot.version.store((v | 1) + 1, std::memory_order_release);
    return {&slot, n, owned_ ? nullptr : ring_};
  }

  // No clock read here either: the next call's entry dates this one's end closely enough.
  // Any thread may end the call (an isend's waiter does).
  static void leave(Mark mark, bool ok) noexcept {
    namespace rec = common::recorder;
    if (mark.slot == nullptr) return;
    // Only the shared ring can have written over it since.
    if (mark.shared != nullptr && mark.shared->next.load(std::memory_order_relaxed) - mark.number > rec::kSlots) return;
    mark.slot->state.store(static_cast<std::uint8_t>(ok ? rec::State::completed : rec::State::failed),
                           std::memory_order_release);
  }

 private:
  RecorderRing(common::recorder::Segment* segment, common::recorder::Ring* ring, std::uint32_t life, bool owned)
      : segment_(segment), ring_(ring), life_(life << 16), owned_(owned) {}

  common::recorder::Segment* segment_ = nullptr;
  common::recorder::Ring* ring_ = nullptr;
  std::uint32_t life_ = 0;  // this process's number in the segment, as Slot::epoch's high bits
  bool owned_ = false;
};

}  // namespace idist::detail
