// Point-to-point's frames on the wire and the state it keeps per peer (point_to_point.h);
// for point_to_point.cc alone.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "point_to_point.h"

namespace horovodlike {
namespace p2p_frames {  // the .cc brings these into scope

constexpr uint32_t kFrameMagic = 0x32505648;  // "HVP2"
enum FrameKind : uint32_t { kData = 1, kReject = 3, kFailure = 4 };
constexpr int kMaxDims = 32;
constexpr uint64_t kMaxTextBytes = 1 << 20;
// The link tags of the two messages of a frame (point-to-point is the only user of the
// job link's tagged messages).
constexpr int kHeaderTag = 0;
constexpr int kPayloadTag = 1;
// How long one Progress call sleeps at most before looking at its caller's handle again.
constexpr double kProgressSliceSeconds = 0.01;

}  // namespace p2p_frames

// A frame is a header message of kHeaderBytes on kHeaderTag: this, then (a data frame) its
// `ndim` int64 dimensions; and then, unless `body_bytes` is 0, a payload message of
// `body_bytes` on kPayloadTag: the data, or a rejection's or failure notice's text.
struct PointToPoint::Header {
  uint32_t magic = p2p_frames::kFrameMagic;
  uint32_t kind = p2p_frames::kData;
  int32_t set_id = 0;
  int32_t tag = 0;
  int32_t dtype = 0;
  int32_t ndim = 0;
  uint64_t sequence = 0;  // data: the sender's number for it; reject: the number rejected
  uint64_t body_bytes = 0;
};

struct PointToPoint::PostedRecv {
  Message message;
  void* data = nullptr;  // null: allocate with the sender's dtype and shape
  std::shared_ptr<HandleState> state;
};

// Every header message is this long, so that a receive can be posted for it before it comes.
constexpr size_t kHeaderBytes =
    sizeof(PointToPoint::Header) + p2p_frames::kMaxDims * sizeof(int64_t);

struct PointToPoint::PendingSend {
  int set_id = 0;
  std::shared_ptr<HandleState> state;
  std::vector<uint8_t> head;  // the header message, kept until written
  std::unique_ptr<Link::Request> head_request;
  std::unique_ptr<Link::Request> body_request;  // null without payload
  // A rejection of an earlier message, or a failure, that came while this one was in flight:
  // reported once it is written (the caller's buffer is in use until then).
  bool has_deferred = false;
  Status deferred;
};

struct PointToPoint::Arrived {
  int set_id = 0;
  int tag = 0;
  DataType dtype = DataType::kUInt8;
  std::vector<int64_t> shape;
  uint64_t sequence = 0;
  std::vector<uint8_t> bytes;
};

// A rejection or failure notice being written.
struct PointToPoint::Notice {
  std::vector<uint8_t> head;
  std::string text;
  std::unique_ptr<Link::Request> head_request;
  std::unique_ptr<Link::Request> text_request;  // null without text
};

// The frame whose payload is being received from a peer.
struct PointToPoint::Incoming {
  bool active = false;
  Header header;
  bool matched = false;  // into `recv` (else kept in `arrived`)
  PostedRecv recv;
  Arrived arrived;
  std::string problem;  // the receive does not fit: the payload is read and dropped
  std::vector<uint8_t> scratch;
  std::string text;  // a rejection's or failure notice's
  std::unique_ptr<Link::Request> request;  // null when the frame has no payload
};

struct PointToPoint::Peer {
  std::deque<PostedRecv> posted;
  std::deque<Arrived> arrived;  // messages no receive was posted for yet, in arrival order
  std::map<uint64_t, std::shared_ptr<PendingSend>> unsent;  // not written in full yet
  std::deque<Notice> notices;
  uint64_t next_sequence = 0;
  Status lost;                             // the connection broke
  std::map<int, std::string> failed_sets;  // set id -> the peer's failure notice
  // set id -> the peer's rejection of a message this rank sent, for the next operation with
  // the peer in that set when none was pending.
  std::map<int, std::string> rejections;
  std::vector<uint8_t> header_bytes = std::vector<uint8_t>(kHeaderBytes);
  std::unique_ptr<Link::Request> header;  // the receive of the next header, always posted
  Incoming incoming;
};

}  // namespace horovodlike
