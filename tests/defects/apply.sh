#!/bin/sh
# apply.sh NAME DEST — a scratch copy of this tree with the deliberate defect NAME (tests/defects/NAME.patch)
# applied: copies the working tree (without .git and build/asan; build/ objects keep their times, so only the
# patched files rebuild) into DEST, which must not exist yet, and applies the patch there. The defects never
# touch the tree they come from. Run from the repository root.
set -eu
[ $# -eq 2 ] || { echo "usage: sh tests/defects/apply.sh NAME DEST" >&2; exit 2; }
P="$(pwd)/tests/defects/$1.patch"
[ -f "$P" ] || { echo "apply.sh: no defect $1 ($P); have: $(cd tests/defects && ls *.patch | sed 's/\.patch//' | tr '\n' ' ')" >&2; exit 2; }
[ ! -e "$2" ] || { echo "apply.sh: $2 exists (give a fresh scratch folder)" >&2; exit 2; }
mkdir -p "$2"
tar --exclude=./.git --exclude=./build/asan --exclude='./.dev-*' -cf - . | tar -xf - -C "$2"
cd "$2"
if command -v patch > /dev/null 2>&1; then
    patch -p1 --forward --batch --silent < "$P" || { echo "apply.sh: $1.patch does not apply to this tree (refresh it)" >&2; exit 1; }
else
    git apply "$P" || { echo "apply.sh: $1.patch does not apply to this tree (refresh it)" >&2; exit 1; }
fi
echo "apply.sh: $1 applied in $2"
