#!/usr/bin/env bash
# phase.sh NAME CMD...: run CMD, then print "phase NAME: ok|FAILED in N s"; exit with CMD's status.
name="$1"; shift
start=$(date +%s)
set +e
"$@"
rc=$?
echo "phase $name: $([[ $rc == 0 ]] && echo ok || echo FAILED) in $(( $(date +%s) - start )) s"
exit $rc
