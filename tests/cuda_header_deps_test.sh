#!/bin/bash
# The CUDA module's object is rebuilt when a header it includes changes:
# ninja recorded the headers nvcc listed in its depfile (src/meson.build asks
# nvcc for one; Meson before 1.4 does not). Without them an edit to
# kernel_math.hpp or compute.hpp leaves a stale libforeman_cuda.so behind.
# Usage: cuda_header_deps_test.sh NINJA BUILD_ROOT
set -euo pipefail
ninja=$1 build_root=$2
object=src/libforeman_cuda.so.p/compute_cuda_device.cu.o
deps=$("$ninja" -C "$build_root" -t deps "$object")
status=0
for header in src/compute/kernel_math.hpp src/compute/cuda_module.hpp include/foreman/compute.hpp; do
  if ! grep -q "/$header\$" <<<"$deps"; then
    echo "FAIL: ninja has no record that $object depends on $header" >&2
    status=1
  fi
done
[ $status -eq 0 ] && echo "ok: $object depends on kernel_math.hpp, cuda_module.hpp and compute.hpp"
exit $status
