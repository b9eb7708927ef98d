// TODO(issue 4): tests arrive with the implementation
#include <doctest/doctest.h>
