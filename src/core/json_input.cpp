#include "core/json_input.h"

#include <set>
#include <vector>

#include "core/error.h"

namespace ptrain {

nlohmann::json parse_json(const std::string& text, const std::string& what) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (in_string) {
      if (ch == '\\') ++i;
      else if (ch == '"') in_string = false;
    } else if (ch == '"') {
      in_string = true;
    } else if (ch == '[' || ch == '{') {
      if (++depth > kMaxJsonDepth)
        throw UserError(what + " is nested more than " + std::to_string(kMaxJsonDepth) + " levels deep; expected the file ptrain writes");
    } else if ((ch == ']' || ch == '}') && depth > 0) {
      --depth;
    }
  }
  // Each object's keys once: with a key twice, which value a reader sees would depend on the
  // parser, so the file means two things.
  std::vector<std::set<std::string>> keys;
  std::string duplicate;
  const auto note_keys = [&](int, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if (event == E::object_start) keys.emplace_back();
    else if (event == E::object_end && !keys.empty()) keys.pop_back();
    else if (event == E::key && !keys.empty() && !keys.back().insert(parsed.get<std::string>()).second &&
             duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  nlohmann::json parsed;
  try {
    parsed = nlohmann::json::parse(text, note_keys);
  } catch (const nlohmann::json::exception& e) {
    // Without nlohmann's "last read: '...'": no bytes of a file that may be anything are shown.
    std::string why = e.what();
    const size_t cut = why.find("; last read");
    if (cut != std::string::npos) why.resize(cut);
    throw UserError(what + " is not JSON (" + why + ")");
  }
  if (!duplicate.empty())
    throw UserError(what + " has the key \"" + duplicate.substr(0, 64) + "\" twice in one object; expected each key once");
  return parsed;
}

}  // namespace ptrain
