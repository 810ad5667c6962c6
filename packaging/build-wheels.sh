#!/usr/bin/env bash
# Release artifacts: the sdist, and one wheel per architecture,
# roar_core-VERSION-py3-none-manylinux_2_17_ARCH.whl, with the tracer shim and the batch
# hasher prebuilt for glibc 2.17 (Debian 8+, Ubuntu 14.04+, RHEL 7+), stripped, without
# RUNPATH, and checked by auditwheel.  Installing such a wheel needs no compiler.
#
#   packaging/build-wheels.sh OUTDIR
#
# The compilers come from the package registries: zig (PyPI `ziglang`) as the C compiler and
# linker for an old glibc, `cargo-zigbuild` to link the Rust library with it.  aarch64 is
# built when rustup has (or can add) its Rust target; otherwise it is skipped, said once.
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: packaging/build-wheels.sh OUTDIR" >&2; exit 2; }
mkdir -p "$1"
out=$(cd "$1" && pwd)
cd "$(dirname "${BASH_SOURCE[0]}")/.."

glibc=2.17
tools=${ROAR_WHEEL_TOOLS:-$PWD/build/wheel-tools}
[ -x "$tools/bin/python" ] || python3 -m venv "$tools"
"$tools/bin/pip" install -q --disable-pip-version-check \
  ziglang==0.17.0 cargo-zigbuild==0.24.0 auditwheel==6.8.2 build==1.3.0 wheel==0.47.0
# cargo-zigbuild finds zig as `python3 -m ziglang` of the first python3 on PATH.
export PATH="$tools/bin:$PATH:${CARGO_HOME:-$HOME/.cargo}/bin"
command -v cargo >/dev/null || {
  echo "build-wheels: cargo is needed for the batch hasher (https://rustup.rs)" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The sdist first: the wheels are built from it, so they hold exactly what it ships.
python3 -m build --sdist --outdir "$work/sdist" . >"$work/sdist.log" 2>&1 \
  || { cat "$work/sdist.log" >&2; exit 1; }
sdist=$(ls "$work"/sdist/*.tar.gz)

# Same flags as setup.py's own build of the shim (CFLAGS, LDFLAGS there); -z lazy as gcc
# links by default: a preloaded library binds its symbols as they are first used.
cflags=$(python3 -c 'import ast,sys; t=ast.parse(open("setup.py").read())
for n in t.body:
    if isinstance(n, ast.Assign) and n.targets[0].id in ("CFLAGS", "LDFLAGS"):
        print(" ".join(ast.literal_eval(n.value)), end=" ")')

for arch in x86_64 aarch64; do
  if ! rustup target list --installed 2>/dev/null | grep -qx "$arch-unknown-linux-gnu" \
     && ! rustup target add "$arch-unknown-linux-gnu" >/dev/null 2>&1; then
    echo "build-wheels: skipping $arch: rustup has no $arch-unknown-linux-gnu target" >&2
    continue
  fi
  bin="$work/bin-$arch"
  mkdir -p "$bin"
  # shellcheck disable=SC2086  # $cflags is a list of flags
  python3 -m ziglang cc -target "$arch-linux-gnu.$glibc" $cflags -Wl,-z,lazy \
    -Wno-pointer-bool-conversion -Itracer-bins/preload tracer-bins/preload/roar_preload.c \
    -o "$bin/libroar_preload.so"
  cargo zigbuild --quiet --release --locked --manifest-path tracer-bins/hashbatch/Cargo.toml \
    --target "$arch-unknown-linux-gnu.$glibc" --target-dir "$work/cargo"
  cp "$work/cargo/$arch-unknown-linux-gnu/release/libroar_hashbatch.so" "$bin/"

  ROAR_PREBUILT="$bin" ROAR_PREBUILT_PLATFORM="linux_$arch" python3 -m pip wheel -q --no-deps --disable-pip-version-check \
    -w "$work/raw-$arch" "$sdist"
  raw=$(ls "$work/raw-$arch"/roar_core-*.whl)
  # auditwheel checks every ELF file against the manylinux policies (a newer glibc
  # symbol, or a library outside the policy, shows here as a newer tag); then the wheel is
  # tagged as what it was checked to be.  (`auditwheel repair` would do both, for this
  # machine's architecture only.)
  tag="manylinux_${glibc/./_}_$arch"
  auditwheel show "$raw" | tee "$work/show-$arch.txt"
  tr -s ' \n' ' ' <"$work/show-$arch.txt" | grep -q "following platform tag: \"$tag\"" || {
    echo "build-wheels: the $arch wheel is not $tag (see above)" >&2; exit 1; }
  wheel tags --remove --platform-tag "$tag" "$raw" >/dev/null
  mv "$work/raw-$arch"/*"$tag.whl" "$out/"
done
cp "$sdist" "$out/"
ls -l "$out"
