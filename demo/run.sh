#!/usr/bin/env bash
# The demo, from a fresh clone: install roar-core with its Snakemake and Ray integrations
# into demo/.venv (as a user would: `pip install "roar-core[snakemake,ray]"`, which compiles
# the tracer), then run a two-engine workflow with roar attached, on the embedded defaults
# (SQLite store, event spool and OpenLineage file transport under demo/work/.roar-core):
#
#   Snakemake (--executor roar):  fetch raw/{north,south,west}.csv -> clean/{...}.csv
#   Ray (runtime_env roar):       summarise each clean/*.csv -> summary/*.json -> report.json
#
# The Ray tasks read the files the Snakemake jobs wrote: roar joins the two engines' lineage
# by the content (blake3) of those files.  Then: the runs, the lineage of report.json, and
# an HTML picture of it.
set -euo pipefail
demo="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$demo")"
t0=$SECONDS

bash "$repo/.ci/debian-packages"
venv="$demo/.venv"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
echo "demo: installing roar-core[snakemake,ray] into $venv (a minute or two the first time) ..."
"$venv/bin/pip" install -q --disable-pip-version-check "$repo[snakemake,ray]"
export PATH="$venv/bin:$PATH"

# Embedded defaults only: settings from the caller's environment would send the demo's
# records and events elsewhere.
for var in $(compgen -e); do
  case "$var" in
    ROAR_*|OPENLINEAGE_*|RAY_ADDRESS) unset "$var" ;;
  esac
done

work="$demo/work"
rm -rf "$work"
# .roar-core/ makes work/ the project root: both engines record into work/.roar-core/.
mkdir -p "$work/.roar-core"
cd "$work"

show() {
  echo
  echo "\$ $*"
  "$@"
}
show snakemake --executor roar --cores 2 --snakefile "$demo/workflow/Snakefile" --quiet all \
  --roar-workflow-name weather
show roar-core exec --engine ray -- python "$demo/workflow/analyze.py" clean/north.csv clean/south.csv \
  clean/west.csv report.json
show cat report.json
show roar-core show
show roar-core lineage report.json
show roar-core graph report.json --format html -o lineage.html

echo
echo "demo: done in $((SECONDS - t0)) s. Open $work/lineage.html in a browser for the picture."
echo "demo: the store is $work/.roar-core/lineage.db; the OpenLineage events are in"
echo "      $work/.roar-core/openlineage/events.jsonl ($(wc -l < .roar-core/openlineage/events.jsonl) events)."
echo "demo: try: cd $work && $venv/bin/roar-core lineage --downstream raw/north.csv"
