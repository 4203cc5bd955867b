// Numbers as ptrain prints them: one printf conversion of a double, and the units the logs use.
// Every message, log line and report builds its numbers here.
#pragma once

#include <cstdint>
#include <string>

namespace ptrain {

// printf's `format` (one conversion of a double, e.g. "%.4f", "%g", "%+.2f%%") applied to v.
std::string format_number(const char* format, double v);
std::string format_duration(double seconds);   // "45s", "3m07s", "2h05m"; "?" if negative or not finite
std::string format_thousands(double value);    // "53,780"
std::string format_mib(int64_t bytes);         // "123.4 MiB"
// The shortest text that reads back as exactly v ("0.1", "0.9999999", "1e-05"): a value a user
// gave, shown in a message about it, is never rounded into another one.
std::string number_text(double v);

}  // namespace ptrain
