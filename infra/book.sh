#!/usr/bin/env bash
# The book: installs mdBook once into infra/.tools (pinned), and renders docs/ to target/book.
# `make test` runs it; a page SUMMARY.md names that does not exist fails the build
# (create-missing = false), and tests/docs_refs.rs checks every link between the pages.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
MDBOOK_VERSION=0.4.52
tools="$PWD/infra/.tools"
mdbook="$tools/bin/mdbook"
if ! [ -x "$mdbook" ] || [ "$("$mdbook" --version)" != "mdbook v$MDBOOK_VERSION" ]; then
    echo "-- installing mdBook $MDBOOK_VERSION into infra/.tools"
    cargo install --quiet --locked mdbook --version "=$MDBOOK_VERSION" --no-default-features --features search --root "$tools"
fi
"$mdbook" build docs
[ -f target/book/index.html ] || { echo "infra/book.sh: mdBook wrote no target/book/index.html" >&2; exit 1; }
echo "-- the book: target/book/index.html ($(find target/book -name '*.html' | wc -l) pages)"
