#!/bin/bash
# Usage: scripts/count-assertions.sh CRATE... (from the workspace root), e.g.
#   scripts/count-assertions.sh dhrd-fuse dhrd-nbd dhrd-engine
# Non-test assertions: lines with an assert!/assert_eq!/assert_ne! macro or its debug_
# form in crates/<crate>/src/**/*.rs, skipping files named tests.rs and everything from a
# top-level `#[cfg(test)]` that introduces a `mod` (the test module) to the end of file.
for c in "$@"; do
  n=$(find crates/$c/src -name '*.rs' ! -name 'tests.rs' | sort | while read f; do
    awk '/^#\[cfg\(test\)\]/{t=1; next}
         t && /^#\[/ {next}
         t && /^(pub(\(crate\))? )?mod / {exit}
         {t=0}
         /(debug_)?assert(_eq|_ne)?!/ && !/^\s*\/\// {print FILENAME":"FNR}' "$f"; done | wc -l)
  echo "$c $n"
done
