#!/usr/bin/env bash
# Isolation check: the repository stands alone, so nothing in it may point at files that only
# exist beside it on a developer's machine, or at an issue tracker its readers cannot see.
#
# Scans every tracked file (git ls-files) as it is in the work tree, this script included (its
# rules below are spelled so that they do not match themselves), except binary files (grep -I). Tracked files deleted from the work tree
# are skipped; a tracked symbolic link is judged by its target. Prints "file:line: text" for every
# offending line, grouped by rule, and exits 1; exits 0 when nothing matches. Outside a git
# checkout (an exported tarball) there is nothing tracked to scan: it says so and exits 0.
#
# The rules (extended regular expressions, GNU grep):
#   1. sibling directory: a relative path (dot, dot, slash) into the "shared" folder beside the
#      repository.
#   2. outside documents: the planning documents' file names, SPEC, API or DESIGN followed by
#      ".md" (case-sensitive, as a whole word: docs/api.md and a longer name ending in SPEC do not
#      match), and the hardware note, ascend-910b followed by ".md" (any case). A tracked file
#      with one of these names fails too.
#   3. machine paths: a path component named "work" (a slash, the word, then a slash or the
#      end of the word; a longer name such as "workspace" does not match) anywhere, even inside
#      a relative path (a build subdirectory of that name reads as the development machine's
#      path, so the project names such directories otherwise); and an absolute path that starts
#      a token (at the start of a line, or after a character other than a letter, digit, '_',
#      '.', '-' or '~') and begins with the home, root or tmp directory followed by a name.
#      Relative paths, URLs and a bare tmp directory (a TMPDIR fallback) are allowed; write
#      mktemp -t NAME.XXXXXX rather than a fixed name under the tmp directory.
#   4. issue references, N standing for digits: "issue N", "issue #N", "issues N" ("issue" as a
#      word, any case), "#N" in parentheses, and "PR #N", "pull request #N", "fixes #N",
#      "closes #N", "resolves #N" (any case). #include, #pragma, Markdown headings, hex colours,
#      "GCC PR" followed by a bug number and counters such as "entry #N" do not match.
#
# Usage: tools/check_isolation.sh   (from any directory; needs only git and grep)
set -euo pipefail
cd "$(dirname "$0")/.."

if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  echo "check_isolation: not a git checkout; no tracked files to check" >&2
  exit 0
fi

names=(
  "reference to a directory beside the repository"
  "name of a document that is not in the repository"
  "name of a document that is not in the repository"
  "absolute path of a machine"
  "issue reference"
)
# grep options per rule: -i where the rule is case-insensitive.
options=(
  ""
  ""
  "-i"
  ""
  "-i"
)
patterns=(
  '\.\./shared'
  '\b(SPEC|API|DESIGN)\.md\b'
  '\bascend-910b\.md\b'
  '(^|[^A-Za-z0-9_.~-])/(home/|root/|tmp/[A-Za-z0-9_.$-])|/wor[k](/|\b)'
  '\bissues?[ #]*[0-9]+|\(#[0-9]+\)|\b(pr|pull request|fix(es|ed)?|close[sd]?|resolve[sd]?) ?#[0-9]+'
)

files=()
links=()
while IFS= read -r -d '' file; do
  if [ -L "$file" ]; then
    links+=("$file")
  elif [ -f "$file" ]; then
    files+=("$file")
  fi
done < <(git ls-files -z)

failed=0
report() {  # rule name, offending "file:line: text" lines (one string, may be empty)
  local name=$1 lines=$2
  [ -n "$lines" ] || return 0
  echo "check_isolation: $name:"
  printf '%s\n' "$lines" | cut -c1-300 | sed 's/^/  /'
  failed=1
}

for i in "${!patterns[@]}"; do
  matches=""
  if [ "${#files[@]}" -gt 0 ]; then
    status=0
    # shellcheck disable=SC2086  # options[i] is empty or one flag
    matches=$(grep -nHIE ${options[i]} -e "${patterns[i]}" -- "${files[@]}") || status=$?
    if [ "$status" -gt 1 ]; then
      echo "check_isolation: grep failed (status $status) on the tracked files" >&2
      exit 2
    fi
    # grep prints file:line:text; a space after the line number reads better.
    matches=$(printf '%s\n' "$matches" | sed -E 's/^([^:]*:[0-9]+):/\1: /')
  fi
  for link in ${links[@]+"${links[@]}"}; do
    target=$(readlink -- "$link")
    # shellcheck disable=SC2086
    if printf '%s\n' "$target" | grep -qE ${options[i]} -e "${patterns[i]}"; then
      matches+=${matches:+$'\n'}"$link: symbolic link to $target"
    fi
  done
  report "${names[i]}" "$matches"
done

# Rule 2 on the tracked file names themselves.
named=$(git ls-files | grep -E '(^|/)((SPEC|API|DESIGN)\.md|[Aa][Ss][Cc][Ee][Nn][Dd]-910[Bb]\.md)$' |
  sed 's/$/: tracked file with that name/' || true)
report "${names[1]}" "$named"

if [ "$failed" -ne 0 ]; then
  echo "check_isolation: FAILED: the lines above refer to what readers of the repository" \
    "cannot see" >&2
  exit 1
fi
echo "check_isolation: ${#files[@]} tracked files checked, nothing refers outside the repository"
