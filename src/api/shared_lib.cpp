// libkite.so is kitelib's objects linked whole (see CMakeLists.txt); this file only gives the
// shared library target a source of its own. The exports are kite.map's: kite_* only.
#include "src/api/kite.h"
