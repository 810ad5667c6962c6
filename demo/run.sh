#!/usr/bin/env bash
# The demo, from a fresh clone: make .venv, install roar-core into it (this compiles the
# tracer), then trace a small pipeline with `roar-core run`, one command per step:
#
#   gen -> transform -> stage (cp to a new path) -> report
#
# on the embedded defaults (SQLite store, event spool and file transport under demo/work/.roar-core),
# and show what was recorded: the runs, the lineage of report.txt, and an HTML graph of it.
set -euo pipefail
demo="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$demo")"

bash "$repo/.ci/debian-packages"
cd "$repo"
[ -x .venv/bin/python ] || python3 -m venv .venv
echo "demo: installing roar-core into $repo/.venv ..."
.venv/bin/pip install -q --disable-pip-version-check -e .
export PATH="$repo/.venv/bin:$PATH"

# Embedded defaults only: settings from the caller's environment would send the demo's
# records and events elsewhere.
for var in $(compgen -e); do
  case "$var" in
    ROAR_*|OPENLINEAGE_*) unset "$var" ;;
  esac
done

work="$demo/work"
rm -rf "$work"
# .roar-core/ makes work/ the project root, so the store is work/.roar-core/lineage.db.
mkdir -p "$work/.roar-core" "$work/data" "$work/staged"
cd "$work"

step() {
  echo
  echo "\$ roar-core run --wait $*"
  roar-core run --wait "$@"
}
step --job gen -- bash "$demo/steps/gen.sh" data/raw.csv
step --job transform -- bash "$demo/steps/transform.sh" data/raw.csv data/clean.csv
step --job stage -- cp data/clean.csv staged/clean.csv
step --job report -- bash "$demo/steps/report.sh" staged/clean.csv report.txt

echo
echo "\$ cat report.txt"
cat report.txt
echo
echo "\$ roar-core show"
roar-core show
echo
echo "\$ roar-core lineage report.txt"
roar-core lineage report.txt
echo
echo "\$ roar-core graph report.txt --format html -o lineage.html"
roar-core graph report.txt --format html -o lineage.html
echo
echo "demo: done. Open $work/lineage.html in a browser for the picture."
echo "demo: the store is $work/.roar-core/lineage.db; the OpenLineage events are in"
echo "      $work/.roar-core/openlineage/events.jsonl ($(wc -l < .roar-core/openlineage/events.jsonl) events)."
echo "demo: try: cd $work && $repo/.venv/bin/roar-core lineage --downstream data/raw.csv"
