// What every error shares: its message made printable (Note [Printable messages] in exceptions.h).
#include "xpuruntime/exceptions.h"

#include <cstdint>

namespace xpuruntime::detail {

namespace {

// The length of the well-formed UTF-8 sequence starting at s[i] (RFC 3629: no overlong forms, no surrogates,
// nothing past U+10FFFF), or 0 when there is none.
std::size_t utf8_sequence(const std::string& s, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<std::uint8_t>(s[k]); };
  const std::uint8_t b0 = byte(i);
  if (b0 < 0x80) return 1;
  std::size_t length = 0;
  std::uint8_t low = 0x80, high = 0xBF;  // the range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    length = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    length = 3;
    if (b0 == 0xE0) low = 0xA0;
    if (b0 == 0xED) high = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    length = 4;
    if (b0 == 0xF0) low = 0x90;
    if (b0 == 0xF4) high = 0x8F;
  } else {
    return 0;
  }
  if (i + length > s.size()) return 0;
  if (byte(i + 1) < low || byte(i + 1) > high) return 0;
  for (std::size_t k = 2; k < length; ++k) {
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  }
  return length;
}

}  // namespace

std::string printable_message(const std::string& message) {
  if (message.empty()) return "(no message)";
  std::string out;
  out.reserve(message.size());
  static const char* const kHex = "0123456789abcdef";
  for (std::size_t i = 0; i < message.size();) {
    const std::size_t n = utf8_sequence(message, i);
    if (n == 0 || message[i] == '\0') {
      const auto b = static_cast<std::uint8_t>(message[i]);
      out += "\\x";
      out += kHex[b >> 4];
      out += kHex[b & 0xF];
      ++i;
    } else {
      out.append(message, i, n);
      i += n;
    }
  }
  return out;
}

}  // namespace xpuruntime::detail
