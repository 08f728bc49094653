#!/bin/sh
# doctest_discover_tests cuts a test name at ';' (CMake's list separator): the ctest entry then
# filters for a name no case has, runs nothing and passes. Fail when a name has one.
# Usage: check_case_names.sh KITE_TESTS_BINARY
bad=$("$1" --list-test-cases --no-version | grep ';')
if [ -n "$bad" ]; then
  echo "$bad"
  echo "these test case names contain ';': ctest would not run them"
  exit 1
fi
echo "no test case name contains ';'"
