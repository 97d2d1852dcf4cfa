#!/usr/bin/env bash
# Build the HTML of one executed chapter alone (plus the intro), for a quick look while editing it:
#   bash scripts/preview.sh 07_projections      ->  _build/preview/07_projections/_build/html/book/07_projections.html
# The chapter must have been executed first (its copy in _build/executed/book/). Warnings are printed, not fatal.
set -euo pipefail
cd "$(dirname "$0")/.."
ch="${1:?usage: bash scripts/preview.sh NN_name}"
src="_build/executed/book/$ch.ipynb"
[ -f "$src" ] || { echo "$src does not exist: execute the chapter first" >&2; exit 1; }
dir="_build/preview/$ch"
rm -rf "$dir"; mkdir -p "$dir/book"
cp _config.yml references.bib "$dir/"
cp book/intro.md book/bibliography.md "$dir/book/"
cp "$src" "$dir/book/"
printf 'format: jb-book\nroot: book/intro\nchapters:\n  - file: book/%s\n  - file: book/bibliography\n' "$ch" > "$dir/_toc.yml"
.venv/bin/jupyter-book build "$dir" --path-output "$dir" --quiet --nitpick --keep-going
echo "preview: $dir/_build/html/book/$ch.html"
