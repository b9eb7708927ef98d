// TODO(issue 5): stub
#include <doctest/doctest.h>
