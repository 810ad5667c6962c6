#!/usr/bin/env bash
# Step 4: a short report on $1 into $2.
set -euo pipefail
{
  echo "rows:  $(wc -l < "$1")"
  echo "sum:   $(awk -F, '{ s += $2 } END { print s }' "$1")"
  echo "top 3:"
  head -n 3 "$1" | sed 's/^/  /'
} > "$2"
