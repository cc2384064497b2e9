// Whether a job's links are secured (transport/security.h). CURVE, the default, authenticates
// every connection with the job secret and encrypts every byte; `none` leaves both off, as
// PyTorch's Gloo and NCCL backends do, for a user inside a trusted network whose links outrun
// CURVE's encryption (docs/bench.md: at 25-100 GbE with today's GPUs it, not the link, sets the
// pace). Every rank of a job must choose the same (a CURVE rank and a plain one never connect).
#pragma once

#include <cstdint>
#include <string>

namespace poseidon {

enum class TransportSecurity : uint8_t { kCurve = 0, kNone = 1 };

// "curve" | "none"; throws InvalidArgument naming both otherwise ("<what> must be curve or none, got
// 'x'": `what` is the flag or variable the text came from).
TransportSecurity parseTransportSecurity(const std::string& text, const std::string& what = "transport security");
const char* transportSecurityName(TransportSecurity security);

}  // namespace poseidon
