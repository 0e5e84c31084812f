// A protobuf wire-format walker for SentencePiece's ModelProto (field numbers from
// sentencepiece_model.proto): varints, fixed 32/64-bit and length-delimited fields; anything
// else, or a length past the end, makes the file malformed.
#include "runner/tokenize/sentencepiece_proto.h"

#include <cstring>
#include <functional>

namespace runner::tok {

namespace {

struct Field {
  uint32_t number = 0;
  int wire = 0;
  uint64_t varint = 0;    // wire 0 (and the raw bits of wire 1 and 5)
  std::string_view data;  // wire 2
  std::string_view raw;   // the whole field, tag included
};

bool read_varint(std::string_view s, size_t& at, uint64_t& v) {
  v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (at >= s.size()) return false;
    const auto b = static_cast<unsigned char>(s[at++]);
    v |= static_cast<uint64_t>(b & 0x7F) << shift;
    if (!(b & 0x80)) return true;
  }
  return false;
}

// Calls `f` on each field of one message; false when the bytes are malformed.
bool walk(std::string_view s, const std::function<void(const Field&)>& f) {
  size_t at = 0;
  while (at < s.size()) {
    const size_t start = at;
    uint64_t tag = 0;
    if (!read_varint(s, at, tag)) return false;
    Field x;
    x.number = static_cast<uint32_t>(tag >> 3);
    x.wire = static_cast<int>(tag & 7);
    if (x.number == 0) return false;
    if (x.wire == 0) {
      if (!read_varint(s, at, x.varint)) return false;
    } else if (x.wire == 1 || x.wire == 5) {
      const size_t n = x.wire == 1 ? 8 : 4;
      if (s.size() - at < n) return false;
      std::memcpy(&x.varint, s.data() + at, n);
      at += n;
    } else if (x.wire == 2) {
      uint64_t len = 0;
      if (!read_varint(s, at, len) || len > s.size() - at) return false;
      x.data = s.substr(at, static_cast<size_t>(len));
      at += static_cast<size_t>(len);
    } else {
      return false;
    }
    x.raw = s.substr(start, at - start);
    f(x);
  }
  return true;
}

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_bytes(std::string& out, uint32_t number, std::string_view data) {
  put_varint(out, (static_cast<uint64_t>(number) << 3) | 2);
  put_varint(out, data.size());
  out.append(data);
}

// `bytes` with the sub-message at top-level field `number` replaced by edit(old) (an absent
// one edited from empty). A malformed model comes back unchanged: loading it reports that.
std::string edit_submessage(std::string_view bytes, uint32_t number, const std::function<std::string(std::string_view)>& edit) {
  std::string out;
  bool seen = false;
  const bool ok = walk(bytes, [&](const Field& x) {
    if (x.number == number && x.wire == 2 && !seen) {
      put_bytes(out, number, edit(x.data));
      seen = true;
    } else if (x.number != number) {
      out.append(x.raw);
    }
  });
  if (!ok) return std::string(bytes);
  if (!seen) put_bytes(out, number, edit({}));
  return out;
}

}  // namespace

std::optional<SpModelView> read_sp_model(std::string_view bytes) {
  SpModelView m;
  bool ok = true;  // cleared by a malformed sub-message
  ok = walk(bytes, [&](const Field& x) {
    if (x.number == 1 && x.wire == 2) {
      SpPiece p;
      ok = walk(x.data, [&](const Field& y) {
        if (y.number == 1 && y.wire == 2) p.piece = std::string(y.data);
        else if (y.number == 2 && y.wire == 5) std::memcpy(&p.score, &y.varint, 4);
        else if (y.number == 3 && y.wire == 0) p.type = static_cast<int>(y.varint);
      }) && ok;
      m.pieces.push_back(std::move(p));
    } else if (x.number == 2 && x.wire == 2) {
      ok = walk(x.data, [&](const Field& y) {
        if (y.wire != 0) return;
        if (y.number == 3) m.model_type = static_cast<int>(y.varint);
        else if (y.number == 22) m.split_by_whitespace = y.varint != 0;
        else if (y.number == 24) m.treat_whitespace_as_suffix = y.varint != 0;
        else if (y.number == 35) m.byte_fallback = y.varint != 0;
      }) && ok;
    } else if (x.number == 3 && x.wire == 2) {
      ok = walk(x.data, [&](const Field& y) {
        if (y.number == 1 && y.wire == 2) m.normalizer_name = std::string(y.data);
        else if (y.number == 2 && y.wire == 2) m.charsmap_empty = y.data.empty();
        else if (y.number == 3 && y.wire == 0) m.add_dummy_prefix = y.varint != 0;
        else if (y.number == 4 && y.wire == 0) m.remove_extra_whitespaces = y.varint != 0;
        else if (y.number == 5 && y.wire == 0) m.escape_whitespaces = y.varint != 0;
      }) && ok;
    } else if (x.number == 5 && x.wire == 2) {
      ok = walk(x.data, [&](const Field& y) {
        if (y.number == 2 && y.wire == 2 && !y.data.empty()) m.denormalizer_empty = false;
      }) && ok;
    }
  }) && ok;
  if (!ok) return std::nullopt;
  return m;
}

std::string sp_with_dummy_prefix(std::string_view bytes, bool on) {
  return edit_submessage(bytes, 3, [&](std::string_view spec) {
    std::string out;
    walk(spec, [&](const Field& y) {
      if (y.number != 3) out.append(y.raw);
    });
    put_varint(out, 3 << 3);
    put_varint(out, on ? 1 : 0);
    return out;
  });
}

std::string sp_without_training_paths(std::string_view bytes) {
  return edit_submessage(bytes, 2, [&](std::string_view spec) {
    std::string out;
    walk(spec, [&](const Field& y) {
      if (y.number != 1 && y.number != 2 && y.number != 16) out.append(y.raw);
    });
    return out;
  });
}

}  // namespace runner::tok
