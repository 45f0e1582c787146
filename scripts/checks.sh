# The tally the shell tests keep (sourced; $work must be a scratch directory): `check NAME
# COMMAND...` runs the command and prints one ok or FAIL line (with its output on failure);
# `summary TITLE` prints the counts and fails when a check did.
passed=0 failed=0
check() {
  local name=$1; shift
  if "$@" >"$work/out" 2>&1; then
    passed=$((passed + 1)); echo "ok   $name"
  else
    failed=$((failed + 1)); echo "FAIL $name"; sed 's/^/     /' "$work/out"
    return 1
  fi
}
summary() {
  echo "$1: $passed passed, $failed failed"
  [ "$failed" = 0 ]
}
