#!/usr/bin/env bash
# Step 2: keep the rows with value >= 500 from $1, highest first, into $2.
set -euo pipefail
awk -F, '$2 >= 500' "$1" | sort -t, -k2,2nr -k1,1n > "$2"
