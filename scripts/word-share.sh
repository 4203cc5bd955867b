#!/usr/bin/env bash
# The share of a sample's words that occur in a text: words lower-cased, everything but
# letters, digits and apostrophes stripped. A model that has learned spelling writes words
# of its training text; one that has not writes letter soup.
#   scripts/word-share.sh SAMPLE.txt TRAINING.txt   -> "61.2% of 143 words"
set -euo pipefail
LC_ALL=C awk '
  function words(line, out,   n, i, w, parts) {
    n = split(tolower(line), parts, /[[:space:]]+/)
    for (i = 1; i <= n; ++i) {
      w = parts[i]
      gsub(/[^a-z0-9'"'"']/, "", w)
      gsub(/^'"'"'+|'"'"'+$/, "", w)
      if (w != "") out[++out[0]] = w
    }
  }
  NR == FNR { delete ws; ws[0] = 0; words($0, ws); for (i = 1; i <= ws[0]; ++i) known[ws[i]] = 1; next }
  { delete ws; ws[0] = 0; words($0, ws); for (i = 1; i <= ws[0]; ++i) { total++; if (ws[i] in known) hits++ } }
  END { if (total == 0) print "no words"; else printf "%.1f%% of %d words\n", 100 * hits / total, total }
' "$2" "$1"
