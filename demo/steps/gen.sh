#!/usr/bin/env bash
# Step 1: make raw data (id,value rows) in $1.
set -euo pipefail
seq 1 500 | awk '{ printf "%d,%d\n", $1, ($1 * 7919) % 1000 }' > "$1"
