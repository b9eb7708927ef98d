#!/usr/bin/env bash
# The `foreman` CLI's contract: --help and --version exit 0; an unknown flag
# or subcommand prints a clear error and exits 2. Usage: cli_test.sh FOREMAN
set -u
foreman=$1
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

out=$("$foreman" --help 2>&1); rc=$?
[[ $rc -eq 0 ]] || fail "--help exited $rc"
[[ $out == *"Usage:"* && $out == *"devices"* ]] || fail "--help lacks usage or subcommands: $out"

out=$("$foreman" --version 2>&1); rc=$?
[[ $rc -eq 0 ]] || fail "--version exited $rc"
[[ $out =~ ^foreman\ [0-9]+\.[0-9]+\.[0-9]+$ ]] || fail "--version printed '$out'"

out=$("$foreman" --no-such-flag 2>&1); rc=$?
[[ $rc -eq 2 ]] || fail "unknown flag exited $rc, want 2"
[[ $out == *"--no-such-flag"* ]] || fail "unknown flag error does not name the flag: $out"

out=$("$foreman" frobnicate 2>&1); rc=$?
[[ $rc -eq 2 ]] || fail "unknown subcommand exited $rc, want 2"
[[ $out == *"frobnicate"* ]] || fail "unknown subcommand error does not name it: $out"

out=$("$foreman" 2>&1); rc=$?
[[ $rc -eq 2 ]] || fail "no subcommand exited $rc, want 2"

out=$("$foreman" devices 2>&1); rc=$?
[[ $rc -eq 0 ]] || fail "devices exited $rc: $out"
[[ $out == *"CUDA device"* ]] || fail "devices printed '$out'"
[[ $out =~ /cpu:0:\ (baseline|avx2|avx512)\ kernels ]] || fail "devices names no CPU instruction set: '$out'"
out=$(FOREMAN_MAX_ISA=baseline "$foreman" devices 2>&1)
[[ $out == *"/cpu:0: baseline kernels"* ]] || fail "FOREMAN_MAX_ISA=baseline: devices printed '$out'"
out=$(FOREMAN_MAX_ISA=avx "$foreman" devices 2>&1); rc=$?
[[ $rc -eq 2 ]] || fail "FOREMAN_MAX_ISA=avx: devices exited $rc, want 2 (refused like train): '$out'"
[[ $out == *"FOREMAN_MAX_ISA='avx'"* && $out != *"kernels ("* ]] || fail "FOREMAN_MAX_ISA=avx: devices printed '$out'"

if ((failures > 0)); then echo "$failures failure(s)"; exit 1; fi
echo "cli: all checks passed"
