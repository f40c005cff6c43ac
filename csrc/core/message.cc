#include "message.h"

#include <cstdint>
#include <cstring>

namespace horovodlike {
namespace {
// Bounds that no legitimate message comes near; anything above is a corrupt or hostile stream
// (strings: kMaxWireStringBytes, message.h). Vectors have no item bound of their own: an
// alltoall's split matrix holds size^2 items (over a million past 1,024 ranks); their length is
// checked against the bytes received.
constexpr int64_t kMaxListItems = 1 << 24;

DataType CheckedDataType(int32_t v) {
  if (!IsValidDataType(v)) throw TransportError("malformed message: bad dtype");
  return static_cast<DataType>(v);
}
ReduceOp CheckedReduceOp(int32_t v) {
  if (v < 0 || v > static_cast<int32_t>(ReduceOp::kAdasum)) {
    throw TransportError("malformed message: bad reduce op");
  }
  return static_cast<ReduceOp>(v);
}

bool IsControlResponse(Response::Type type) {
  return type == Response::Type::kJoin || type == Response::Type::kAddProcessSet ||
         type == Response::Type::kRemoveProcessSet;
}

void PutRanks(const std::vector<int32_t>& ranks, WireWriter& out) {
  out.PutI64Vector(std::vector<int64_t>(ranks.begin(), ranks.end()));
}

std::vector<int32_t> GetRanks(WireReader& in) {
  std::vector<int32_t> ranks;
  for (int64_t r : in.GetI64Vector()) {
    if (r < 0 || r > INT32_MAX) throw TransportError("malformed message: bad rank");
    ranks.push_back(static_cast<int32_t>(r));
  }
  return ranks;
}

// The records after the common header: a collective's tensor fields, or a control operation's.
void PutTensorRequest(const Request& r, WireWriter& out) {
  out.PutI32(static_cast<int32_t>(r.dtype));
  out.PutI64Vector(r.shape);
  out.PutI32(static_cast<int32_t>(r.reduce_op));
  out.PutF64(r.prescale);
  out.PutF64(r.postscale);
  out.PutI32(r.root_rank);
  out.PutI32(r.device);
  out.PutI64Vector(r.splits);
  out.PutI64(r.group_id);
  out.PutI32(r.group_size);
}

void GetTensorRequest(WireReader& in, Request& r) {
  r.dtype = CheckedDataType(in.GetI32());
  r.shape = in.GetI64Vector();
  r.reduce_op = CheckedReduceOp(in.GetI32());
  r.prescale = in.GetF64();
  r.postscale = in.GetF64();
  r.root_rank = in.GetI32();
  r.device = in.GetI32();
  r.splits = in.GetI64Vector();
  r.group_id = in.GetI64();
  r.group_size = in.GetI32();
}

void PutControlRequest(const ControlRequest& c, WireWriter& out) {
  PutRanks(c.ranks, out);
  out.PutI32(c.process_set_id);
}

void GetControlRequest(WireReader& in, ControlRequest& c) {
  c.ranks = GetRanks(in);
  c.process_set_id = in.GetI32();
}

void PutTensorResponse(const Response& r, WireWriter& out) {
  out.PutI32(static_cast<int32_t>(r.dtype));
  out.PutI32(static_cast<int32_t>(r.reduce_op));
  out.PutF64(r.prescale);
  out.PutF64(r.postscale);
  out.PutI32(r.root_rank);
  out.PutI32(r.device);
  out.PutI64Vector(r.first_dims);
  out.PutI64Vector(r.alltoall_rows);
  out.PutI64Vector(r.shape);
  out.PutI64Vector(r.tensor_sizes);
  out.PutI64(r.total_bytes);
  out.PutI64(r.group_id);
  out.PutI32(r.group_size);
  out.PutText(r.error_message);
}

void GetTensorResponse(WireReader& in, Response& r) {
  r.dtype = CheckedDataType(in.GetI32());
  r.reduce_op = CheckedReduceOp(in.GetI32());
  r.prescale = in.GetF64();
  r.postscale = in.GetF64();
  r.root_rank = in.GetI32();
  r.device = in.GetI32();
  r.first_dims = in.GetI64Vector();
  r.alltoall_rows = in.GetI64Vector();
  r.shape = in.GetI64Vector();
  r.tensor_sizes = in.GetI64Vector();
  r.total_bytes = in.GetI64();
  r.group_id = in.GetI64();
  r.group_size = in.GetI32();
  r.error_message = in.GetString();
}

void PutControlResponse(const ControlResponse& c, WireWriter& out) {
  PutRanks(c.ranks, out);
  out.PutI32(c.process_set_id);
  out.PutI32(c.last_joined_rank);
}

void GetControlResponse(WireReader& in, ControlResponse& c) {
  c.ranks = GetRanks(in);
  c.process_set_id = in.GetI32();
  c.last_joined_rank = in.GetI32();
}
}  // namespace

bool Request::SameParameters(const Request& other) const {
  if (IsControlOp(op) || IsControlOp(other.op)) return op == other.op && control == other.control;
  return op == other.op && dtype == other.dtype && shape == other.shape &&
         reduce_op == other.reduce_op && prescale == other.prescale &&
         postscale == other.postscale && root_rank == other.root_rank && device == other.device &&
         splits == other.splits;
}

void WireWriter::Put(const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  bytes_.insert(bytes_.end(), b, b + n);
}
void WireWriter::PutI32(int32_t v) { Put(&v, sizeof(v)); }
void WireWriter::PutI64(int64_t v) { Put(&v, sizeof(v)); }
void WireWriter::PutF64(double v) { Put(&v, sizeof(v)); }
void WireWriter::PutString(const std::string& s) {
  PutI64(static_cast<int64_t>(s.size()));
  Put(s.data(), s.size());
}
void WireWriter::PutText(const std::string& s) {
  if (static_cast<int64_t>(s.size()) <= kMaxWireStringBytes) return PutString(s);
  // The middle goes: what grows is a name quoted in it, and the end says what went wrong.
  const std::string cut = " [...] ";
  const size_t keep = (static_cast<size_t>(kMaxWireStringBytes) - cut.size()) / 2;
  auto continues_char = [&](size_t i) { return (static_cast<uint8_t>(s[i]) & 0xC0) == 0x80; };
  size_t head = keep;
  while (head > 0 && continues_char(head)) --head;
  size_t tail = s.size() - keep;
  while (tail < s.size() && continues_char(tail)) ++tail;
  PutString(s.substr(0, head) + cut + s.substr(tail));
}
void WireWriter::PutI64Vector(const std::vector<int64_t>& v) {
  PutI64(static_cast<int64_t>(v.size()));
  Put(v.data(), v.size() * sizeof(int64_t));
}

void WireReader::Get(void* p, size_t n) {
  if (n > size_ - pos_) throw TransportError("malformed message: truncated");
  std::memcpy(p, data_ + pos_, n);
  pos_ += n;
}
int32_t WireReader::GetI32() { int32_t v; Get(&v, sizeof(v)); return v; }
int64_t WireReader::GetI64() { int64_t v; Get(&v, sizeof(v)); return v; }
double WireReader::GetF64() { double v; Get(&v, sizeof(v)); return v; }
std::string WireReader::GetString() {
  int64_t n = GetI64();
  if (n < 0 || n > kMaxWireStringBytes) {
    throw TransportError("malformed message: bad string length");
  }
  // Checked before allocating, so a corrupt length costs nothing.
  if (static_cast<uint64_t>(n) > size_ - pos_) throw TransportError("malformed message: truncated");
  std::string s(static_cast<size_t>(n), '\0');
  Get(s.data(), s.size());
  return s;
}
std::vector<int64_t> WireReader::GetI64Vector() {
  int64_t n = GetI64();
  if (n < 0) throw TransportError("malformed message: bad vector length");
  // Checked before allocating, so a corrupt length costs nothing.
  if (static_cast<uint64_t>(n) > (size_ - pos_) / sizeof(int64_t)) {
    throw TransportError("malformed message: truncated");
  }
  std::vector<int64_t> v(static_cast<size_t>(n));
  Get(v.data(), v.size() * sizeof(int64_t));
  return v;
}

void EncodeRequests(const std::vector<Request>& requests, WireWriter& out) {
  out.PutI64(static_cast<int64_t>(requests.size()));
  for (const Request& r : requests) {
    out.PutI32(r.rank);
    out.PutI32(static_cast<int32_t>(r.op));
    out.PutString(r.name);
    if (IsControlOp(r.op)) {
      PutControlRequest(r.control, out);
    } else {
      PutTensorRequest(r, out);
    }
  }
}

std::vector<Request> DecodeRequests(const uint8_t* data, size_t size) {
  WireReader in(data, size);
  int64_t n = in.GetI64();
  if (n < 0 || n > kMaxListItems) throw TransportError("malformed message: bad request count");
  std::vector<Request> requests;
  for (int64_t i = 0; i < n; ++i) {
    Request r;
    r.rank = in.GetI32();
    int32_t op = in.GetI32();
    if (op < 0 || op >= kNumOpTypes) {
      throw TransportError("malformed message: bad op");
    }
    r.op = static_cast<OpType>(op);
    r.name = in.GetString();
    if (IsControlOp(r.op)) {
      GetControlRequest(in, r.control);
    } else {
      GetTensorRequest(in, r);
    }
    requests.push_back(std::move(r));
  }
  if (!in.done()) throw TransportError("malformed message: trailing bytes");
  return requests;
}

void EncodeResponses(const std::vector<Response>& responses, WireWriter& out) {
  out.PutI64(static_cast<int64_t>(responses.size()));
  for (const Response& r : responses) {
    out.PutI32(static_cast<int32_t>(r.type));
    out.PutI64(static_cast<int64_t>(r.names.size()));
    for (const auto& name : r.names) out.PutString(name);
    if (IsControlResponse(r.type)) {
      PutControlResponse(r.control, out);
    } else {
      PutTensorResponse(r, out);
    }
  }
}

std::vector<Response> DecodeResponses(const uint8_t* data, size_t size) {
  WireReader in(data, size);
  int64_t n = in.GetI64();
  if (n < 0 || n > kMaxListItems) throw TransportError("malformed message: bad response count");
  std::vector<Response> responses;
  for (int64_t i = 0; i < n; ++i) {
    Response r;
    int32_t type = in.GetI32();
    if (type < 0 || type > static_cast<int32_t>(Response::Type::kError)) {
      throw TransportError("malformed message: bad response type");
    }
    r.type = static_cast<Response::Type>(type);
    int64_t names = in.GetI64();
    if (names < 0 || names > kMaxListItems) throw TransportError("malformed message: bad names");
    for (int64_t j = 0; j < names; ++j) r.names.push_back(in.GetString());
    if (IsControlResponse(r.type)) {
      GetControlResponse(in, r.control);
    } else {
      GetTensorResponse(in, r);
    }
    responses.push_back(std::move(r));
  }
  if (!in.done()) throw TransportError("malformed message: trailing bytes");
  return responses;
}

}  // namespace horovodlike
