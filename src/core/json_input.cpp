#include "core/json_input.h"

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
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw UserError(what + " is not JSON (" + e.what() + ")");
  }
}

}  // namespace ptrain
